"""Where eval time goes, layer by layer: the engine's fused inference graph
against ONNX Runtime on the same ONNX model, the same number of threads
(``--threads``, 1 by default).

For each model of the model suite (run.py's MODELS, batch 16), the engine's
node times (``aidge_interop.profile``) and ONNX Runtime's kernel times (its
own profiler, ``SessionOptions.enable_profiling``) over the same number of
forwards, medians per node. ONNX Runtime renames and fuses nodes (its NCHWc
transformer turns a Conv + Relu into one ``Conv`` on blocked data and adds
layout reorders), so the two lists are matched by op type in execution
order: the k-th convolution of one is the k-th of the other. What has no
counterpart (the engine's Pad, ONNX Runtime's reorders) is listed alone.
Ratios are engine / ONNX Runtime; the totals cover the node kernels only
(not the per-call cost). The two runs alternate in blocks of forwards,
``--rounds`` times, so a load burst lands on both.

    python benchmarks/layers.py [--models KWS,MobileNet] [--rounds 5] [--reps 20]
                                [--threads 2] [--json out.json]
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

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks")]
warnings.filterwarnings("ignore")

import torch  # noqa: E402

import aidge_interop  # noqa: E402
from run import MODELS, build_model  # noqa: E402

# engine op type -> the ONNX Runtime kernel that does its work
_KIND = {"FusedConv": "Conv", "Conv": "Conv", "FusedGemm": "Gemm", "Gemm": "Gemm",
         "GlobalAveragePool": "GlobalAveragePool", "AveragePool": "AveragePool",
         "MaxPool": "MaxPool", "Add": "Add", "Relu": "Relu", "Flatten": "Flatten"}


def _engine_times(am, x, reps, acc):
    with torch.no_grad(), aidge_interop.profile(am) as prof:
        for _ in range(reps):
            am(x)
    # the fused inference graph where the model has one (a BatchNorm to
    # move), else the main graph, which then runs the eval forward
    ran = {r["graph"] for r in prof.rows if r["fwd_calls"]}
    graph = "inference" if "inference" in ran else "main"
    for r in prof.rows:
        if r["graph"] == graph and r["fwd_calls"]:
            acc.setdefault((r["name"], r["op_type"]), []).append(r["fwd_s"] / r["fwd_calls"])


def _ort_times(proto, x, reps, acc, threads=1):
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads = threads, 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as tmp:
        options.profile_file_prefix = os.path.join(tmp, "ort")
        session = ort.InferenceSession(proto.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
        feed = {session.get_inputs()[0].name: x.numpy()}
        session.run(None, feed)  # warm-up: its times are dropped below
        for _ in range(reps):
            session.run(None, feed)
        with open(session.end_profiling()) as f:
            events = json.load(f)
    per_node = {}
    for e in events:
        if e.get("cat") == "Node" and e["name"].endswith("_kernel_time"):
            key = (e["name"][: -len("_kernel_time")], e["args"].get("op_name", "?"))
            per_node.setdefault(key, []).append(e["dur"] * 1e-6)
    for key, durs in per_node.items():
        acc.setdefault(key, []).extend(durs[len(durs) - reps:])


def _match(eng, ort):
    """Rows (engine name, engine op, engine s, ort name, ort op, ort s): the
    k-th node of each kind with the k-th of the other, in execution order."""
    queues = {}
    for name, op, t in ort:
        queues.setdefault(_KIND.get(op, op), []).append((name, op, t))
    rows = []
    for name, op, t in eng:
        q = queues.get(_KIND.get(op, op))
        o = q.pop(0) if q else (None, None, None)
        rows.append((name, op, t, *o))
    rows += [(None, None, None, *o) for q in queues.values() for o in q]
    return rows


def bench_model(name, batch, rounds, reps, threads=1):
    torch.set_num_threads(threads)
    aidge_interop.set_num_threads(threads)
    x = torch.randn(batch, *MODELS[name][2], generator=torch.Generator().manual_seed(0))
    tm = build_model(name).eval()
    am = aidge_interop.wrap(copy.deepcopy(tm), [tuple(x.shape)])
    with torch.no_grad():
        am(x)  # builds the fused inference graph
    eng_acc, ort_acc = {}, {}
    for _ in range(rounds):
        _engine_times(am, x, reps, eng_acc)
        _ort_times(am.onnx_model, x, reps, ort_acc, threads)
    eng = [(n, op, statistics.median(v)) for (n, op), v in eng_acc.items()]
    ort = [(n, op, statistics.median(v)) for (n, op), v in ort_acc.items()]
    return _match(eng, ort)


def _ms(t):
    return f"{1e3 * t:8.3f}" if t is not None else " " * 8


def print_rows(model, rows):
    print(f"\n== {model}: eval forward per layer (ms, medians; engine / ONNX Runtime; "
          f"{torch.get_num_threads()} thread(s))")
    print(f"{'engine node':<38}{'op':<18}{'engine':>8}  {'onnxruntime kernel':<34}{'ort':>8}"
          f"{'ratio':>7}")
    for en, eo, et, on, oo, ot in rows:
        ratio = f"{et / ot:7.2f}" if et and ot else ""
        print(f"{(en or '-')[:37]:<38}{(eo or '')[:17]:<18}{_ms(et)}  "
              f"{(on or '-')[:33]:<34}{_ms(ot)}{ratio}")
    e_tot = sum(r[2] for r in rows if r[2])
    o_tot = sum(r[5] for r in rows if r[5])
    print(f"{'total (node kernels)':<56}{_ms(e_tot)}  {'':<34}{_ms(o_tot)}{e_tot / o_tot:7.2f}")
    by_kind = {}
    for en, eo, et, on, oo, ot in rows:
        k = _KIND.get(eo or oo, eo or oo)
        e, o = by_kind.get(k, (0.0, 0.0))
        by_kind[k] = (e + (et or 0.0), o + (ot or 0.0))
    print("by kind: " + ", ".join(f"{k} {1e3 * e:.2f}/{1e3 * o:.2f} ms"
                                  for k, (e, o) in sorted(by_kind.items(),
                                                          key=lambda kv: -kv[1][0])))
    return {"model": model, "engine_s": e_tot, "ort_s": o_tot,
            "rows": [dict(zip(("engine_node", "engine_op", "engine_s", "ort_node", "ort_op",
                               "ort_s"), r)) for r in rows]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", default="KWS,MobileNet,ResNet8",
                    help=f"comma-separated, of {', '.join(MODELS)}")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=5, help="alternating blocks per library")
    ap.add_argument("--reps", type=int, default=20, help="forwards per block")
    ap.add_argument("--threads", type=int, default=1, help="threads of each library")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args()
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in models if m not in MODELS]
    if unknown:
        ap.error(f"--models: unknown {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    if args.rounds < 1 or args.reps < 1 or args.batch < 1 or args.threads < 1:
        ap.error("--rounds, --reps, --batch and --threads must be at least 1")
    results = [print_rows(m, bench_model(m, args.batch, args.rounds, args.reps, args.threads))
               for m in models]
    if args.json:
        tmp = args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(results, f, indent=1)
        os.replace(tmp, args.json)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
