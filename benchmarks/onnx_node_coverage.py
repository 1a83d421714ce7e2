"""The engine on every node test of the installed onnx package, nothing
excluded (issue 46's measure): passed / failed / errors, the share passed,
and the operators by number of failing cases.

    python benchmarks/onnx_node_coverage.py [--top 30]

tests/test_onnx_backend.py runs the claimed operators in CI (every one that
runs must pass); this counts all of them, as ONNX's published scoreboard
does for other runtimes.
"""
import argparse
import collections
import sys
import unittest
import warnings

import onnx
import onnx.backend.test
from onnx.backend.test.loader import load_model_tests

from aidge_interop.onnx.backend import AidgeBackend


def _tests(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from _tests(t)
        else:
            yield t


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--top", type=int, default=30, help="operators listed by failing cases")
    args = ap.parse_args(argv)
    op_of = {}  # test name -> the operators of its graph
    for t in load_model_tests(kind="node"):
        types = {n.op_type for n in t.model.graph.node} if hasattr(t, "model") and t.model \
            else set()
        op_of[t.name] = "/".join(sorted(types)) or "?"
    backend_test = onnx.backend.test.BackendTest(AidgeBackend, __name__)
    suite = unittest.defaultTestLoader.loadTestsFromTestCase(
        backend_test.test_cases["OnnxBackendNodeModelTest"])
    cpu = [t.id() for t in _tests(suite) if t.id().endswith("_cpu")]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result = unittest.TextTestRunner(stream=open("/dev/null", "w"), verbosity=0).run(suite)
    bad = {t.id(): kind for kind, items in (("fail", result.failures), ("raise", result.errors),
                                            ("refused", result.skipped))
           for t, _ in items if t.id().endswith("_cpu")}
    failed = collections.Counter()
    for test_id in bad:
        name = test_id.rsplit(".", 1)[-1].removesuffix("_cpu")
        failed[op_of.get(name, name)] += 1
    kinds = collections.Counter(bad.values())
    print(f"onnx {onnx.__version__}: {len(cpu) - len(bad)} of {len(cpu)} CPU node tests pass "
          f"({(len(cpu) - len(bad)) / len(cpu):.1%}); {kinds['fail']} fail, {kinds['raise']} "
          f"raise, {kinds['refused']} refused (an operator the engine lacks)")
    print(f"failing cases by the operators of their graph (top {args.top}):")
    for ops, n in failed.most_common(args.top):
        print(f"  {n:4d}  {ops}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
