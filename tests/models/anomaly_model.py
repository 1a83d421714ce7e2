"""MLPerf Tiny anomaly detection autoencoder (ToyADMOS, DCASE 2020 baseline).

Input (B, 640) — 5 frames of 128 log-mel bins — output (B, 640):
4 x [FC 128 -> BatchNorm1d -> ReLU], FC 8 -> BatchNorm1d -> ReLU (bottleneck),
4 x [FC 128 -> BatchNorm1d -> ReLU], FC 640.
"""
import torch

from ._seeding import build_seeded


def _dense_bn_relu(in_features: int, out_features: int) -> list[torch.nn.Module]:
    return [torch.nn.Linear(in_features, out_features),
            torch.nn.BatchNorm1d(out_features),
            torch.nn.ReLU()]


class TorchAnomalyAutoencoder(torch.nn.Module):
    def __init__(self, input_dim: int = 640, hidden: int = 128, bottleneck: int = 8):
        super().__init__()
        widths = [input_dim, hidden, hidden, hidden, hidden, bottleneck,
                  hidden, hidden, hidden, hidden]
        layers = []
        for n_in, n_out in zip(widths, widths[1:]):
            layers += _dense_bn_relu(n_in, n_out)
        layers.append(torch.nn.Linear(hidden, input_dim))
        self.sequence = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.sequence(x)


def anomaly_autoencoder(seed: int = 0) -> TorchAnomalyAutoencoder:
    """A :class:`TorchAnomalyAutoencoder` initialised from ``seed``."""
    return build_seeded(TorchAnomalyAutoencoder, seed)
