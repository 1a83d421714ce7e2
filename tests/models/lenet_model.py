"""LeNet-5. Input (B, 1, 32, 32), output (B, 10).

Conv 6@5x5 -> ReLU -> MaxPool 2 -> Conv 16@5x5 -> ReLU -> MaxPool 2 -> Flatten
-> FC 120 -> ReLU -> FC 84 -> ReLU -> FC 10.
"""
import torch

from ._seeding import build_seeded


class TorchLeNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.sequence = torch.nn.Sequential(
            torch.nn.Conv2d(1, 6, kernel_size=5),     # (B, 6, 28, 28)
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),                    # (B, 6, 14, 14)
            torch.nn.Conv2d(6, 16, kernel_size=5),    # (B, 16, 10, 10)
            torch.nn.ReLU(),
            torch.nn.MaxPool2d(2),                    # (B, 16, 5, 5)
            torch.nn.Flatten(),
            torch.nn.Linear(16 * 5 * 5, 120),
            torch.nn.ReLU(),
            torch.nn.Linear(120, 84),
            torch.nn.ReLU(),
            torch.nn.Linear(84, 10),
        )

    def forward(self, x):
        return self.sequence(x)


def lenet(seed: int = 0) -> TorchLeNet:
    """A :class:`TorchLeNet` initialised from ``seed``."""
    return build_seeded(TorchLeNet, seed)
