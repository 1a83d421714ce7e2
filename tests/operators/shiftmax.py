"""ShiftMax: the engine's integer-only softmax over the last axis, ONNX op
``aidge::ShiftMax``."""
from ._shift_op import shift_module
from .shift_reference import ShiftMax

ShiftMaxModel = shift_module(ShiftMax(), "ShiftMax")
