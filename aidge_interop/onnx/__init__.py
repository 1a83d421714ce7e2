"""ONNX in the engine: the importer (:func:`load_onnx`, :func:`build_graph`;
importer.py), the operators it writes as other engine operators (einsum.py,
with expand.py's Emitter) and ONNX's backend API (backend.py,
imported on its own: ``from aidge_interop.onnx import backend``)."""
from .importer import EXPANDED, ONNX_DTYPES, build_graph, load_onnx, supported_operators

__all__ = ["load_onnx", "build_graph", "supported_operators", "ONNX_DTYPES", "EXPANDED"]
