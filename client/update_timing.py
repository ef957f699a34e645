"""``UpdateTiming``: what each update costs this worker, for /status and ``snet bench``.

Three figures per update, beside each other so that the cost of crossing the wire can be
read against the bunch's own arithmetic:

- the compute thread's CPU time for the update (its own clock: time spent waiting for a
  core on a shared machine is left out; small bunches are computed on the event loop's
  thread instead, ``transport/inline.py``, and counted here, not in the loop's figure);
- the event loop's CPU time per update: encoding and sending the update, receiving the
  weights and taking them over, leases, reports (everything but the arithmetic);
- the latency from sending an update to the start of the first bunch computed on weights
  that include it. The server's ``settled`` count in each ``Weights`` says how many of
  this connection's updates those weights include (applied or refused), so the update
  numbered ``n`` is in once a bunch starts on weights with ``settled >= n``. Not with
  bmuf's overlapping blocks, whose weights are taken at any bunch of a block (client/
  blocks.py): timed at a block's start, it would be overstated by up to a block.

The compute loop (client/worker.py) calls ``computed``, ``sent`` and ``bunch_started``;
``figures`` goes into the worker's report (``per_update`` in /status).
"""

from __future__ import annotations

import statistics
import time
from collections import deque

RECENT = 512  # latencies kept for the median: recent ones, so a slow start fades out


class UpdateTiming:
    """Per-update CPU (compute thread, event loop) and send-to-new-weights latency."""

    def __init__(self) -> None:
        self.updates = 0
        self.compute_cpu = 0.0  # seconds, summed over updates
        self._loop_cpu_at_first: float | None = None  # event loop's thread_time then
        self._loop_cpu_updates = 0  # updates sent since then
        self._loop_compute_cpu = 0.0  # bunches computed on the event loop's thread since
        self._waiting: deque[tuple[int, float]] = deque()  # (number in session, sent at)
        self._recent: deque[float] = deque(maxlen=RECENT)
        self.latency_count = 0
        self.latency_sum = 0.0

    def computed(self, cpu_seconds: float, on_loop: bool = False) -> None:
        """The compute thread (``on_loop``: the event loop's, transport/inline.py) spent
        ``cpu_seconds`` on the update about to be sent."""
        self.compute_cpu += cpu_seconds
        if on_loop and self._loop_cpu_at_first is not None:
            self._loop_compute_cpu += cpu_seconds  # arithmetic, not the loop's own work

    def sent(self, number: int) -> None:
        """The ``number``-th update of this connection was handed to the socket (called
        on the event loop)."""
        now = time.perf_counter()
        self.updates += 1
        if self._loop_cpu_at_first is None:
            self._loop_cpu_at_first = time.thread_time()  # from the first: start-up left out
        else:
            self._loop_cpu_updates += 1
        self._waiting.append((number, now))

    def bunch_started(self, settled: int) -> None:
        """A bunch starts on weights that include this connection's first ``settled``
        updates."""
        if not self._waiting or self._waiting[0][0] > settled:
            return
        now = time.perf_counter()
        while self._waiting and self._waiting[0][0] <= settled:
            _, sent_at = self._waiting.popleft()
            latency = now - sent_at
            self._recent.append(latency)
            self.latency_count += 1
            self.latency_sum += latency

    def new_connection(self) -> None:
        """Update numbers start again at 1: the ones waiting will never be settled."""
        self._waiting.clear()

    def figures(self) -> dict[str, float | int] | None:
        """Milliseconds per update, for the worker's report; None before any update."""
        if not self.updates:
            return None
        figures: dict[str, float | int] = {
            "updates": self.updates,
            "compute_cpu_ms": round(1e3 * self.compute_cpu / self.updates, 4),
        }
        if self._loop_cpu_at_first is not None and self._loop_cpu_updates:
            loop_cpu = time.thread_time() - self._loop_cpu_at_first - self._loop_compute_cpu
            figures["loop_cpu_ms"] = round(1e3 * loop_cpu / self._loop_cpu_updates, 4)
        if self._recent:
            figures["latency_ms"] = round(1e3 * statistics.median(self._recent), 3)
            figures["latency_mean_ms"] = round(1e3 * self.latency_sum / self.latency_count, 3)
        return figures
