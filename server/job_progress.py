"""``ProgressMeter``: how much of the job is done, how fast it goes and when it will end.

/status, /metrics, the dashboard, ``snet status`` and the demo's bar read the same figures:
the fraction of the job's planned training frames applied (whole epochs trained plus the
current epoch's frames), the rate in frames per second over the last ``WINDOW_SECONDS``
(sampled by the server every second, and at every read), and the time left at that rate.
The ETA covers training only: the last CV scoring and a test file come on top, and newbob
may stop before the planned epochs, so it is an upper bound for the training itself.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .training import Coordinator

WINDOW_SECONDS = 30.0  # the rate is measured over this long: recent, but not jumpy
MIN_SPAN_SECONDS = 1.0  # a rate from less than this is not given
SAMPLE_SECONDS = 0.5  # samples closer together than this are not kept


@dataclass
class ProgressMeter:
    """Samples of (monotonic time, patterns applied), and the figures made of them."""

    samples: deque[tuple[float, int]] = field(default_factory=deque)

    def sample(self, now: float, patterns: int) -> None:
        """Note the patterns applied so far at ``now`` (monotonic seconds)."""
        if self.samples and now - self.samples[-1][0] < SAMPLE_SECONDS:
            return
        if self.samples and patterns < self.samples[-1][1]:
            self.samples.clear()  # the count went back (a restore): start measuring anew
        self.samples.append((now, patterns))
        while len(self.samples) > 2 and now - self.samples[1][0] >= WINDOW_SECONDS:
            self.samples.popleft()

    def rate(self) -> float | None:
        """Frames per second over the window; None before it spans ``MIN_SPAN_SECONDS``."""
        if len(self.samples) < 2:
            return None
        (first, start), (last, end) = self.samples[0], self.samples[-1]
        if last - first < MIN_SPAN_SECONDS:
            return None
        return (end - start) / (last - first)

    def figures(self, coordinator: Coordinator, now: float) -> dict[str, Any]:
        """The ``progress`` part of /status."""
        stats = coordinator.stats
        self.sample(now, stats.patterns_applied)
        per_epoch = len(coordinator.plan.train_frames)
        planned = per_epoch * stats.epochs_planned
        current = stats.epochs[-1] if stats.epochs else None
        in_epoch = current.train_patterns if current is not None and current.ended is None else 0
        done = min(stats.epochs_done * per_epoch + in_epoch, planned)
        finished = coordinator.finished.is_set()
        rate = 0.0 if finished else self.rate()  # trained: none applied any more
        if finished:
            eta: float | None = 0.0
        elif rate:
            eta = round((planned - done) / rate, 1)
        else:
            eta = None
        return {
            "fraction": 1.0 if finished else round(done / planned, 4) if planned else 0.0,
            "epoch_fraction": round(in_epoch / per_epoch, 4) if per_epoch else 0.0,
            "frames_done": planned if finished else done,
            "frames_planned": planned,
            "frames_per_second": None if rate is None else round(rate, 1),
            "eta_seconds": eta,
        }
