"""Deterministic construction shared by the model factories."""
import torch


def build_seeded(cls, seed: int) -> torch.nn.Module:
    """``cls()`` initialised from ``seed`` without touching torch's global RNG.

    BatchNorm layers get random affine parameters and running statistics, so
    that an eval-mode comparison exercises every one of them (fresh layers
    hold 1, 0, 0, 1, which would hide a swapped or ignored tensor).
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = cls()
        with torch.no_grad():
            for m in model.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.weight.uniform_(0.5, 1.5)
                    m.bias.normal_(0.0, 0.1)
                    m.running_mean.normal_(0.0, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
    return model
