"""Per-node times of the suite models' eval forward: the engine's
(aidge_interop.profile) next to ONNX Runtime's (its own profiler) on the
same ONNX graph, one call of each in turn, each node's median over the
calls (medians: on a loaded machine a single preempted call moves a sum by
milliseconds). The nodes are matched by the value they write (ONNX Runtime
names a fused node after its output, "_nchwc" added in its blocked layout;
an unfused Conv's time then shows on the Relu after it). Then the whole
calls, not profiled (interleaved, as run.py times them): a call less its
kernels is the cost outside them (ONNX Runtime's profiler adds a little to
each node, so its figure is an underestimate).

    python benchmarks/suite_ort.py [--threads 1] [--calls 200] [MODEL ...]

Results: benchmarks/results/suite-ort.md.
"""
import argparse
import copy
import json
import os
import statistics
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]

import torch  # noqa: E402

import aidge_interop  # noqa: E402
from aidge_interop.graph import Graph  # noqa: E402
from run import MODELS, build_model, interleaved_medians, set_threads  # noqa: E402


def plain_options(threads):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    return options


def profile_model(name, threads, calls, batch=16):
    import onnxruntime as ort

    x = torch.randn(batch, *MODELS[name][2])
    am = aidge_interop.wrap(copy.deepcopy(build_model(name).eval()), [tuple(x.shape)])
    options = plain_options(threads)
    options.enable_profiling = True
    options.profile_file_prefix = os.path.join(tempfile.mkdtemp(), name)
    session = ort.InferenceSession(am.onnx_model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: x.numpy()}
    engine = {}  # node name -> (op type, [seconds per call])
    with torch.no_grad():
        for _ in range(10):
            am(x)
        for _ in range(calls):
            with aidge_interop.profile(am) as prof:
                am(x)
            session.run(None, feed)
            for r in prof.rows:
                if r["fwd_calls"]:
                    engine.setdefault(r["name"], (r["op_type"], []))[1].append(r["fwd_s"])
    ort_nodes = {}  # ORT node name -> (op type, [seconds per call])
    with open(session.end_profiling()) as f:
        for e in json.load(f):
            if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
                ort_nodes.setdefault(e["name"][:-len("_kernel_time")],
                                     (e["args"].get("op_name"), []))[1].append(e["dur"] * 1e-6)
    graph = Graph(am._fused or am._graph)
    # the value each node writes, as the ONNX graph names it (blocked_channels
    # adds "_blocked")
    written = {n["name"]: n["outputs"][0].removesuffix("_blocked") for n in graph.nodes()}
    print(f"== {name}, {threads} thread(s): node medians, us")
    used, total_e, total_o = set(), 0.0, 0.0
    for node, (op, times) in engine.items():
        out = written.get(node)
        match = [k for k in ort_nodes if k.removesuffix("_nchwc") == out
                 or k.removeprefix("fused ") == node]
        e = statistics.median(times)
        o = sum(statistics.median(ort_nodes[k][1]) for k in match)
        used.update(match)
        total_e, total_o = total_e + e, total_o + o
        ratio = f"{e / o:6.2f}" if o else ""
        print(f"  {node[-36:]:<36} {op[:18]:<18} {e * 1e6:9.1f} {o * 1e6:9.1f} {ratio}")
    for k, (op, times) in ort_nodes.items():
        if k not in used:
            o = statistics.median(times)
            total_o += o
            print(f"  {'(ORT) ' + k[-30:]:<36} {op[:18]:<18} {'':>9} {o * 1e6:9.1f}")
    print(f"  {'kernels':<55} {total_e * 1e6:9.1f} {total_o * 1e6:9.1f} {total_e / total_o:6.2f}")
    # the whole calls, neither profiled (run.py's timing): what the kernels
    # leave is each side's cost per call outside them
    plain = ort.InferenceSession(am.onnx_model.SerializeToString(), plain_options(threads),
                                 providers=["CPUExecutionProvider"])

    def call():
        with torch.no_grad():
            am(x)
    whole_e, whole_o = interleaved_medians([call, lambda: plain.run(None, feed)], 0.5,
                                           settle=0.1)
    print(f"  {'whole call':<55} {whole_e * 1e6:9.1f} {whole_o * 1e6:9.1f} "
          f"{whole_e / whole_o:6.2f}")
    print(f"  {'outside the kernels':<55} {(whole_e - total_e) * 1e6:9.1f} "
          f"{(whole_o - total_o) * 1e6:9.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="*", default=list(MODELS))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args()
    warnings.filterwarnings("ignore")
    set_threads(args.threads)
    for name in args.models:
        profile_model(name, args.threads, args.calls)


if __name__ == "__main__":
    main()
