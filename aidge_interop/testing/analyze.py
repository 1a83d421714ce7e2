"""What a test run says: failures sorted by cause, and how fast the engine was.

Reads the output of a pytest run (verbose or quiet, saved or piped) and the
benchmark log that :class:`aidge_interop.testing.ModelTester` appends to
(``benchmarks.jsonl``), then prints a report: engine bugs to report,
performance regressions, test-strategy issues, and a per-operator benchmark
summary with the worst forward and backward slowdowns::

    pytest tests/test_operators.py -v 2>&1 | tee results.txt
    python -m aidge_interop.analyze results.txt              # benchmarks.jsonl beside it
    python -m aidge_interop.analyze results.txt --bench benchmarks.jsonl --json
    pytest tests/test_operators.py -v 2>&1 | python -m aidge_interop.analyze
    python -m aidge_interop.analyze results.txt --plot ratios.png

Colours and emojis on a terminal; plain text when piped or when ``NO_COLOR``
is set (``--color yes|no|auto`` decides). :func:`categorize` is the rule that
sorts one failure.

Only the standard library is needed; ``--plot`` also needs matplotlib.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shutil
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

__all__ = [
    "categorize", "TestResult", "PytestRun", "parse_pytest_output", "load_benchmarks",
    "benchmark_summary", "build_report", "render_text", "plot_ratios", "main",
]

DEFAULT_MAX_RATIO = 10.0  # ModelTester's max_slowdown_ratio
DEFAULT_MIN_TIME_MS = 0.1  # ModelTester's bench_min_time_ms

# -- categories ---------------------------------------------------------------

ENGINE, PERFORMANCE, STRATEGY, OTHER = "engine", "performance", "strategy", "other"
EMOJI = {ENGINE: "🔴", PERFORMANCE: "🟠", STRATEGY: "🟡", OTHER: "⚪"}
SECTION_TITLES = {
    ENGINE: "Engine bugs to report",
    PERFORMANCE: "Performance regressions",
    STRATEGY: "Test-strategy issues",
    OTHER: "Other failures",
}
CATEGORY_GROUP = {
    "crash": ENGINE,
    "outputs_differ": ENGINE,
    "loss_differs": ENGINE,
    "gradients_differ": ENGINE,
    "not_implemented": ENGINE,
    "runtime_error": ENGINE,
    "performance_regression": PERFORMANCE,
    "shape_mismatch (test strategy)": STRATEGY,
    "unsupported_attribute (test strategy)": STRATEGY,
    "xpass (test strategy)": STRATEGY,
    "assertion_failed": OTHER,
    "unknown": OTHER,
}

_CRASH = re.compile(r"Fatal Python error|crashed while running|Segmentation fault|node down",
                    re.I)
_SLOWER = re.compile(r"\bis [\d.]+x slower than torch\b")
_SHAPE = re.compile(
    r"attribute 'shape' do not match|shape mismatch|size mismatch|shapes cannot be multiplied"
    r"|must match the size of tensor|expected input\[.*\] to have|Expected input batch_size",
    re.I)
_ATTRIBUTE = re.compile(r"unexpected keyword argument|unsupported attribute"
                        r"|attribute '[^']+' is not supported by operator", re.I)
# ModelTester: "<name>, epoch <i>/<N>, <tensor>: ..." (no epoch from unit_test)
_TENSOR = re.compile(r"^\S+(?:, epoch \d+/\d+)?, (output|loss|input gradient"
                     r"|gradient of parameter '[^']*')(?:\[\d+\])?: ")
_NOT_CLOSE = re.compile(r"(Tensor-likes|Scalars) are not (close|equal)")


def categorize(rt_msg: str | None, ae_msg: str | None) -> tuple[str, str]:
    """Sorts one failure by its messages.

    ``rt_msg`` is the text of the non-assertion exception (``RuntimeError``,
    ``NotImplementedError``, a crash report, ...), ideally with its type
    (``"NotImplementedError: ..."``); ``ae_msg`` the ``AssertionError``'s
    message. Either may be empty. Returns ``(category, emoji)``, e.g.
    ``("outputs_differ", "🔴")`` or ``("shape_mismatch (test strategy)", "🟡")``.
    The group of a category is ``CATEGORY_GROUP[category]``.
    """
    rt, ae = rt_msg or "", ae_msg or ""
    both = f"{rt}\n{ae}"
    if _CRASH.search(rt):
        category = "crash"
    elif "XPASS(strict)" in both:
        category = "xpass (test strategy)"
    elif _SLOWER.search(ae):
        category = "performance_regression"
    elif _SHAPE.search(both):
        category = "shape_mismatch (test strategy)"
    elif _ATTRIBUTE.search(both):
        category = "unsupported_attribute (test strategy)"
    elif (m := _TENSOR.search(ae)) or _NOT_CLOSE.search(ae):
        # ModelTester names the tensor; a bare assert_close message is about outputs
        tensor = m.group(1) if m else "output"
        category = {"output": "outputs_differ", "loss": "loss_differs"}.get(
            tensor, "gradients_differ")
    elif rt.startswith("NotImplementedError") or "not supported by the engine" in rt:
        category = "not_implemented"
    elif rt:
        category = "runtime_error"
    elif ae:
        category = "assertion_failed"
    else:
        category = "unknown"
    return category, EMOJI[CATEGORY_GROUP[category]]


# -- pytest output --------------------------------------------------------------

_OUTCOMES = ("PASSED", "FAILED", "ERROR", "XFAIL", "XPASS", "SKIPPED")
_OUTCOME_NAMES = {"PASSED": "passed", "FAILED": "failed", "ERROR": "error",
                  "XFAIL": "xfailed", "XPASS": "xpassed", "SKIPPED": "skipped"}
_COUNT_NAMES = {"errors": "error", "warning": "warnings"}
# when a test reports twice (a teardown error after PASSED), the worse wins
_SEVERITY = {"passed": 0, "skipped": 1, "xfailed": 2, "xpassed": 3, "failed": 4, "error": 5}

_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_NODEID = r"(?P<nodeid>[^\s\[]+::[^\s\[]+(?:\[.*?\])?)"
_OUTCOME = r"(?P<outcome>" + "|".join(_OUTCOMES) + r")"
_VERBOSE = re.compile(rf"^{_NODEID} {_OUTCOME}(?: \((?P<reason>.*)\))?\s*(?:\[\s*\d+%\])?\s*$")
_VERBOSE_XDIST = re.compile(rf"^\[gw\d+\] \[\s*\d+%\] {_OUTCOME} {_NODEID}\s*$")
# a crashing worker's stderr (faulthandler's dump, written piece by piece) can
# interleave with the controller's result lines anywhere: "[gw0]  File  [ 94%]
# PASSED <nodeid> "/path", line 1 in f"; the result is recovered from the pieces
_XDIST_INTERLEAVED = re.compile(rf"(?P<gw>\[gw\d+\])(?P<pre>.*?)(?P<pct>\[\s*\d+%\])\W*?"
                                rf"{_OUTCOME} {_NODEID}")
# or the dump starts right after a result's "[gw0] [ 88%] " and the rest of the
# result ("PASSED <nodeid>") comes on a line of its own after the dump
_XDIST_STRANDED = re.compile(r"^(?P<gw>\[gw\d+\]) (?P<pct>\[\s*\d+%\]) Fatal Python error:")
_BARE_RESULT = re.compile(rf"^{_OUTCOME} {_NODEID}\s*$")
_SHORT_SUMMARY = re.compile(rf"^{_OUTCOME} (?P<nodeid>\S.*?)(?: - (?P<msg>.*))?$")
_RULE = re.compile(r"^=+ ?(?P<title>.*?) ?=+$")
_SECTION = re.compile(r"^_{3,} (?P<title>.+?) _{3,}$")
_COUNTS = re.compile(r"^=*\s*(?P<counts>\d+ \w+(?:, \d+ \w+)*|no tests ran) in [\d.]+s\b")
_LOCATION = re.compile(r"^\S+:\d+: (?P<type>[A-Za-z_][\w.]*)$")
_EXC_LINE = re.compile(r"^(?:\S+:\d+: )?(?P<type>[A-Za-z_][\w.]*(?:Error|Exception|Exit|Failed)"
                       r"|AssertionError): (?P<msg>.*)$")
_FRAME = re.compile(r'^\s*File "(?P<path>[^"]+)", line \d+ in (?P<func>\S+)')
_ROOTDIR = re.compile(r"^rootdir: (?P<path>[^,]+)")


@dataclass
class TestResult:
    """One test as the output tells it."""

    __test__ = False  # not a pytest test class, whatever its name

    nodeid: str
    outcome: str  # passed, failed, error, xfailed, xpassed, skipped
    reason: str = ""  # xfail / skip reason
    exc_type: str = ""  # type of the final exception
    message: str = ""  # its full message
    rt_msg: str = ""  # for categorize()
    ae_msg: str = ""
    category: str = ""
    emoji: str = ""

    @property
    def group(self) -> str:
        return CATEGORY_GROUP.get(self.category, "")


@dataclass
class PytestRun:
    """Everything parsed from one pytest output."""

    tests: dict[str, TestResult] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)  # the final "3 failed, ..." line
    complete: bool = False  # False when the final line is missing (crash, interrupted)
    crash: str = ""  # the "Fatal Python error" line, if the interpreter died

    def result(self, nodeid: str) -> TestResult:
        if nodeid not in self.tests:
            self.tests[nodeid] = TestResult(nodeid, "")
        return self.tests[nodeid]

    def set_outcome(self, nodeid: str, outcome: str, reason: str = "") -> None:
        t = self.result(nodeid)
        if _SEVERITY[outcome] >= _SEVERITY.get(t.outcome, -1):
            t.outcome = outcome
        t.reason = reason or t.reason


def _exceptions(body: list[str]) -> list[tuple[str, str]]:
    """``(type, message)`` of each exception of a failure section, in order.

    Reads pytest's ``E   `` lines (``--tb`` auto/long/short), else the
    ``Type: message`` lines of ``--tb=native``/``line`` tracebacks.
    """
    found, i = [], 0
    while i < len(body):
        if not re.match(r"^E(\s|$)", body[i]):
            i += 1
            continue
        block = []
        while i < len(body) and re.match(r"^E(\s|$)", body[i]):
            block.append(body[i])
            i += 1
        indent = len(block[0]) - len(block[0][1:].lstrip()) if block[0].strip() != "E" else 1
        text = "\n".join(line[indent:] for line in block).strip("\n")
        following = next((line for line in body[i:] if line.strip()), "")
        loc = _LOCATION.match(following)
        m = _EXC_LINE.match(text.split("\n", 1)[0])
        if m:
            exc_type, msg = m["type"], text.split(": ", 1)[1]
        else:  # "assert x == y" (rewritten assertion) or a message-less raise
            exc_type = loc["type"] if loc else ("AssertionError" if text.startswith("assert")
                                                else "")
            msg = text
        found.append((exc_type, msg))
    if not found:
        for line in body:
            if m := _EXC_LINE.match(line.strip()):
                found.append((m["type"], m["msg"]))
    return found


def _short_exception(msg: str) -> tuple[str, str]:
    """``(type, message)`` of a short-summary message ``"Type: text..."``."""
    m = _EXC_LINE.match(msg)
    return (m["type"], m["msg"]) if m else ("", msg)


def _fill_messages(t: TestResult, excs: list[tuple[str, str]]) -> None:
    for exc_type, msg in excs:
        if exc_type == "AssertionError":
            t.ae_msg = msg
        else:
            t.rt_msg = f"{exc_type}: {msg}" if exc_type else msg
    if excs:
        t.exc_type, t.message = excs[-1]


def parse_pytest_output(text: str) -> PytestRun:
    """Parses the console output of one pytest run (``-v``/``-vv`` or
    ``-q``, with or without pytest-xdist, colours or not).

    Verbose output gives every test's outcome; quiet output gives the
    failures and errors (from the "short test summary info" and the failure
    sections) and the totals. A run cut short by a crash is recognised from
    Python's "Fatal Python error" report, and the test that was running is
    named.
    """
    run = PytestRun()
    lines = []
    stranded = ""  # "[gwN] [ NN%]" of a result whose rest follows a crash dump
    for line in text.splitlines():
        line = _ANSI.sub("", line).rstrip("\r")
        if not _VERBOSE_XDIST.match(line) and (m := _XDIST_INTERLEAVED.search(line)):
            lines.append(f"{m['gw']} {m['pct']} {m['outcome']} {m['nodeid']}")
            rest = (line[:m.start()] + m["pre"] + line[m.end():]).strip()
            if rest:
                lines.append(rest)
        elif stranded and (m := _BARE_RESULT.match(line)):
            lines.append(f"{stranded} {m['outcome']} {m['nodeid']}")
            stranded = ""
        else:
            if m := _XDIST_STRANDED.match(line):
                stranded = f"{m['gw']} {m['pct']}"
            lines.append(line)
    rootdir = ""
    sections: list[tuple[str, list[str]]] = []  # (title, body) of FAILURES/ERRORS
    short: dict[str, str] = {}  # nodeid -> short summary message
    zone, body = "", None
    crashed_nodeid, crash_frames = "", []
    for i, line in enumerate(lines):
        if m := _ROOTDIR.match(line):
            rootdir = m["path"].strip()
        if "Fatal Python error:" in line:
            # the report may start in the middle of a line: "<nodeid> Fatal..." when
            # the test that crashed was announced, "[gw0] ... PASSED <nodeid> Fatal..."
            # when a pytest-xdist worker's stderr interleaves
            k = line.index("Fatal Python error:")
            run.crash, line = line[k:], line[:k].rstrip()
            if re.fullmatch(_NODEID, line):
                crashed_nodeid = line
            crash_frames = []
            for frame in lines[i + 1:]:
                if m := _FRAME.match(frame):
                    crash_frames.append((m["path"], m["func"]))
                elif crash_frames:
                    break
        if m := _COUNTS.match(line):
            run.complete = True
            run.counts = {_COUNT_NAMES.get(k, k): int(n)
                          for n, k in re.findall(r"(\d+) (\w+)", m["counts"])}
            zone = ""
            continue
        if m := _RULE.match(line):
            title = m["title"]
            zone = {"FAILURES": "sections", "ERRORS": "sections",
                    "short test summary info": "summary"}.get(title, "")
            body = None
            continue
        if zone == "sections":
            if m := _SECTION.match(line):
                body = []
                sections.append((m["title"], body))
            elif body is not None:
                body.append(line)
            continue
        if zone == "summary":
            # "SKIPPED [1] file:line: reason" names no test
            if (m := _SHORT_SUMMARY.match(line)) and not m["nodeid"].startswith("["):
                outcome = _OUTCOME_NAMES[m["outcome"]]
                msg = m["msg"] or ""
                if outcome in ("xfailed", "xpassed", "skipped"):
                    run.set_outcome(m["nodeid"], outcome, reason=msg)
                else:
                    run.set_outcome(m["nodeid"], outcome)
                    short[m["nodeid"]] = msg
            continue
        if m := (_VERBOSE.match(line) or _VERBOSE_XDIST.match(line)):
            run.set_outcome(m["nodeid"], _OUTCOME_NAMES[m["outcome"]],
                            reason=m.groupdict().get("reason") or "")

    _attach_sections(run, sections, short)
    if run.crash and not run.complete:
        _attach_crash(run, crashed_nodeid, crash_frames, rootdir)
    for t in run.tests.values():
        if t.outcome in ("failed", "error"):
            t.category, t.emoji = categorize(t.rt_msg, t.ae_msg)
        elif t.outcome == "xpassed":
            t.category, t.emoji = "xpass (test strategy)", EMOJI[STRATEGY]
    if not run.complete:
        run.counts = {}
        for t in run.tests.values():
            run.counts[t.outcome] = run.counts.get(t.outcome, 0) + 1
    return run


def _head(nodeid: str) -> str:
    """The title pytest gives a test's failure section."""
    return nodeid.split("::", 1)[1].replace("::", ".") if "::" in nodeid else nodeid


