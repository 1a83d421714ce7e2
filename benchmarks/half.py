"""float16 and bfloat16 GEMM and convolution: the engine against torch at the
same dtype, 1 thread, forward only.

The engine has no half kernels: a node with half inputs converts them to
float32 copies, runs its float32 kernel and rounds the output (plan.c, "half
precision"); torch's CPU has native half kernels for some of these (oneDNN
where the CPU has AVX512-FP16 / AMX, else its own float32-accumulating
loops). float32 rows give each library's float32 time for scale. Ratios are
engine / torch (below 1: the engine is faster).

    python benchmarks/half.py [--budget 0.5] [--threads 1]
"""
import argparse

import ml_dtypes
import numpy as np
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from aidge_interop import Tensor
from timing import interleaved_medians

ONNX = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16,
        "bfloat16": TensorProto.BFLOAT16}
NUMPY = {"float32": np.float32, "float16": np.float16, "bfloat16": ml_dtypes.bfloat16}

# name: (op_type, input shape, weight shape, attrs, torch fn(x, w))
CASES = {
    "Gemm 128x256 @ 256x512": ("Gemm", (128, 256), (512, 256), {"transB": 1},
                               lambda x, w: F.linear(x, w)),
    "Gemm 512x1024 @ 1024x1024": ("Gemm", (512, 1024), (1024, 1024), {"transB": 1},
                                  lambda x, w: F.linear(x, w)),
    "Conv 8x32x32x32, 64x3x3": ("Conv", (8, 32, 32, 32), (64, 32, 3, 3), {"pads": [1] * 4},
                                lambda x, w: F.conv2d(x, w, padding=1)),
    "Conv 1x64x56x56, 64x3x3": ("Conv", (1, 64, 56, 56), (64, 64, 3, 3), {"pads": [1] * 4},
                                lambda x, w: F.conv2d(x, w, padding=1)),
}


def engine_call(op_type, x, w, attrs, dtype):
    node = helper.make_node(op_type, ["x", "w"], ["y"], **attrs)
    graph = helper.make_graph(
        [node], op_type, [helper.make_tensor_value_info("x", ONNX[dtype], list(x.shape))],
        [helper.make_tensor_value_info("y", ONNX[dtype], None)],
        [numpy_helper.from_array(w.astype(NUMPY[dtype]), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    g = aidge_interop.load_onnx(model, param_kinds={"w": "const"})._g
    xs = [Tensor(x.astype(NUMPY[dtype]))]
    return lambda: g.forward(xs)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--budget", type=float, default=0.5, help="seconds per case and dtype")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    aidge_interop.set_num_threads(args.threads)
    rng = np.random.default_rng(0)
    print(f"{'case':28} {'dtype':9} {'engine ms':>10} {'torch ms':>10} {'ratio':>7}")
    for name, (op_type, xs, ws, attrs, fn) in CASES.items():
        x = rng.standard_normal(xs).astype(np.float32)
        w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
        for dtype in ("float32", "float16", "bfloat16"):
            tx, tw = (torch.from_numpy(a).to(getattr(torch, dtype)) for a in (x, w))

            def torch_call():
                with torch.no_grad():
                    return fn(tx, tw)
            ours, theirs = interleaved_medians([engine_call(op_type, x, w, attrs, dtype),
                                                torch_call], args.budget)
            print(f"{name:28} {dtype:9} {ours * 1e3:10.3f} {theirs * 1e3:10.3f} "
                  f"{ours / theirs:7.2f}", flush=True)


if __name__ == "__main__":
    main()
