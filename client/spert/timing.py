"""Time as the board would take it: the cost of each call, and a clock that keeps the
emulator's wall time in step with the model.

Cost model (board seconds, before the time scale):

- link: ``bytes / rate`` (host to board or back) plus ``call_us`` per call;
- training: per pattern ``connections / train_mcups + hidden_units * unit_ns +
  pattern_us``. With one hidden layer of H units, I inputs and O outputs that is Quicknet's
  ``c1 * H + c2`` with ``c1 = (I + O + 1) / R + unit_ns`` and ``c2 = O / R + pattern_us``
  (R the raw training rate);
- forward passes: the same with ``forward_mcps`` in place of the training rate.

Calls are asynchronous, as on the real board: a call does its (real) work at once and
the board is then busy until the modelled end; ``wait`` and reads sleep until the board
is done. A call issued while the board is busy starts when it is free; one issued within
``SLACK_SECONDS`` of that is taken as back to back, so the emulator's own sleep jitter
does not add up over a run. When the real computation takes longer than the model
allows, or the emulator wakes up late from a wait, the call ends late and is counted as
*behind the model*.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from snet.protocol.network import NetworkSpec

from .config import BoardConfig

SLACK_SECONDS = 0.002


@dataclass(frozen=True)
class CostModel:
    """Board seconds per byte moved and per pattern computed, for one network."""

    config: BoardConfig
    connections: int
    hidden_units: int

    @classmethod
    def for_network(cls, config: BoardConfig, spec: NetworkSpec) -> CostModel:
        return cls(config, spec.connections, sum(spec.sizes[1:-1]))

    def to_board(self, nbytes: int) -> float:
        return nbytes / (self.config.host_to_board_mb_s * 1e6) + self.config.call_us * 1e-6

    def to_host(self, nbytes: int) -> float:
        return nbytes / (self.config.board_to_host_mb_s * 1e6) + self.config.call_us * 1e-6

    def _per_pattern(self, rate: float) -> float:
        c = self.config
        return (
            self.connections / (rate * 1e6)
            + self.hidden_units * c.unit_ns * 1e-9
            + c.pattern_us * 1e-6
        )

    def train(self, patterns: int) -> float:
        return patterns * self._per_pattern(self.config.train_mcups) + self.config.call_us * 1e-6

    def forward(self, patterns: int) -> float:
        return patterns * self._per_pattern(self.config.forward_mcps) + self.config.call_us * 1e-6


@dataclass
class ClockTotals:
    """Modelled board seconds by kind, the real seconds spent computing, and lateness."""

    link_seconds: float = 0.0
    compute_seconds: float = 0.0
    real_seconds: float = 0.0
    behind_count: int = 0
    behind_seconds: float = 0.0  # wall seconds by which calls ended after the model's end
    calls: int = 0

    @property
    def busy_seconds(self) -> float:
        return self.link_seconds + self.compute_seconds


class BoardClock:
    """Charges each call its modelled time and sleeps until wall time matches it."""

    def __init__(
        self,
        time_scale: float,
        clock: Callable[[], float] = time.perf_counter,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.time_scale = time_scale
        self._clock = clock
        self._sleep = sleep
        self.busy_until = clock()
        self.totals = ClockTotals()

    def start(self) -> tuple[float, float]:
        """Mark the issue of a call: (wall time the board starts it, real start)."""
        issued = self._clock()
        if issued - self.busy_until > SLACK_SECONDS:
            return issued, issued  # the board sat idle: it starts now
        return self.busy_until, issued  # busy, or free just now: back to back

    def finish(self, started: tuple[float, float], board_seconds: float, kind: str) -> None:
        """Charge a call that started at ``started`` (from ``start``) and has done its
        real work: the board is busy until the modelled end, or later if real work was."""
        self.finish_parts(started, [(board_seconds, kind)])

    def finish_parts(self, started: tuple[float, float], parts: list[tuple[float, str]]) -> None:
        """``finish`` for a call of several parts back to back ((board seconds, "link" or
        "compute") each), whose real work is held against their sum."""
        board_start, real_start = started
        now = self._clock()
        totals = self.totals
        totals.calls += 1
        totals.real_seconds += now - real_start
        for board_seconds, kind in parts:
            if kind == "link":
                totals.link_seconds += board_seconds
            else:
                totals.compute_seconds += board_seconds
        end = board_start + sum(seconds for seconds, _ in parts) / self.time_scale
        if now > end + SLACK_SECONDS:
            totals.behind_count += 1
            totals.behind_seconds += now - end
            end = now
        self.busy_until = end

    def wait(self) -> None:
        """Sleep until the board has finished everything issued so far.

        Waking up late (a busy machine did not run this process in time) is the
        emulator falling behind too: it is counted, and the board is free from then."""
        remaining = self.busy_until - self._clock()
        if remaining <= 0:
            return
        self._sleep(remaining)
        late = self._clock() - self.busy_until
        if late > SLACK_SECONDS:
            self.totals.behind_count += 1
            self.totals.behind_seconds += late
            self.busy_until += late
