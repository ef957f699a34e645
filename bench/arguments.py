"""What the benchmarks' command lines share (time_to_accuracy, update_cost, bmuf_speed,
scaling, chaos, checkpoint_cost): values checked when they are parsed, so that a
bad one is argparse's one line and exit 2 before anything runs (not a traceback after a
server and workers have started, nor figures lost to a ``--json`` path that cannot be
written once a run of minutes is done), and results printed before they are written."""

from __future__ import annotations

import argparse
from pathlib import Path


def positive_int(text: str) -> int:
    """An argparse type: a whole number of at least 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def positive_float(text: str) -> float:
    """An argparse type: a number above 0."""
    value = float(text)
    if not value > 0:  # nan too
        raise argparse.ArgumentTypeError(f"must be above 0, got {text}")
    return value


def output_path(text: str) -> Path:
    """An argparse type: a file to write results to, whose directory exists."""
    path = Path(text)
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{path.parent} is not a directory")
    return path


def checkout(text: str) -> Path:
    """An argparse type: a checkout of earlier code to measure beside this one (``git
    archive COMMIT | tar -x -C DIR``), whose processes import ``snet`` from ``DIR/src``."""
    path = Path(text)
    if not (path / "src" / "snet").is_dir():
        raise argparse.ArgumentTypeError(f"no checkout at {text} (no src/snet)")
    return path


def emit(text: str, path: Path | None) -> None:
    """Print ``text`` (the results), then write it to ``path`` if given: a write that
    fails (a full disk) loses nothing the run printed."""
    print(text, flush=True)
    if path is not None:
        path.write_text(text + "\n")