def _attach_sections(run: PytestRun, sections, short: dict[str, str]) -> None:
    """Matches each failure section to its test and reads its exceptions."""
    pending: dict[str, list[str]] = {}
    for nodeid, t in run.tests.items():
        if t.outcome in ("failed", "error", "xpassed"):
            pending.setdefault(_head(nodeid), []).append(nodeid)
    for title, body in sections:
        worker_crash = next((re.search(r"crashed while running '([^']+)'", line)
                             for line in body if "crashed while running" in line), None)
        if worker_crash:
            nodeid = worker_crash.group(1)
            run.set_outcome(nodeid, "failed")
            t = run.result(nodeid)
            t.rt_msg = t.message = next(
                line for line in body if "crashed while running" in line).strip()
            t.exc_type = "crash"
            continue
        key = re.sub(r"^ERROR (at (setup|teardown) of|collecting) ", "", title)
        candidates = pending.get(key) or pending.get(_head(key))
        nodeid = candidates.pop(0) if candidates else key
        if nodeid not in run.tests:
            run.set_outcome(nodeid, "error" if title.startswith("ERROR") else "failed")
        _fill_messages(run.result(nodeid), _exceptions(body))
    for nodeid, msg in short.items():  # --tb=no, or sections cut off
        t = run.result(nodeid)
        if not (t.rt_msg or t.ae_msg) and msg:
            _fill_messages(t, [_short_exception(msg)])


