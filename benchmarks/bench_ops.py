"""Forward and backward time of each engine operator against torch, 1 thread each.

For a representative case of every operator: the median time of the engine
(one-node graph, one C call) and of torch (the equivalent function, autograd
for backward), and their ratio engine / torch (below 1: the engine is faster).

    python benchmarks/bench_ops.py [--budget 0.3] [--only Conv,Gemm] [--json out.json]

Engine and torch calls are interleaved and medians kept (see timing.py).
benchmarks/run.py runs these cases too, with the operator and model suites.
"""
import argparse
import json
import sys

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import aidge_interop
from aidge_interop import Tensor
from timing import interleaved_medians

R = np.random.default_rng(0)


def f32(*shape, lo=-2.0, hi=2.0):
    return R.uniform(lo, hi, shape).astype(np.float32)


# name: (op_type, inputs, attrs, consts, torch_fn(*inputs, *consts))
CASES = {
    "Relu": ("Relu", {"x": f32(64, 64, 32)}, {}, {}, torch.relu),
    "LeakyRelu": ("LeakyRelu", {"x": f32(64, 64, 32)}, {"alpha": 0.1}, {},
                  lambda x: F.leaky_relu(x, 0.1)),
    "Sigmoid": ("Sigmoid", {"x": f32(64, 64, 32)}, {}, {}, torch.sigmoid),
    "Tanh": ("Tanh", {"x": f32(64, 64, 32)}, {}, {}, torch.tanh),
    "Gelu": ("Gelu", {"x": f32(64, 64, 32)}, {}, {}, F.gelu),
    "Exp": ("Exp", {"x": f32(64, 64, 32)}, {}, {}, torch.exp),
    "Sqrt": ("Sqrt", {"x": f32(64, 64, 32, lo=0.1)}, {}, {}, torch.sqrt),
    "Clip": ("Clip", {"x": f32(64, 64, 32)}, {},
             {"lo": np.float32(-1), "hi": np.float32(1)}, lambda x, lo, hi: torch.clamp(x, lo, hi)),
    "Add": ("Add", {"a": f32(64, 64, 32), "b": f32(64, 64, 32)}, {}, {}, torch.add),
    "Add_bcast": ("Add", {"a": f32(64, 64, 32), "b": f32(32)}, {}, {}, torch.add),
    "Mul": ("Mul", {"a": f32(64, 64, 32), "b": f32(64, 64, 32)}, {}, {}, torch.mul),
    "Div": ("Div", {"a": f32(64, 64, 32), "b": f32(64, 64, 32, lo=0.5)}, {}, {}, torch.div),
    "Gemm": ("Gemm", {"a": f32(128, 256), "b": f32(512, 256), "c": f32(512)}, {"transB": 1}, {},
             lambda a, b, c: F.linear(a, b, c)),
    "MatMul": ("MatMul", {"a": f32(8, 64, 128), "b": f32(8, 128, 64)}, {}, {}, torch.matmul),
    "Conv": ("Conv", {"x": f32(8, 32, 32, 32), "w": f32(64, 32, 3, 3), "b": f32(64)},
             {"pads": [1, 1, 1, 1]}, {}, lambda x, w, b: F.conv2d(x, w, b, padding=1)),
    "ConvDepthwise": ("Conv", {"x": f32(8, 64, 32, 32), "w": f32(64, 1, 3, 3)},
                      {"pads": [1, 1, 1, 1], "group": 64}, {},
                      lambda x, w: F.conv2d(x, w, padding=1, groups=64)),
    "ConvTranspose": ("ConvTranspose", {"x": f32(8, 32, 16, 16), "w": f32(32, 16, 2, 2)},
                      {"strides": [2, 2]}, {}, lambda x, w: F.conv_transpose2d(x, w, stride=2)),
    "MaxPool": ("MaxPool", {"x": f32(8, 32, 32, 32)}, {"kernel_shape": [2, 2], "strides": [2, 2]},
                {}, lambda x: F.max_pool2d(x, 2)),
    "AveragePool": ("AveragePool", {"x": f32(8, 32, 32, 32)},
                    {"kernel_shape": [2, 2], "strides": [2, 2]}, {}, lambda x: F.avg_pool2d(x, 2)),
    "GlobalAveragePool": ("GlobalAveragePool", {"x": f32(8, 64, 16, 16)}, {}, {},
                          lambda x: F.adaptive_avg_pool2d(x, 1)),
    "BatchNormalization": ("BatchNormalization",
                           {"x": f32(8, 32, 16, 16), "s": f32(32), "b": f32(32)}, {},
                           {"m": np.zeros(32, np.float32), "v": np.ones(32, np.float32)},
                           lambda x, s, b, m, v: F.batch_norm(x, m, v, s, b, False)),
    "LayerNormalization": ("LayerNormalization", {"x": f32(64, 64, 128), "s": f32(128),
                                                  "b": f32(128)}, {"axis": -1}, {},
                           lambda x, s, b: F.layer_norm(x, (128,), s, b)),
    "Softmax": ("Softmax", {"x": f32(64, 64, 128)}, {"axis": -1}, {},
                lambda x: torch.softmax(x, -1)),
    "LogSoftmax": ("LogSoftmax", {"x": f32(64, 64, 128)}, {"axis": -1}, {},
                   lambda x: torch.log_softmax(x, -1)),
    "ReduceMean": ("ReduceMean", {"x": f32(64, 64, 128)}, {"keepdims": 1},
                   {"axes": np.array([2], np.int64)}, lambda x, a: x.mean(2, keepdim=True)),
    "ReduceSum": ("ReduceSum", {"x": f32(64, 64, 128)}, {"keepdims": 0},
                  {"axes": np.array([1], np.int64)}, lambda x, a: x.sum(1)),
    "Transpose": ("Transpose", {"x": f32(64, 64, 128)}, {"perm": [0, 2, 1]}, {},
                  lambda x: x.permute(0, 2, 1).contiguous()),
    "Concat": ("Concat", {"a": f32(64, 64, 64), "b": f32(64, 64, 64)}, {"axis": 1}, {},
               lambda a, b: torch.cat([a, b], 1)),
    "Pad": ("Pad", {"x": f32(8, 32, 32, 32)}, {"mode": "reflect"},
            {"pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)},
            lambda x, p: F.pad(x, (1, 1, 1, 1), mode="reflect")),
    "ShiftGELU": ("ShiftGELU", {"x": f32(64, 64, 32)}, {}, {}, None),
}


def one_node_model(op_type, inputs, attrs, consts):
    names = list(inputs) + list(consts)
    domain = "aidge" if op_type.startswith("Shift") else ""
    node = helper.make_node(op_type, names, ["y"], domain=domain or None, **attrs)
    g = helper.make_graph(
        [node], op_type,
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, list(a.shape)) for n, a in inputs.items()],
        [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)],
        [numpy_helper.from_array(np.asarray(v), n) for n, v in consts.items()])
    imports = [helper.make_opsetid("", 20)] + ([helper.make_opsetid("aidge", 1)] if domain else [])
    return helper.make_model(g, opset_imports=imports)


