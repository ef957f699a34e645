"""What a peer sends is checked for plausibility, not only for finiteness (issue 12).

A single update with values of 1e30 was applied (weights 0.107 -> 1.56e27); an update with
one byte changed (a value near 2^43) was applied; zero gradients "completed" a job in half a
second; accuracy counts of 7.8e15 and a NaN loss reached /status. So:

- ``NormBounds``: each update's gradient norm per pattern must stay below a factor of the
  running (geometric) mean of the updates accepted so far, as DGC bounds its gradients by
  their running norm; before that mean settles, below an absolute sanity bound. Once
  three workers or more have settled their own running norms of a kind, the median
  worker's mean and spread judge instead, each worker one vote: with every accepted
  update feeding the mean it is judged against, a peer that grew its norms after each
  one taken dragged it up without end (``_others``). The
  factor widens with the spread the accepted norms have shown (``SPREAD_SIGMAS`` of their
  log's running standard deviation, when that is more than ``NORM_FACTOR``): the norm of
  a bunch of one or two patterns spans orders of magnitude once the network has learned
  (a trained default job's single-pattern norms: log standard deviation 3.4, 7.8 % of
  them beyond 100x their geometric mean, where a bunch of 64's spread is 0.3), and a
  fixed factor refused honest misclassified patterns again each time their frames came
  back: bunch 1 or 2 never finished. It widens to ``MAX_FACTOR`` at most: the spread is
  learned from what is accepted, so updates sent just under the bound would otherwise
  widen it without end (a value of 2^43 or 1e30 is still far beyond). An
  update with a zero, NaN or infinite norm is refused too. A small update is not: a bunch
  the network already classifies with confidence has a tiny honest gradient (8-worker
  runs of 16-pattern bunches on Fashion-MNIST sent some 1e4 times below the mean, which
  an earlier lower bound refused), and a small step cannot harm the weights. The mean is
  kept per kind of update (plain gradients, or those that carry their worker's momentum)
  and per codec, whose norms differ. A kind whose own mean has not settled yet is held
  to the settled means of the others (the most lenient of them, with its spread-widened
  factor), not only to the absolute bound: a new connection in another codec sent updates
  of 1e4 per pattern, 100x and more the plain mean, and was taken 3 times of 3 (weights
  from 0.099 to 114). Updates that carry their worker's momentum may be up to
  1/(1 - momentum) larger than plain ones (the default job's topk: 7.5 to 9.3x the plain
  mean at momentum 0.9), so against a plain mean they get that much more; plain ones
  against a momentum-carrying mean get nothing more. Only while no kind has settled does
  the absolute bound stand alone. It runs in the step thread (server/stepping.py): one
  BLAS dot per update.

The figures a peer reports with an update, a CV result or a report: server/reported.py.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Hashable
from typing import Any, NamedTuple

import numpy as np

NORM_FACTOR = 100.0  # accepted: within this factor of the running mean norm per pattern
SPREAD_SIGMAS = 5.0  # or within this many running standard deviations of its log, if wider
# but never wider than this: every accepted update feeds the spread, so a worker sending
# updates just under the bound could double it with each (100x -> 1e22x in 7 updates)
MAX_FACTOR = 1e6
ABSOLUTE_NORM = 1e6  # per pattern, while the running mean settles (or has no history)
SETTLE_UPDATES = 8  # accepted updates of a kind before its running mean is trusted
MEAN_WEIGHT = 0.05  # of the newest accepted update in the running mean of log norms
TRACKED_WORKERS = 256  # workers whose own running norms are kept, by kind
JUDGES = 3  # settled workers of a kind from which the median worker's norms judge
JUDGE_EVERY = 8  # accepted updates of a kind between two reckonings of the median worker
MAX_KINDS = 32  # kinds whose norms are kept (a peer chooses its codec, each a kind)
RESTORED_UPDATES = 200  # accepted updates of a kind a checkpoint's median worker judges


class NormBounds:
    """Running norms of accepted updates, by kind; says which new ones are implausible.

    A kind is a hashable; a tuple whose first item is true (``PendingUpdate.kind``:
    ``(momentum_corrected, codec)``) carries its worker's momentum, ``momentum`` being the
    job's (the widening it gets against plain kinds' means)."""

    def __init__(self, factor: float = NORM_FACTOR, momentum: float = 0.0) -> None:
        self.factor = factor
        self.momentum_factor = 1.0 / (1.0 - min(max(momentum, 0.0), 0.999999))
        self._log_mean: dict[Hashable, float] = {}
        self._log_square: dict[Hashable, float] = {}  # running mean of the log's square
        self._seen: dict[Hashable, int] = {}
        # by kind, each worker's own (log mean, log square, seen): the others' judge it
        self._by_worker: dict[Hashable, dict[int, tuple[float, float, int]]] = {}
        # by kind, the median worker's (log mean, allowed) as of the kind's nth update
        self._judged: dict[Hashable, tuple[int, tuple[float, float] | None]] = {}
        # by kind, the median worker's as checkpointed: it judges until JUDGES settle again
        self._restored: dict[Hashable, tuple[float, float, int]] = {}  # and the seen then
        self._gone: deque[int] = deque()  # workers that left (the loop's; the step's to drop)
        # the last TRACKED_WORKERS that left: an update of one still queued is judged, but
        # makes it no row again (it came back with a fresh running mean, and 8 such would
        # have given it a vote again: a probe)
        self._departed: dict[int, None] = {}  # (an ordered set, oldest first)

    def forget(self, worker: int) -> None:
        """``worker`` left: its running norms vote no more (a peer that came back under a
        new id kept a vote per connection: 600 of 600 honest updates refused, a review's
        simulation). Called on the event loop; taken up by the next ``problem``."""
        self._gone.append(worker)

    def _allowed(self, kind: Hashable) -> float:
        """How far above the running mean, in log, an update of ``kind`` may be."""
        mean = self._log_mean[kind]
        return self._factor(math.sqrt(max(self._log_square[kind] - mean * mean, 0.0)))

    def _factor(self, spread: float) -> float:
        """The log factor allowed above a mean whose log norms spread this much."""
        return min(max(math.log(self.factor), SPREAD_SIGMAS * spread), math.log(MAX_FACTOR))

    def _borrowed(self, kind: Hashable, strictest: bool = False) -> tuple[float, Hashable] | None:
        """The log of the largest norm the settled other kinds allow ``kind``, and which
        kind: the most lenient (for a kind not yet settled), or the ``strictest`` (for a
        settled kind of few workers); None while no other kind has settled."""
        limits = [
            (self._log_mean[other] + self._allowed(other) + self._widening(kind, other), other)
            for other, seen in self._seen.items()
            if other != kind and seen >= SETTLE_UPDATES
        ]
        if not limits:
            return None
        return (min if strictest else max)(limits, key=lambda limit: limit[0])

    def _widening(self, kind: Hashable, other: Hashable) -> float:
        """The log of how much larger than ``other``'s an honest norm of ``kind`` may be."""
        if _carries_momentum(kind) and not _carries_momentum(other):
            return math.log(self.momentum_factor)
        return 0.0

    def problem(
        self, kind: Hashable, gradient: np.ndarray, patterns: int, worker: int | None = None
    ) -> str:
        """Why this update is implausible ("" if it is not). Accepted ones join the mean;
        ``worker``'s are judged against the other workers' (``_others``) once one has
        settled."""
        while self._gone:
            gone = self._gone.popleft()
            self._departed[gone] = None
            if len(self._departed) > TRACKED_WORKERS:
                del self._departed[next(iter(self._departed))]
            for rows in self._by_worker.values():
                rows.pop(gone, None)
            self._judged.clear()
        with np.errstate(over="ignore", invalid="ignore"):
            square = float(np.dot(gradient, gradient))
        if not math.isfinite(square):  # the rare path: a second look tells which
            if not np.isfinite(gradient).all():
                return "update contains NaN or infinite values"
            largest = float(np.abs(gradient).max())
            return f"update norm overflows float32 (values up to {largest:.3g}): implausible"
        per_pattern = math.sqrt(square) / max(patterns, 1)
        if per_pattern == 0.0:
            return "update is all zeros: no training happened"
        seen = self._seen.get(kind, 0)
        log_norm = math.log(per_pattern)
        if per_pattern > ABSOLUTE_NORM:  # always: a peer alone before the others settled
            # fed the mean it was judged by up to 1.4e17 per pattern (a probe)
            return f"update norm {per_pattern:.3g} per pattern is beyond {ABSOLUTE_NORM:g}"
        judge = self._judge(kind, worker)
        if judge is not None and log_norm > judge.mean + judge.allowed:
            mean, factor = math.exp(judge.mean), math.exp(judge.allowed)
            if judge.settling:
                return (
                    f"update norm {per_pattern:.3g} per pattern is implausible: few updates of "
                    f"its kind yet, and those of {judge.whose} have a running mean of "
                    f"{mean:.3g} (at most {factor:.3g}x that)"
                )
            return (
                f"update norm {per_pattern:.3g} per pattern is implausible: {judge.whose} "
                f"running mean is {mean:.3g} (at most {factor:.3g}x that)"
            )
        if kind not in self._seen and len(self._seen) >= MAX_KINDS:  # a peer chooses its
            least = min(self._seen, key=self._seen.__getitem__)  # codec, and so a new kind
            for table in (self._log_mean, self._log_square, self._seen, self._by_worker,
                          self._judged, self._restored):  # fmt: skip
                table.pop(least, None)
        start = (log_norm, log_norm * log_norm, 0)  # both begin together
        previous = (self._log_mean.get(kind, start[0]), self._log_square.get(kind, start[1]))
        self._log_mean[kind], self._log_square[kind], self._seen[kind] = _fed(
            (*previous, seen), log_norm
        )
        if worker is not None and worker not in self._departed:
            self._learn(kind, worker, log_norm)
        return ""

    def _learn(self, kind: Hashable, worker: int, log_norm: float) -> None:
        """``worker``'s own running mean and square of ``kind`` (the most recent
        ``TRACKED_WORKERS`` workers' are kept)."""
        workers = self._by_worker.setdefault(kind, {})
        start = (log_norm, log_norm * log_norm, 0)
        workers[worker] = _fed(workers.pop(worker, start), log_norm)  # moved to the end
        if len(workers) > TRACKED_WORKERS:
            del workers[next(iter(workers))]  # the one heard from longest ago

    def _judge(self, kind: Hashable, worker: int | None, store: bool = True) -> _Judge | None:
        """What an update of ``kind`` from ``worker`` is held to beyond the absolute bound
        (None: nothing else). Before its kind settles, the most lenient settled kind's
        bound; then the median worker's (``_others``), or the running mean of every update
        taken, and a kind of few workers (a codec of its own, which a peer chooses) the
        strictest other kind's too: else its own mean, which it feeds, judged it.
        ``store``: the median worker reckoned now is kept for the next ones (/status's
        view keeps nothing: what it showed changed what was taken, a review)."""
        if self._seen.get(kind, 0) < SETTLE_UPDATES:
            borrowed = self._borrowed(kind)
            if borrowed is None:
                return None
            mean, other = self._log_mean[borrowed[1]], borrowed[1]
            by = f"settling: {_kind_name(other)}'s bound"
            return _Judge(mean, borrowed[0] - mean, f"kind {other}", by, settling=True)
        others = self._others(kind, worker, store)
        if others is not None:
            return _Judge(*others, "the median worker's accepted updates'", "median worker")
        mean, allowed = self._log_mean[kind], self._allowed(kind)
        strictest = self._borrowed(kind, strictest=True)
        if strictest is not None and strictest[0] < mean + allowed:
            mean, other = self._log_mean[strictest[1]], strictest[1]
            return _Judge(
                mean, strictest[0] - mean, f"kind {other}'s", f"{_kind_name(other)}'s bound"
            )
        return _Judge(mean, allowed, "the accepted updates'", "running mean")

    def _others(
        self, kind: Hashable, worker: int | None, store: bool = True
    ) -> tuple[float, float] | None:
        """The log mean and allowed log factor of ``kind`` as the median worker has them,
        once ``JUDGES`` workers or more have settled: a worker's own accepted updates fed
        the mean and spread it was judged against, so one that grew its norms by half
        after each taken dragged both up, to 1e8 times the others' (a probe); and one
        that sent tiny steady ones, which are taken, must not hold the others to its
        norm either (292 of 300 honest updates refused, in a review's simulation of the
        others' median alone). Each worker one vote: one of three or more can neither
        raise its bound nor lower another's. None: fewer have settled (of two workers,
        norms alone cannot tell which is right: the running mean of all judges)."""
        if worker is None:
            return None
        seen = self._seen.get(kind, 0)
        cached = None if self._gone else self._judged.get(kind)  # (a vote ended: again)
        if cached is not None and seen - cached[0] < JUDGE_EVERY:  # medians move slowly: a
            return cached[1]  # pass over 256 workers' rows cost 61 us, more than the dot
        rows = [r for w, r in self._by_worker.get(kind, {}).items()
                if r[2] >= SETTLE_UPDATES and w not in self._gone]  # fmt: skip
        restored = self._restored.get(kind)  # until JUDGES settle after a restart (the
        # restored mean, which every update fed, would judge), for a while: not for good
        judged = restored[:2] if restored and seen - restored[2] < RESTORED_UPDATES else None
        if len(rows) >= JUDGES:
            mean = statistics.median(r[0] for r in rows)
            spread = statistics.median(math.sqrt(max(r[1] - r[0] * r[0], 0.0)) for r in rows)
            judged = mean, self._factor(spread)
        if store:
            self._judged[kind] = (seen, judged)
        return judged

    def checkpoint_state(self) -> list[dict[str, Any]]:
        """The running means, a row per kind (a kind is a tuple of plain values); only
        between steps (the step thread updates them)."""
        return [
            {
                "kind": list(_as_tuple(kind)),
                "log_mean": mean,
                "seen": self._seen[kind],
                "log_square": self._log_square[kind],
                "median_worker": (self._judged.get(kind) or (0, None))[1],
            }
            for kind, mean in self._log_mean.items()
        ]

    def restore_checkpoint(self, rows: list[Any]) -> None:
        """Continue from ``checkpoint_state()``: a restarted server keeps judging updates
        against the norms it had learned, not from scratch. A checkpoint written before
        the spread was kept has ``[kind..., log mean, seen]`` rows: no spread known yet."""
        self._log_mean, self._log_square, self._seen = {}, {}, {}
        for row in rows:
            if isinstance(row, dict):
                parts, mean, seen = row["kind"], row["log_mean"], row["seen"]
                square = float(row["log_square"])
            else:
                *parts, mean, seen = row
                square = float(mean) ** 2
            kind = tuple(parts) if len(parts) > 1 else parts[0]
            self._log_mean[kind], self._seen[kind] = float(mean), int(seen)
            self._log_square[kind] = square
            judged = row.get("median_worker") if isinstance(row, dict) else None
            if judged:
                self._restored[kind] = (float(judged[0]), float(judged[1]), int(seen))

    def view(self) -> tuple[list[dict[str, Any]], dict[int, float]]:
        """For /status, only between passes (a pass updates these tables), changing
        nothing: a row per kind (its updates taken, running mean norm per pattern, the
        largest it takes now from a worker and what sets it, as ``problem`` judges) and
        each tracked worker's own mean norm per pattern (of its kind with the most
        updates), so that a worker far from the others shows."""
        kinds = []
        for kind, log_mean in self._log_mean.items():
            judge = self._judge(kind, -1, store=False)  # (None: the absolute bound alone)
            largest = ABSOLUTE_NORM if judge is None else _exp(judge.mean + judge.allowed)
            kinds.append({
                "kind": _kind_name(kind), "updates": self._seen[kind],
                "judged_by": "settling" if judge is None else judge.by,
                "norm_per_pattern": _shown(_exp(log_mean)),
                "largest_per_pattern": _shown(min(largest, ABSOLUTE_NORM)),
            })  # fmt: skip
        workers: dict[int, tuple[int, float]] = {}
        for rows in self._by_worker.values():
            for worker, (log_mean, _, seen) in rows.items():
                if seen >= workers.get(worker, (-1, 0.0))[0]:  # (one gone too: its last)
                    workers[worker] = (seen, log_mean)
        return kinds, {w: _shown(_exp(mean)) for w, (_, mean) in workers.items()}