def _attach_crash(run: PytestRun, nodeid: str, frames, rootdir: str) -> None:
    """Names the test that was running when the interpreter died."""
    if not nodeid:
        # the test function is the frame just before pytest's pytest_pyfunc_call
        for k, (_, func) in enumerate(frames[1:], start=1):
            if func == "pytest_pyfunc_call":
                test_path, test_func = frames[k - 1]
                if rootdir and test_path.startswith(rootdir.rstrip("/") + "/"):
                    test_path = test_path[len(rootdir.rstrip("/")) + 1:]
                nodeid = f"{test_path}::{test_func}"
                break
    nodeid = nodeid or "<unknown test>"
    run.set_outcome(nodeid, "failed")
    t = run.result(nodeid)
    t.rt_msg = t.message = f"{run.crash} (the run stopped here)"
    t.exc_type = "crash"


# -- benchmarks -----------------------------------------------------------------

_PHASE_KEYS = ("mean1", "mean2", "ratio", "samples")


def load_benchmarks(path: str | os.PathLike) -> list[dict]:
    """The records of a ``benchmarks.jsonl`` log, the latest one per test name
    (the log is appended to run after run), in order of first appearance.

    A record is ``{"name", "forward": {"mean1", "mean2", "ratio", "samples"},
    "backward": {...}}``, times in seconds, ``ratio = mean2 / mean1``; a phase
    may be ``null`` or have ``null`` means when it was not timed. A line that
    is not such a record raises :class:`ValueError` naming ``file:line``.
    """
    path = Path(path)
    records: dict[str, dict] = {}
    with path.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: not valid JSON ({exc.msg}): {line.strip()[:80]!r}")
            if not isinstance(rec, dict) or not isinstance(rec.get("name"), str):
                raise ValueError(f"{where}: a benchmark record is an object with a 'name' "
                                 "string, 'forward' and 'backward'")
            for phase in ("forward", "backward"):
                stats = rec.get(phase)
                if stats is None:
                    continue
                if not isinstance(stats, dict) or not set(_PHASE_KEYS) <= stats.keys():
                    raise ValueError(f"{where}: '{phase}' must be null or an object with "
                                     f"{', '.join(_PHASE_KEYS)}")
                for key in _PHASE_KEYS:
                    v = stats[key]
                    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))
                                          or not math.isfinite(v) or v < 0):
                        raise ValueError(f"{where}: {phase}.{key} must be a number >= 0 or "
                                         f"null, got {v!r}")
            records.pop(rec["name"], None)
            records[rec["name"]] = rec
    return list(records.values())