def callables(name):
    """``{"engine_fwd", "engine_bwd", "torch_fwd", "torch_bwd"}`` -> callable for
    case ``name`` (torch ones absent when torch has no equivalent). Backward
    runs alone, repeatedly, on the state of one forward."""
    op_type, inputs, attrs, consts, torch_fn = CASES[name]
    g = aidge_interop.load_onnx(one_node_model(op_type, inputs, attrs, consts),
                                param_kinds={n: "const" for n in consts})._g
    g.need_backward = True
    g.input_grads = True
    xs = [Tensor(a) for a in inputs.values()]
    (y,) = g.forward(xs)
    dy = [Tensor(np.ones(y.shape, np.float32))]
    fns = {"engine_fwd": lambda: g.forward(xs), "engine_bwd": lambda: g.backward(dy)}
    if torch_fn is not None:
        ts = [torch.tensor(a, requires_grad=True) for a in inputs.values()]
        cs = [torch.tensor(np.asarray(c)) for c in consts.values()]

        def torch_fwd():
            with torch.no_grad():
                return torch_fn(*ts, *cs)

        gt = torch.ones(y.shape)
        out = torch_fn(*ts, *cs)
        fns["torch_fwd"] = torch_fwd
        # the engine writes every gradient out in full; torch's autograd may
        # return a view of the output gradient instead (Transpose: a permuted
        # view, Concat: slices, ReduceSum: an expand), which costs nothing:
        # its gradients are made contiguous, as a consumer reading them would
        fns["torch_bwd"] = lambda: [g.contiguous() for g in
                                    torch.autograd.grad(out, ts, gt, retain_graph=True)]
    return fns


def bench(name, budget_s=0.3):
    """Median ms of each callable of ``name``, engine and torch interleaved."""
    fns = callables(name)
    keys = list(fns)
    return {"op": name, **{k + "_ms": t * 1e3 for k, t in
                           zip(keys, interleaved_medians([fns[k] for k in keys], budget_s))}}


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--budget", type=float, default=0.3,
                        help="seconds of timing per case")
    parser.add_argument("--only", default="")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    aidge_interop.set_num_threads(args.threads)
    names = [n for n in CASES if not args.only or n in args.only.split(",")]
    print(f"engine GEMM: {aidge_interop._C.gemm_backend()}, {args.threads} thread(s); "
          f"times are medians in ms\n")
    print(f"{'operator':<20}{'eng fwd':>9}{'torch fwd':>10}{'ratio':>7}"
          f"{'eng bwd':>9}{'torch bwd':>10}{'ratio':>7}")
    rows = []
    for name in names:
        try:
            row = bench(name, args.budget)
        except (NotImplementedError, ValueError, TypeError) as exc:
            print(f"{name:<20} n/a ({str(exc)[:60]})")
            continue
        rows.append(row)
        tf, tb = row.get("torch_fwd_ms"), row.get("torch_bwd_ms")
        rf = f"{row['engine_fwd_ms'] / tf:7.2f}" if tf else "      -"
        rb = f"{row['engine_bwd_ms'] / tb:7.2f}" if tb and tb > 0 else "      -"
        print(f"{name:<20}{row['engine_fwd_ms']:9.3f}{tf or float('nan'):10.3f}{rf}"
              f"{row['engine_bwd_ms']:9.3f}{tb or float('nan'):10.3f}{rb}")
        sys.stdout.flush()
    ratios_f = [r["engine_fwd_ms"] / r["torch_fwd_ms"] for r in rows if r.get("torch_fwd_ms")]
    ratios_b = [r["engine_bwd_ms"] / r["torch_bwd_ms"] for r in rows
                if r.get("torch_bwd_ms", 0) > 0 and r["engine_bwd_ms"] > 0]
    if ratios_f:
        print(f"\ngeometric mean engine/torch: forward {np.exp(np.mean(np.log(ratios_f))):.2f}"
              + (f", backward {np.exp(np.mean(np.log(ratios_b))):.2f}" if ratios_b else ""))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
