"""One small ``torch.nn.Module`` per operator of the operator suite
(test_operators.py), plus the float references of the engine's shift
operators (``shift_reference``)."""
from .add import AddModel
from .avgpooling2d import AvgPoolingModel
from .batchnorm import BatchNormModel
from .conv2d import Conv2DModel
from .convdepthwise2d import ConvDepthwise2DModel
from .convtranspose2d import ConvTranspose2DModel
from .fc import FCModel
from .gelu import GELUModel
from .globalavgpool import GlobalAvgPoolModel
from .layernorm import LayerNormModel
from .leakyrelu import LeakyReLUModel
from .maxpool2d import MaxPool2DModel
from .mul import MulModel
from .pad import PadModel
from .reducemean import ReduceMeanModel
from .reducesum import ReduceSumModel
from .relu import ReLUModel
from .shift_reference import ShiftGELU, ShiftMax
from .shiftgelu import ShiftGELUModel
from .shiftmax import ShiftMaxModel
from .sigmoid import SigmoidModel
from .softmax import SoftmaxModel
from .sub import SubModel
from .tanh import TanhModel

__all__ = [
    "AddModel", "AvgPoolingModel", "BatchNormModel", "Conv2DModel", "ConvDepthwise2DModel",
    "ConvTranspose2DModel", "FCModel", "GELUModel", "GlobalAvgPoolModel", "LayerNormModel",
    "LeakyReLUModel", "MaxPool2DModel", "MulModel", "PadModel", "ReduceMeanModel",
    "ReduceSumModel", "ReLUModel", "ShiftGELU", "ShiftMax", "ShiftGELUModel",
    "ShiftMaxModel", "SigmoidModel", "SoftmaxModel", "SubModel", "TanhModel",
]