class _Judge(NamedTuple):  # (a tuple: one is made for every update checked)
    """What an update is held to (``NormBounds._judge``): log mean, allowed log factor
    above it, whose running mean it is (as a refusal says it), and what sets it (as
    /status says it: "median worker", "running mean", "KIND's bound", "settling: ...")."""

    mean: float
    allowed: float
    whose: str
    by: str
    settling: bool = False  # its kind is held to another kind's until its own settles


def _exp(value: float) -> float:
    """``math.exp`` that cannot overflow (a restored mean is whatever a checkpoint held)."""
    return math.exp(min(value, 700.0))


def _kind_name(kind: Hashable) -> str:
    """A kind as /status names it: its codec, and whether it carries the worker's
    momentum (``PendingUpdate.kind``); any other kind as it prints."""
    parts = _as_tuple(kind)
    if len(parts) == 2 and isinstance(parts[0], bool) and isinstance(parts[1], str):
        return parts[1] + (" (momentum carried)" if parts[0] else "")
    return str(kind)


def _shown(value: float) -> float:
    """Four significant digits: a norm's figure to read, not to compute with."""
    return float(f"{value:.4g}")


def _fed(running: tuple[float, float, int], log_norm: float) -> tuple[float, float, int]:
    """A running (mean, mean square, count) of log norms with ``log_norm`` learnt: a plain
    mean while few are seen, then each new one weighs ``MEAN_WEIGHT``."""
    mean, square, seen = running
    weight = max(MEAN_WEIGHT, 1.0 / (seen + 1))
    return ((1 - weight) * mean + weight * log_norm,
            (1 - weight) * square + weight * log_norm * log_norm, seen + 1)  # fmt: skip


def _carries_momentum(kind: Hashable) -> bool:
    return isinstance(kind, tuple) and bool(kind) and kind[0] is True


def _as_tuple(kind: Hashable) -> tuple[Any, ...]:
    return kind if isinstance(kind, tuple) else (kind,)
