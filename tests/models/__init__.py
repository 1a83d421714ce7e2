"""The networks of the model suite (test_models.py), each a plain torch module.

Every module holds the class and a factory ``name(seed=0)`` that builds it
deterministically (see ``_seeding.build_seeded``).
"""
from .anomaly_model import TorchAnomalyAutoencoder, anomaly_autoencoder
from .kws_model import TorchDSCNN, ds_cnn
from .lenet_model import TorchLeNet, lenet
from .mobilenet_model import TorchMobileNetV1, mobilenet_v1
from .perceptron_model import TorchPerceptron, perceptron
from .resnet_model import TorchResNet8, resnet8

__all__ = [
    "TorchAnomalyAutoencoder", "anomaly_autoencoder",
    "TorchDSCNN", "ds_cnn",
    "TorchLeNet", "lenet",
    "TorchMobileNetV1", "mobilenet_v1",
    "TorchPerceptron", "perceptron",
    "TorchResNet8", "resnet8",
]
