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

#: name -> (factory, input shape of one sample, without the batch dimension)
SAMPLE_SHAPES = {
    "perceptron": (perceptron, (16,)),
    "lenet": (lenet, (1, 32, 32)),
    "anomaly": (anomaly_autoencoder, (640,)),
    "kws": (ds_cnn, (1, 49, 10)),
    "mobilenet": (mobilenet_v1, (3, 96, 96)),
    "resnet": (resnet8, (3, 32, 32)),
}

__all__ = [
    "SAMPLE_SHAPES",
    "TorchAnomalyAutoencoder", "anomaly_autoencoder",
    "TorchDSCNN", "ds_cnn",
    "TorchLeNet", "lenet",
    "TorchMobileNetV1", "mobilenet_v1",
    "TorchPerceptron", "perceptron",
    "TorchResNet8", "resnet8",
]
