"""A process's output scanned for tracebacks: a "Traceback (most recent call last)" or
"Task exception was never retrieved" fails the test with the excerpt a reader needs, unless
the test said it expects one. helpers.py scans everything it starts with these, the
in-process ring (inprocess.py) its servers' and workers' logs."""

from __future__ import annotations

from pathlib import Path

TRACEBACK_MARKS = ("Traceback (most recent call last)", "Task exception was never retrieved")
EXCERPT_LINES = 40


def traceback_excerpt(text: str) -> str:
    """The lines around the first traceback in ``text`` (what a reader needs to see)."""
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if any(m in line for m in TRACEBACK_MARKS))
    start = max(first - 3, 0)
    return "\n".join(lines[start : first + EXCERPT_LINES])


def check_output(name: str, text: str, expected: str | None = None) -> None:
    """Fail if ``text`` (a process's output) holds a traceback, unless ``expected`` (why)."""
    if expected is None and any(mark in text for mark in TRACEBACK_MARKS):
        raise AssertionError(f"traceback in the output of {name}:\n{traceback_excerpt(text)}")


def check_log_files(directory: Path, pattern: str = "*.log") -> None:
    """Scan the logs under ``directory`` that processes started outside helpers.py
    (bench/'s ``LocalCluster``) left."""
    for log in sorted(directory.rglob(pattern)):
        check_output(str(log), log.read_text(errors="replace"))