def operator_of(name: str) -> str:
    """``"Conv2D_attributes_kernel_square"`` -> ``"Conv2D"``, ``"LeNet_train"`` -> ``"LeNet"``."""
    return name.split("_", 1)[0]


def _timed(rec: dict, phase: str) -> dict | None:
    stats = rec.get(phase)
    return stats if stats and stats["ratio"] is not None and stats["samples"] else None


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(max(v, 1e-300)) for v in values) / len(values))


def benchmark_summary(records: list[dict], top: int = 10,
                      max_ratio: float = DEFAULT_MAX_RATIO,
                      min_time_ms: float = DEFAULT_MIN_TIME_MS) -> dict:
    """Per-operator ratios, the ``top`` worst records of each phase, and the
    regressions: records whose ratio exceeds ``max_ratio`` in a phase whose
    torch time is at least ``min_time_ms`` (ModelTester's own rule)."""
    per_op: dict[str, dict] = {}
    worst = {"forward": [], "backward": []}
    regressions = []
    for rec in records:
        op = per_op.setdefault(operator_of(rec["name"]), {"tests": 0, "forward": [],
                                                           "backward": []})
        op["tests"] += 1
        for phase in worst:
            stats = _timed(rec, phase)
            if stats is None:
                continue
            entry = {"name": rec["name"], "phase": phase, "ratio": stats["ratio"],
                     "engine_ms": _ms(stats["mean2"]), "torch_ms": _ms(stats["mean1"]),
                     "samples": stats["samples"]}
            op[phase].append(stats["ratio"])
            worst[phase].append(entry)
            if stats["ratio"] > max_ratio and (stats["mean1"] or 0) * 1e3 >= min_time_ms:
                regressions.append(entry)
    operators = {}
    for name in sorted(per_op, key=str.lower):
        op = per_op[name]
        row = {"tests": op["tests"]}
        for phase in worst:
            ratios = op[phase]
            row[phase] = ({"geomean": _geomean(ratios), "worst": max(ratios),
                           "count": len(ratios)} if ratios else None)
        operators[name] = row
    for phase in worst:
        worst[phase] = sorted(worst[phase], key=lambda e: -e["ratio"])[:top]
    regressions.sort(key=lambda e: -e["ratio"])
    return {"records": len(records), "operators": operators, "worst": worst,
            "regressions": regressions, "max_ratio": max_ratio, "min_time_ms": min_time_ms}


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


