"""int8 quantization and the C export: :func:`quantize` (quantize.py) turns a
float model into a :class:`QuantizedModel` run by the engine's quantized
operators; :func:`export_c` (export.py) writes a float or quantized model as a
standalone C project with the portable kernels. Both work on the layer list
of layers.py."""
from .export import BuildError, ExportError, ExportResult, compile_and_run, export_c
from .quantization import QuantizedModel, accuracy, quantize

__all__ = ["quantize", "QuantizedModel", "accuracy", "export_c", "compile_and_run",
           "ExportResult", "ExportError", "BuildError"]
