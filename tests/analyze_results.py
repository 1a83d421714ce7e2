"""The results analyser where the harness documentation runs it from::

    pytest test_operators.py -v 2>&1 | tee results.txt
    python analyze_results.py results.txt [--bench benchmarks.jsonl]
    pytest test_operators.py -v 2>&1 | python analyze_results.py

A thin wrapper: everything lives in :mod:`aidge_interop.testing.analyze` (also
``python -m aidge_interop.analyze``), including :func:`categorize`.
"""
import sys

from aidge_interop.testing.analyze import categorize, main

__all__ = ["categorize", "main"]

if __name__ == "__main__":
    sys.exit(main(prog="analyze_results.py"))