# -- report ---------------------------------------------------------------------

def build_report(run: PytestRun, records: list[dict] | None, *, top: int = 10,
                 max_ratio: float = DEFAULT_MAX_RATIO,
                 min_time_ms: float = DEFAULT_MIN_TIME_MS, source: str = "",
                 bench_source: str = "") -> dict:
    """The report as plain data (what ``--json`` prints)."""
    groups = {g: [] for g in SECTION_TITLES}
    for t in run.tests.values():
        if t.category:
            groups[t.group].append({
                "nodeid": t.nodeid, "outcome": t.outcome, "category": t.category,
                "emoji": t.emoji, "exception": t.exc_type, "message": t.message or t.reason,
            })
    return {
        "source": source,
        "complete": run.complete,
        "crash": run.crash,
        "counts": run.counts,
        "engine_bugs": groups[ENGINE],
        "performance_regressions": groups[PERFORMANCE],
        "test_strategy_issues": groups[STRATEGY],
        "other_failures": groups[OTHER],
        "expected_failures": [{"nodeid": t.nodeid, "reason": t.reason}
                              for t in run.tests.values() if t.outcome == "xfailed"],
        "tests": [asdict(t) for t in run.tests.values()],
        "benchmarks_file": bench_source,
        "benchmarks": (benchmark_summary(records, top, max_ratio, min_time_ms)
                       if records is not None else None),
    }


