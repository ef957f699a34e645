"""A progress bar for ``snet train`` and ``snet demo``, on a terminal only.

On a terminal one line is redrawn in place (carriage return, erase to the end of the
line): the bar, the fraction of the job done, the epoch, the rate and the time left.
Anything else (a pipe, a file, a log collector, ``TERM=dumb``) gets no bar and no escape
code at all: the commands' plain lines (one per epoch) are the whole output there.
``BarHook`` feeds the bar from sequential training's hooks (``snet train``); the demo
draws the server's own figures (server/job_progress.py).
"""

from __future__ import annotations

import os
import sys
import time
from typing import IO

from snet.protocol.hooks import BunchEvent, Hook, RunInfo
from snet.protocol.numbering import shown_epoch

BAR_WIDTH = 24
REDRAW_SECONDS = 0.1  # a terminal need not be redrawn more often than this
EXIT_READER_GONE = 141  # 128 + SIGPIPE: what a shell shows for a writer that SIGPIPE ended
EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell shows for a command Ctrl-C ended


def say(text: str) -> None:
    """``text`` on stderr, unless stderr is gone too (``2>&1 | head``: the same dead pipe,
    where a line about the stop must not stop the stop)."""
    try:
        print(text, file=sys.stderr, flush=True)
    except OSError:  # a dead pipe, or a terminal hung up (EIO): closed with its session
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stderr.fileno())
        os.close(devnull)


def detach_stdout() -> None:
    """The reader of standard output has gone (``snet train | head``): what is still
    printed goes nowhere, so that neither the next print nor the interpreter's flush at
    exit fails again (Python ignores SIGPIPE and raises BrokenPipeError instead)."""
    try:
        stdout = sys.stdout.fileno()
    except (OSError, ValueError):  # not a file (a capture): nothing to detach
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, stdout)
    os.close(devnull)


def on_terminal(stream: IO[str]) -> bool:
    """Whether ``stream`` is a terminal that understands a redrawn line."""
    return stream.isatty() and os.environ.get("TERM", "") != "dumb"


def clock(seconds: float) -> str:
    """``seconds`` as H:MM:SS, or M:SS under an hour."""
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def bar_text(
    fraction: float,
    epoch: int,
    epochs: int,
    frames_per_second: float | None,
    eta_seconds: float | None,
) -> str:
    """One line: ``[#####.....]  42.0%  epoch 3/10  1,234 frames/s  ETA 0:42``
    (``epoch`` as the reader counts it, from 1)."""
    fraction = min(max(fraction, 0.0), 1.0)
    filled = int(fraction * BAR_WIDTH)
    parts = [
        f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {100 * fraction:5.1f}%",
        f"epoch {min(epoch, epochs)}/{epochs}",
    ]
    if frames_per_second is not None:
        parts.append(f"{frames_per_second:,.0f} frames/s")
    if eta_seconds is not None:
        parts.append(f"ETA {clock(eta_seconds)}")
    return "  ".join(parts)


class ProgressBar:
    """One redrawn line on a terminal; nothing at all elsewhere."""

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.enabled = on_terminal(stream)
        self._shown = False
        self._drawn_at = 0.0

    def draw(self, text: str, force: bool = False) -> None:
        """Show ``text`` in place of the bar's last line (at most every ``REDRAW_SECONDS``)."""
        now = time.monotonic()
        if not self.enabled or (not force and now - self._drawn_at < REDRAW_SECONDS):
            return
        self.stream.write(f"\r{text}\x1b[K")
        self.stream.flush()
        self._shown, self._drawn_at = True, now

    def clear(self) -> None:
        """Erase the bar (before a plain line is printed, and at the end)."""
        if self._shown:
            self.stream.write("\r\x1b[K")
            self.stream.flush()
            self._shown = False

    def print(self, line: str) -> None:
        """Print a plain line above the bar."""
        self.clear()
        print(line, file=self.stream, flush=True)
        self._drawn_at = 0.0  # redraw the bar at the next chance


class BarHook(Hook):
    """Draws sequential training's progress from its ``after_bunch`` events."""

    name = "progress_bar"

    def __init__(self, bar: ProgressBar) -> None:
        self.bar = bar
        self.planned = 0
        self.epochs = 0
        self.done = 0
        self.started = time.monotonic()

    def before_training(self, info: RunInfo) -> None:
        self.planned, self.epochs = info.train_frames * info.epochs, info.epochs
        self.started = time.monotonic()

    def after_bunch(self, event: BunchEvent) -> None:
        self.done += event.patterns
        elapsed = time.monotonic() - self.started
        rate = self.done / elapsed if elapsed > 0 else None
        eta = (self.planned - self.done) / rate if rate else None
        fraction = self.done / self.planned if self.planned else 0.0
        self.bar.draw(bar_text(fraction, shown_epoch(event.epoch), self.epochs, rate, eta))
