"""QDQ models (onnxruntime.quantization, static, per channel) on the engine:
fused into integer operators at import (``integer_qdq=True``, the default)
against the graph as written (float operators between QuantizeLinear and
DequantizeLinear) and against ONNX Runtime; 1 thread, batch 8, forward.
The fused operators run on the int8 kernels (VNNI) or, with
``_C._set_quant_path(0)``, on the float ones (their twin).

Columns: fused / fused on the float kernels, fused / as written (below 1:
the fused int8 graph is faster), fused / ONNX Runtime (above 1: ONNX
Runtime is faster). ``--format QOperator``: the QOperator files instead
(QLinearConv, QLinearAdd, ... as written; no "as written" column).

Then dynamic quantization (``quantize_dynamic``, per tensor and per
channel: DynamicQuantizeLinear, MatMulInteger; batch 8) of an MLP and a
transformer encoder (2 layers, width 128, 64 tokens): int8 kernels / float
kernels (``_set_quant_path(0)``: MatMulInteger on the float GEMM, the scalar
DynamicQuantizeLinear), dynamic int8 / the engine's float32 model, and
dynamic int8 / ONNX Runtime on the same dynamic model (its default graph
optimizations: MatMulIntegerToFloat fused).

    python benchmarks/qdq.py [--budget 1.0] [--threads 1] [--models lenet ...]
                             [--format QDQ|QOperator] [--formats static dynamic]
"""
import argparse
import os
import tempfile

import numpy as np
import onnxruntime as ort
import torch
from onnxruntime.quantization import (CalibrationDataReader, QuantFormat, QuantType,
                                      quantize_dynamic, quantize_static)

import aidge_interop
from aidge_interop import _C, examples
from timing import interleaved_medians


def _models():
    torch.manual_seed(0)
    lenet = torch.nn.Sequential(
        torch.nn.Conv2d(1, 6, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(6, 16, 5), torch.nn.ReLU(), torch.nn.MaxPool2d(2), torch.nn.Flatten(),
        torch.nn.Linear(256, 120), torch.nn.ReLU(), torch.nn.Linear(120, 10))
    convs = torch.nn.Sequential(
        torch.nn.Conv2d(3, 32, 3, padding=1), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 1), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, stride=2, padding=1), torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(64, 10))
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 10))
    return {"lenet": (lenet, (1, 28, 28)), "convs 32x32": (convs, (3, 32, 32)),
            "mlp 256-512-512": (mlp, (256,)), "resnet8": (examples.resnet8(), (3, 32, 32))}


def _dynamic_models():
    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 512), torch.nn.ReLU(),
                              torch.nn.Linear(512, 10))
    layer = torch.nn.TransformerEncoderLayer(128, 4, 256, dropout=0.0, batch_first=True)
    encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
    return {"mlp 256-512-512": (mlp, (256,)), "encoder 2x128": (encoder, (64, 128))}


def dynamic(args, d, best, options):
    """The dynamic-quantization table (module docstring)."""
    print(f"\n{'dynamic':<18} {'weights':<12} {'int8/float kernels':>19} "
          f"{'int8/float32':>13} {'int8/ORT':>9}")
    for name, (model, shape) in _dynamic_models().items():
        if args.models and name not in args.models:
            continue
        src = os.path.join(d, "float.onnx")
        torch.onnx.export(model.eval(), torch.zeros(1, *shape), src, dynamo=False,
                          input_names=["x"], dynamic_axes={"x": {0: "n"}})
        x = np.random.default_rng(1).standard_normal((8, *shape)).astype(np.float32)
        f32 = aidge_interop.load_onnx(src)
        for per_channel in (False, True):
            path = os.path.join(d, f"dynamic_{per_channel}.onnx")
            quantize_dynamic(src, path, per_channel=per_channel)
            g = aidge_interop.load_onnx(path)
            session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])

            def on(p, graph):
                return lambda: (_C._set_quant_path(p), graph.forward([x]))
            t_int, t_float, t_f32, t_ort = interleaved_medians(
                [on(best, g), on(0, g), on(best, f32), lambda: session.run(None, {"x": x})],
                budget_s=args.budget)
            print(f"{name:<18} {'per channel' if per_channel else 'per tensor':<12} "
                  f"{t_int / t_float:>19.2f} {t_int / t_f32:>13.2f} {t_int / t_ort:>9.2f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--budget", type=float, default=1.0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--models", nargs="+", default=None)
    parser.add_argument("--format", choices=("QDQ", "QOperator"), default="QDQ")
    parser.add_argument("--formats", nargs="+", default=["static", "dynamic"],
                        choices=["static", "dynamic"])
    args = parser.parse_args()
    best = _C._set_quant_path(3)
    aidge_interop.set_num_threads(args.threads)
    torch.set_num_threads(args.threads)
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = args.threads, 1
    with tempfile.TemporaryDirectory() as d:
        if "static" in args.formats:
            print(f"{'model':<18} {'activations':<12} {'int8/float kernels':>19} "
                  f"{'fused/written':>14} {'fused/ORT':>10}")
        for name, (model, shape) in _models().items():
            if "static" not in args.formats or args.models and name not in args.models:
                continue
            src = os.path.join(d, "float.onnx")
            torch.onnx.export(model.eval(), torch.zeros(1, *shape), src, dynamo=False,
                              input_names=["x"], dynamic_axes={"x": {0: "n"}})
            for act in ("QUInt8", "QInt8"):
                class Reader(CalibrationDataReader):
                    def __init__(self):
                        rng = np.random.default_rng(0)
                        self.batches = iter([rng.standard_normal((8, *shape), np.float32)
                                             for _ in range(4)])

                    def get_next(self):
                        x = next(self.batches, None)
                        return None if x is None else {"x": x}
                path = os.path.join(d, f"qdq_{act}.onnx")
                quantize_static(src, path, Reader(), quant_format=getattr(QuantFormat, args.format),
                                per_channel=True, activation_type=getattr(QuantType, act),
                                weight_type=QuantType.QInt8)
                x = np.random.default_rng(1).standard_normal((8, *shape)).astype(np.float32)
                fused = aidge_interop.load_onnx(path)
                written = aidge_interop.load_onnx(path, integer_qdq=False)
                session = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
                def on(path, g):
                    return lambda: (_C._set_quant_path(path), g.forward([x]))
                t_fused, t_float, t_written, t_ort = interleaved_medians(
                    [on(best, fused), on(0, fused), on(best, written),
                     lambda: session.run(None, {"x": x})], budget_s=args.budget)
                written = f"{t_fused / t_written:.2f}" if args.format == "QDQ" else "-"
                print(f"{name:<18} {act:<12} {t_fused / t_float:>19.2f} "
                      f"{written:>14} {t_fused / t_ort:>10.2f}")
        if "dynamic" in args.formats:
            dynamic(args, d, best, options)
    _C._set_quant_path(best)


if __name__ == "__main__":
    main()