class _Style:
    """ANSI styling, or none."""

    CODES = {"bold": "1", "dim": "2", "red": "31", "green": "32", "yellow": "33",
             "magenta": "35", "cyan": "36"}

    def __init__(self, color: bool):
        self.color = color

    def __call__(self, text: str, *styles: str) -> str:
        if not self.color or not styles:
            return text
        codes = ";".join(self.CODES[s] for s in styles)
        return f"\x1b[{codes}m{text}\x1b[0m"


def _table(headers: list[str], rows: list[list[str]], style: _Style, right: set[int] = frozenset(),
           highlight=None, width: int | None = None) -> list[str]:
    """An aligned text table; on a terminal, ``width`` truncates the last column
    and ``highlight(row) -> style`` colours a row."""
    cols = list(zip(*([headers] + rows))) if rows else [[h] for h in headers]
    widths = [max(len(str(c)) for c in col) for col in cols]
    if width:  # the last column gets what is left of the terminal
        left = sum(widths[:-1]) + 2 * (len(widths) - 1) + 2
        widths[-1] = max(20, min(widths[-1], width - left))

    def fmt(cells):
        out = []
        for k, cell in enumerate(cells):
            cell = str(cell)
            if k == len(cells) - 1 and width and len(cell) > widths[k]:
                cell = cell[:widths[k] - 1] + "…"
            out.append(cell.rjust(widths[k]) if k in right else cell.ljust(widths[k]))
        return "  " + "  ".join(out).rstrip()

    rule = "─" if style.color else "-"
    lines = [style(fmt(headers), "bold"), "  " + style("  ".join(rule * w for w in widths), "dim")]
    for row in rows:
        line = fmt(row)
        lines.append(style(line, highlight(row)) if highlight and highlight(row) else line)
    return lines


def _first_line(message: str) -> str:
    return message.strip().split("\n", 1)[0] if message else ""


