"""What the benchmarks' command lines share (time_to_accuracy, update_cost, bmuf_speed,
scaling, chaos, checkpoint_cost): values checked when they are parsed, so that a
bad one is argparse's one line and exit 2 before anything runs (not a traceback after a
server and workers have started, nor figures lost to a ``--json`` path that cannot be
written once a run of minutes is done), and results printed before they are written."""

from __future__ import annotations

import argparse
import compileall
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
    archive COMMIT | tar -x -C DIR``), whose processes import ``snet`` from ``DIR/src``;
    its modules are byte-compiled (``compiled``)."""
    path = Path(text)
    if not (path / "src" / "snet").is_dir():
        raise argparse.ArgumentTypeError(f"no checkout at {text} (no src/snet)")
    compiled(path / "src" / "snet")
    return path


def compiled(package: Path) -> None:
    """Write the bytecode of ``package`` (snet's, through its links to the top-level
    folders) where Python would have. With PYTHONDONTWRITEBYTECODE set (as on the
    machine of docs/time-to-accuracy.md, session 24) no import writes it: every process of
    a fresh checkout compiled each of its modules at start, 0.1-0.15 s of CPU a process,
    and so did this one for each module changed since its bytecode was last written: a
    start-up cost that made a baseline's runs slower than this code's by about 0.1 of
    the speed ratio, whatever the code did. Both sides are compiled before they are
    timed."""
    for part in sorted(package.iterdir()):
        folder = part.resolve()
        if folder.is_dir():
            compileall.compile_dir(folder, quiet=1)
        elif part.suffix == ".py":
            compileall.compile_file(part, quiet=1)


def emit(text: str, path: Path | None) -> None:
    """Print ``text`` (the results), then write it to ``path`` if given: a write that
    fails (a full disk) loses nothing the run printed."""
    print(text, flush=True)
    if path is not None:
        path.write_text(text + "\n")
