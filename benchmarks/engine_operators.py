"""The operator suite on one engine, summed up per operator family.

Runs ``tests/test_operators.py --engine ENGINE`` (one process, torch and the
engine on one thread: OMP_NUM_THREADS=1) in a temporary folder and prints a
Markdown table: per family, how many cases' forward and backward agree
with torch, differ, or are unsupported by the engine (a skip with its
message), and the median engine/torch time ratio of the cases that agree
(ModelTester's timed epochs; each case's median over ``--runs`` runs of the
suite). Then the distinct messages.

    python benchmarks/engine_operators.py --engine aidge [--runs 3] [-k ReLU]

Forward of a training case: agree when the failure (if any) is on the loss
or a gradient, or the skip is in Aidge's backward; backward: "-" for a
forward-only case, "not reached" when the forward already differs.
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

BACKWARD_TENSORS = ("loss", "input gradient", "gradient of parameter")


def run_suite(engine: str, folder: Path, extra: list) -> tuple[list, dict]:
    """(junit testcases, benchmark records by name) of one suite run."""
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join(
        [str(ROOT), os.environ.get("PYTHONPATH", "")]))
    subprocess.run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider",
                    "-q", str(ROOT / "tests" / "test_operators.py"), "--engine", engine,
                    "--junitxml", str(folder / "junit.xml"), *extra],
                   cwd=folder, env=env, stdout=subprocess.DEVNULL, check=False)
    cases = ET.parse(folder / "junit.xml").getroot().iter("testcase")
    bench = folder / "benchmarks.jsonl"
    records = {}
    if bench.exists():
        for line in bench.read_text().splitlines():
            rec = json.loads(line)
            records[rec["name"]] = rec
    return list(cases), records


def case_info() -> dict:
    """Case id -> (family, test_backward), from the suite's configurations."""
    import test_operators
    from aidge_interop.testing import OperatorConfig, build_cases

    info = {}
    for cfg in vars(test_operators).values():
        if isinstance(cfg, OperatorConfig):
            for case in build_cases(cfg):
                info[case.id] = (cfg.name, case.test_backward)
    return info


def outcome(case) -> tuple[str, str, str]:
    """(forward, backward, message) of one junit testcase."""
    for child in case:
        message = " ".join((child.get("message") or "").split())
        if child.tag == "skipped":
            if "Eclipse Aidge: backward:" in message or ": backward:" in message:
                return "agree", "unsupported", message
            return "unsupported", "unsupported", message
        if child.tag in ("failure", "error"):
            found = re.search(r", epoch \d+/\d+, (.+?): ", message)
            if not found:
                return "error", "error", message
            differs = f"{found.group(1)} differs"
            if any(t in found.group(1) for t in BACKWARD_TENSORS):
                return "agree", "differ", differs
            return "differ", "not reached", differs
    return "agree", "agree", ""


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--engine", default="aidge")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--runs", type=int, default=3,
                        help="suite runs; a case's ratio is its median over them (default 3)")
    args = parser.parse_args()
    info = case_info()
    ratios = defaultdict(lambda: ([], []))  # case id -> forward ratios, backward ratios
    for i in range(args.runs):
        with tempfile.TemporaryDirectory() as tmp:
            run_cases, records = run_suite(args.engine, Path(tmp),
                                           ["-k", args.k] if args.k else [])
        if i == 0:  # outcomes: the first run's (they are deterministic)
            cases = run_cases
        for name, rec in records.items():
            for phase, values in zip(("forward", "backward"), ratios[name]):
                if rec[phase]["ratio"] is not None:
                    values.append(rec[phase]["ratio"])
    table = defaultdict(lambda: {"n": 0, "fwd": defaultdict(int), "bwd": defaultdict(int),
                                 "ratio_fwd": [], "ratio_bwd": []})
    messages = defaultdict(set)
    order = []
    for case in cases:
        case_id = case.get("name").split("[", 1)[1].rstrip("]") if "[" in case.get("name") \
            else case.get("name")
        if case_id not in info:
            continue  # not an operator case
        family, trains = info[case_id]
        if family not in order:
            order.append(family)
        fwd, bwd, message = outcome(case)
        row = table[family]
        row["n"] += 1
        row["fwd"][fwd] += 1
        row["bwd"][bwd if trains else "-"] += 1
        if message:
            messages[message].add(family)
        forward, backward = ratios.get(case_id, ([], []))
        if forward:
            row["ratio_fwd"].append(statistics.median(forward))
        if backward:
            row["ratio_bwd"].append(statistics.median(backward))

    def counts(d, keys):
        return " / ".join(str(d.get(k, 0)) for k in keys)

    def ratio(values):
        return f"{statistics.median(values):.1f}x ({len(values)})" if values else "-"

    print("| family | cases | forward agree / differ / unsupported | backward agree / differ / "
          "unsupported / not reached / - | time vs torch, forward | backward |")
    print("|---|---|---|---|---|---|")
    total = {"n": 0, "fwd": defaultdict(int), "bwd": defaultdict(int)}
    for family in order:
        row = table[family]
        total["n"] += row["n"]
        for part in ("fwd", "bwd"):
            for k, v in row[part].items():
                total[part][k] += v
        print(f"| {family} | {row['n']} | "
              f"{counts(row['fwd'], ('agree', 'differ', 'unsupported'))} | "
              f"{counts(row['bwd'], ('agree', 'differ', 'unsupported', 'not reached', '-'))} | "
              f"{ratio(row['ratio_fwd'])} | {ratio(row['ratio_bwd'])} |")
    print(f"| all | {total['n']} | "
          f"{counts(total['fwd'], ('agree', 'differ', 'unsupported'))} | "
          f"{counts(total['bwd'], ('agree', 'differ', 'unsupported', 'not reached', '-'))} "
          f"| | |")
    errors = sum(row["fwd"].get("error", 0) for row in table.values())
    if errors:
        print(f"\n{errors} case(s) raised an error of the harness (neither a value nor a skip)")
    print("\nMessages:\n")
    for message, families in sorted(messages.items()):
        print(f"- {', '.join(sorted(families))}: {message}")


if __name__ == "__main__":
    main()
