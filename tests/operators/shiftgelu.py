"""ShiftGeLU: the engine's integer-only GELU, ONNX op ``aidge::ShiftGELU``."""
from ._shift_op import shift_module
from .shift_reference import ShiftGELU

ShiftGELUModel = shift_module(ShiftGELU(), "ShiftGELU")
