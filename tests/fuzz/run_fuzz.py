"""Runs the engine fuzzer for a given time and reports executions and crashes.

    python tests/fuzz/run_fuzz.py --time 1800 [--out build/fuzz] [--no-sanitize]

Needs ``pip install atheris`` (not a dependency of the package). Builds the
extension with ASan+UBSan (tests/sanitized_build.py) so that a memory error
is a crash, not a silent corruption; seeds the working corpus from
tests/fuzz/seeds/; runs fuzz_engine.py until the time is spent, restarting
after each crash (the corpus grown so far is kept). Writes to OUT:
``fuzz.log`` (libFuzzer's output), ``crashes/`` (the crashing inputs),
``corpus/`` and ``summary.json`` (executions, time, distinct crashes). A
hang (``--timeout`` seconds on one input), a process past 3000 MB and a
memory blow-up the engine's plan limit did not refuse (harness.py) are
failures as crashes are, each with its kind. A crash is fixed, then its input goes to tests/fuzz/regressions/, which
tests/test_fuzz_regressions.py replays.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from sanitized_build import build_package, sanitizer_env  # noqa: E402

MAX_LEN = 300_000


def _signature(report: str) -> str:
    """A short description of a crash: the sanitizer's line or the Python exception."""
    for pattern in (r"ERROR: AddressSanitizer: [^\n]*", r"[^\n]*runtime error: [^\n]*",
                    r"\n(\w+(Error|Exception)[^\n]*)\n", r"(Segmentation fault|deadly signal)[^\n]*",
                    r"ERROR: libFuzzer: [^\n]*"):
        m = re.search(pattern, report)
        if m:
            return (m.group(1) if m.groups() else m.group(0)).strip()[:300]
    return "unknown"


def _kind(report: str) -> str:
    """timeout, out-of-memory (libFuzzer's RSS or malloc limit) or crash."""
    for kind in ("timeout", "out-of-memory"):
        if f"ERROR: libFuzzer: {kind}" in report:
            return kind
    return "crash"


def _drop_from_corpus(corpus: Path, crash_inputs: list[Path]):
    """Removes a crashing input from the working corpus (else every restart
    would stop on it again while it is not fixed)."""
    bad = {p.read_bytes() for p in crash_inputs if p.is_file()}
    for f in corpus.iterdir():
        if f.read_bytes() in bad:
            f.unlink()


def _sanitized_env(out: Path) -> dict:
    """The sanitized extension, built with comparison tracing
    (-fsanitize-coverage=trace-cmp: libFuzzer's value profile is the guidance
    inside the C engine), and the preloads that let gcc's ASan and atheris'
    libFuzzer share the process (sancov_forward.c says why)."""
    import atheris

    print("building the sanitized extension ...", flush=True)
    # (no target clones: their ifunc resolvers, instrumented too, would call
    # the comparison callbacks while the loader relocates, before they exist)
    dest = build_package(out / "sanitized",
                         cflags="-O1 -g -fsanitize-coverage=trace-cmp -DAI_NO_VECTOR_CLONES")
    shim = out / "sanitized" / "sancov_forward.so"
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(shim),
                    str(HERE / "sancov_forward.c"), "-ldl"], check=True)
    core = next(Path(atheris.__file__).parent.glob("core_with_libfuzzer*.so"))
    env = sanitizer_env(dest, AIDGE_FUZZ_LIBFUZZER=str(core))
    env["LD_PRELOAD"] = f"{shim}:{env['LD_PRELOAD']}"
    env["ASAN_OPTIONS"] += ":verify_asan_link_order=0:max_allocation_size_mb=2048"
    return env


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--time", type=int, default=1800, help="seconds of fuzzing in all")
    ap.add_argument("--out", type=Path, default=HERE.parent.parent / "build" / "fuzz")
    ap.add_argument("--no-sanitize", action="store_true",
                    help="fuzz the installed extension instead of a sanitized copy")
    ap.add_argument("--timeout", type=int, default=30, help="seconds per input")
    args = ap.parse_args(argv)

    out = args.out.resolve()
    corpus, crashes = out / "corpus", out / "crashes"
    corpus.mkdir(parents=True, exist_ok=True)
    crashes.mkdir(exist_ok=True)
    for seed in (HERE / "seeds").glob("*.onnx"):
        if not (corpus / seed.name).exists():
            shutil.copy2(seed, corpus / seed.name)
    env = None if args.no_sanitize else _sanitized_env(out)
    log_path = out / "fuzz.log"
    execs = runs = 0
    found = []
    start = time.monotonic()
    while (left := int(args.time - (time.monotonic() - start))) > 5:
        cmd = [sys.executable, str(HERE / "fuzz_engine.py"), f"-max_total_time={left}",
               f"-timeout={args.timeout}", "-rss_limit_mb=3000", f"-max_len={MAX_LEN}",
               f"-artifact_prefix={crashes}/", "-print_final_stats=1", "-use_value_profile=1", str(corpus)]
        proc = subprocess.run(cmd, env=dict(env or os.environ, AIDGE_FUZZ_CRASHES=str(crashes)),
                              capture_output=True, text=True, errors="replace")
        report = proc.stdout + proc.stderr
        with open(log_path, "a") as log:
            log.write(f"\n===== run {runs} rc={proc.returncode} =====\n{report}")
        counts = [int(n) for n in re.findall(r"^#(\d+)\s", report, re.M)]
        counts += [int(n) for n in re.findall(r"stat::number_of_executed_units: (\d+)", report)]
        execs += max(counts, default=0)
        runs += 1
        if proc.returncode != 0:
            written = re.findall(r"Test unit written to (\S+)", report)
            found.append({"kind": _kind(report), "signature": _signature(report),
                          "rc": proc.returncode, "inputs": [Path(p).name for p in written]})
            print(f"{found[-1]['kind']}: {found[-1]['signature']} -> {found[-1]['inputs']}",
                  flush=True)
            _drop_from_corpus(corpus, [Path(p) for p in written])
    elapsed = time.monotonic() - start
    summary = {"seconds": round(elapsed), "executions": execs, "runs": runs,
               "crashes": len(found),
               "kinds": {k: sum(f["kind"] == k for f in found) for k in {f["kind"] for f in found}},
               "distinct": sorted({f["signature"] for f in found}),
               "details": found, "sanitized": not args.no_sanitize,
               "corpus_size": len(list(corpus.iterdir()))}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps({k: summary[k] for k in ("seconds", "executions", "crashes", "kinds",
                                               "distinct")},
                     indent=1))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