def render_text(report: dict, *, color: bool = False, verbose: bool = False,
                width: int | None = None) -> str:
    """The report for people: colours, emojis and ``width``-wide tables when
    ``color``, plain text otherwise. ``verbose`` adds full failure messages."""
    s = _Style(color)
    out: list[str] = []
    counts = report["counts"]
    title = "aidge_interop test report" + (f" — {report['source']}" if report["source"] else "")
    out += [s(title, "bold"), ""]
    order = ["passed", "failed", "error", "xfailed", "xpassed", "skipped", "deselected"]
    parts = [f"{counts[k]} {k}" for k in order if counts.get(k)]
    parts += [f"{n} {k}" for k, n in counts.items() if k not in order and k != "warnings"]
    out.append("Tests: " + (", ".join(parts) or "none found"))
    if report["crash"] and not report["complete"]:
        out.append(s(f"The run did not finish: {report['crash']}", "red", "bold"))
    elif not report["complete"]:
        out.append("The output has no final summary line: counts are those of the tests seen.")

    colours = {ENGINE: "red", PERFORMANCE: "yellow", STRATEGY: "yellow", OTHER: ""}
    keys = {ENGINE: "engine_bugs", PERFORMANCE: "performance_regressions",
            STRATEGY: "test_strategy_issues", OTHER: "other_failures"}
    bench = report["benchmarks"]
    for group, key in keys.items():
        items = report[key]
        slow = bench["regressions"] if (group == PERFORMANCE and bench) else []
        if group == OTHER and not items:
            continue
        heading = SECTION_TITLES[group]
        heading = f"{EMOJI[group]} {heading}" if color else heading.upper()
        count = (f"{_plural(len(items), 'test')}, {_plural(len(slow), 'benchmark record')}"
                 if group == PERFORMANCE and bench else str(len(items)))
        out += ["", s(f"{heading} ({count})", "bold", *filter(None, [colours[group]]))]
        if group == PERFORMANCE and bench:
            out.append(f"  limit {bench['max_ratio']:g}x engine/torch, for phases where torch "
                       f"takes at least {bench['min_time_ms']:g} ms")
        if not items and not slow:
            out.append("  none")
            continue
        if items:
            rows = [[it["nodeid"], it["category"], _first_line(it["message"])] for it in items]
            out += _table(["test", "category", "message"], rows, s, width=width)
            if verbose:
                for it in items:
                    out += ["", f"  {it['nodeid']}:"]
                    out += ["    " + line for line in it["message"].splitlines()]
        if slow:
            if items:
                out.append("")
            out.append("  from the benchmark log:")
            out += _table(["record", "phase", "ratio", "engine ms", "torch ms"],
                          [[e["name"], e["phase"], f"{e['ratio']:.2f}x", _fmt_ms(e["engine_ms"]),
                            _fmt_ms(e["torch_ms"])] for e in slow], s, right={2, 3, 4})

    if report["expected_failures"]:
        out += ["", s(f"Expected failures (xfail): {len(report['expected_failures'])}", "bold")]
        out += [f"  {x['nodeid']}" + (f" — {x['reason']}" if x["reason"] else "")
                for x in report["expected_failures"]]

    out.append("")
    if bench is None:
        out.append(s("Benchmarks: ", "bold") + (f"no log at {report['benchmarks_file']}"
                                                 if report["benchmarks_file"] else "no log"))
        return "\n".join(out) + "\n"
    limit = bench["max_ratio"]
    out.append(s(f"Benchmarks per operator ({bench['records']} records, "
                 f"{report['benchmarks_file']})", "bold"))
    if not bench["operators"]:
        out.append("  none")
    else:
        rows = []
        for name, op in bench["operators"].items():
            row = [name, str(op["tests"])]
            for phase in ("forward", "backward"):
                p = op[phase]
                row += ([f"{p['geomean']:.2f}x", f"{p['worst']:.2f}x"] if p else ["-", "-"])
            rows.append(row)
        out += _table(["operator", "tests", "fwd geomean", "fwd worst", "bwd geomean",
                       "bwd worst"], rows, s, right={1, 2, 3, 4, 5},
                      highlight=lambda r: "red" if any(
                          c.endswith("x") and float(c[:-1]) > limit for c in r[2:]) else "")
    for phase in ("forward", "backward"):
        entries = bench["worst"][phase]
        out += ["", s(f"Worst {phase} ratios (top {len(entries)})", "bold")]
        if not entries:
            out.append("  none timed")
            continue
        rows = [[str(k), e["name"], f"{e['ratio']:.2f}x", _fmt_ms(e["engine_ms"]),
                 _fmt_ms(e["torch_ms"])] for k, e in enumerate(entries, start=1)]
        out += _table(["#", "test", "ratio", "engine ms", "torch ms"], rows, s,
                      right={0, 2, 3, 4},
                      highlight=lambda r: "red" if float(r[2][:-1]) > limit else "")
    return "\n".join(out) + "\n"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _fmt_ms(ms) -> str:
    return "-" if ms is None else f"{ms:.3f}"


