"""MLPerf Tiny keyword spotting DS-CNN. Input (B, 1, 49, 10) MFCCs, output (B, 12).

Conv 64@10x4 stride 2, padding "same" (TensorFlow's: the odd padding row goes
to the bottom) -> BN -> ReLU; 4 x [depthwise Conv 3x3 pad 1 -> BN -> ReLU ->
Conv 64@1x1 -> BN -> ReLU]; AvgPool over the whole (25, 5) map; Flatten; FC 12.
The reference's Dropout layers are left out (not comparable element by element
in training) and its softmax is left to the loss, as usual in torch.
"""
import torch

from ._seeding import build_seeded


class TorchDSCNN(torch.nn.Module):
    def __init__(self, filters: int = 64, num_classes: int = 12):
        super().__init__()
        layers = [
            # "same" for 49x10 -> 25x5 with a 10x4 kernel, stride 2:
            # rows 4 above, 5 below; columns 1 each side
            torch.nn.ZeroPad2d((1, 1, 4, 5)),
            torch.nn.Conv2d(1, filters, kernel_size=(10, 4), stride=2),
            torch.nn.BatchNorm2d(filters),
            torch.nn.ReLU(),
        ]
        for _ in range(4):
            layers += [
                torch.nn.Conv2d(filters, filters, kernel_size=3, padding=1, groups=filters),
                torch.nn.BatchNorm2d(filters),
                torch.nn.ReLU(),
                torch.nn.Conv2d(filters, filters, kernel_size=1),
                torch.nn.BatchNorm2d(filters),
                torch.nn.ReLU(),
            ]
        layers += [
            torch.nn.AvgPool2d(kernel_size=(25, 5)),
            torch.nn.Flatten(),
            torch.nn.Linear(filters, num_classes),
        ]
        self.sequence = torch.nn.Sequential(*layers)

    def forward(self, x):
        return self.sequence(x)


def ds_cnn(seed: int = 0) -> TorchDSCNN:
    """A :class:`TorchDSCNN` initialised from ``seed``."""
    return build_seeded(TorchDSCNN, seed)
