"""Perceptron: Linear(16, 32) -> ReLU -> Linear(32, 4). Input (B, 16), output (B, 4)."""
import torch

from ._seeding import build_seeded


class TorchPerceptron(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sequence = torch.nn.Sequential(
            torch.nn.Linear(16, 32),
            torch.nn.ReLU(),
            torch.nn.Linear(32, 4),
        )

    def forward(self, x):
        return self.sequence(x)


def perceptron(seed: int = 0) -> TorchPerceptron:
    """A :class:`TorchPerceptron` initialised from ``seed``."""
    return build_seeded(TorchPerceptron, seed)