def plot_ratios(summary: dict, path: str | os.PathLike) -> None:
    """Draws the per-operator engine/torch ratios of :func:`benchmark_summary`
    (bars: geometric mean, dots: worst test; log scale; the limit dashed)
    into ``path`` (format from its extension). Needs matplotlib."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError("--plot needs matplotlib, which is not installed: "
                           "pip install matplotlib") from exc
    names = list(summary["operators"])
    if not names:
        raise ValueError("no benchmark records to plot")
    fig = Figure(figsize=(max(6.0, 0.45 * len(names) + 2), 4.5), layout="constrained")
    ax = fig.subplots()
    bar = 0.4
    for k, (phase, colour) in enumerate((("forward", "tab:blue"), ("backward", "tab:orange"))):
        xs, means, worst = [], [], []
        for i, name in enumerate(names):
            p = summary["operators"][name][phase]
            if p:
                xs.append(i + (k - 0.5) * bar)
                means.append(p["geomean"])
                worst.append(p["worst"])
        ax.bar(xs, means, bar, color=colour, label=f"{phase} (geometric mean)")
        ax.plot(xs, worst, "o", color=colour, markeredgecolor="black", markersize=4,
                label=f"{phase} (worst test)")
    ax.axhline(1.0, color="gray", linewidth=0.8)
    ax.axhline(summary["max_ratio"], color="red", linestyle="--", linewidth=1,
               label=f"limit {summary['max_ratio']:g}x")
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names, rotation=45, ha="right")
    ax.set_ylabel("engine time / torch time")
    ax.set_title("aidge_interop: slowdown per operator")
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.savefig(path, dpi=120)


# -- command line ------------------------------------------------------------------

def _use_color(choice: str, stream) -> bool:
    if choice != "auto":
        return choice == "yes"
    if os.environ.get("NO_COLOR"):
        return False
    return stream.isatty() and os.environ.get("TERM") != "dumb"


def _parser(prog: str | None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog or "python -m aidge_interop.analyze",
        description="Sort the failures of a pytest run (engine bugs, performance, test "
                    "strategy) and summarise the engine/torch benchmark ratios.",
        epilog="example: pytest tests/test_operators.py -v 2>&1 | tee results.txt; "
               "python -m aidge_interop.analyze results.txt")
    p.add_argument("results", nargs="?", default="-",
                   help="saved pytest output (verbose or quiet); '-' or nothing: stdin")
    p.add_argument("--bench", metavar="JSONL",
                   help="benchmark log (default: benchmarks.jsonl beside the results file, "
                        "or in the current directory when reading stdin)")
    p.add_argument("--max-ratio", type=float, default=DEFAULT_MAX_RATIO,
                   help="slowdown (engine/torch) over which a benchmark record is a "
                        "regression (default %(default)s, ModelTester's max_slowdown_ratio)")
    p.add_argument("--min-time-ms", type=float, default=DEFAULT_MIN_TIME_MS,
                   help="ignore the ratio of phases where torch takes less (default "
                        "%(default)s ms, ModelTester's bench_min_time_ms)")
    p.add_argument("--top", type=int, default=10,
                   help="how many worst ratios to list per phase (default %(default)s)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--plot", metavar="PNG", help="draw the per-operator ratios (matplotlib)")
    p.add_argument("--color", choices=("auto", "yes", "no"), default="auto",
                   help="colours and emojis: auto (a terminal without NO_COLOR), yes, no")
    p.add_argument("-v", "--verbose", action="store_true", help="full failure messages")
    return p


def main(argv: list[str] | None = None, prog: str | None = None) -> int:
    """The command line (``python -m aidge_interop.analyze --help``); returns
    the exit status: 0, or 2 for unusable input."""
    parser = _parser(prog)
    args = parser.parse_args(argv)
    if args.top < 1:
        parser.error("--top must be at least 1")
    if args.results == "-":
        if sys.stdin.isatty():
            parser.error("no input: give a saved pytest output, or pipe pytest into this "
                         "command (pytest -v 2>&1 | python -m aidge_interop.analyze)")
        text, source, beside = sys.stdin.read(), "<stdin>", Path.cwd()
    else:
        path = Path(args.results)
        if not path.is_file():
            parser.error(f"results file {str(path)!r} does not exist")
        text = path.read_text(encoding="utf-8", errors="replace")
        source, beside = str(path), path.parent
    bench_path = Path(args.bench) if args.bench else beside / "benchmarks.jsonl"
    if args.bench and not bench_path.is_file():
        parser.error(f"benchmark log {str(bench_path)!r} does not exist")
    try:
        records = load_benchmarks(bench_path) if bench_path.is_file() else None
    except (ValueError, OSError) as exc:
        parser.exit(2, f"{parser.prog}: error: {exc}\n")

    run = parse_pytest_output(text)
    report = build_report(run, records, top=args.top, max_ratio=args.max_ratio,
                          min_time_ms=args.min_time_ms, source=source,
                          bench_source=str(bench_path))
    if args.json:
        json.dump(report, sys.stdout, indent=2, ensure_ascii=False)
        sys.stdout.write("\n")
    else:
        color = _use_color(args.color, sys.stdout)
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        sys.stdout.write(render_text(report, color=color, verbose=args.verbose, width=width))
    if args.plot:
        if report["benchmarks"] is None:
            parser.exit(2, f"{parser.prog}: error: --plot: no benchmark log at {bench_path}\n")
        try:
            plot_ratios(report["benchmarks"], args.plot)
        except (RuntimeError, ValueError) as exc:
            parser.exit(2, f"{parser.prog}: error: {exc}\n")
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
