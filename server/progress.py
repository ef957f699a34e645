"""``ProgressWatch``: who is delivering, who is late, and by when each worker must deliver.

No step may wait for a particular worker longer than its deadline (SNet v2's asynchronous
mode exists so that a slow machine delays nobody; issue 12). A worker's deadline is
measured, not configured: ``STALL_FACTOR`` times its own mean interval between updates
(after its first update, which includes its start-up, the compute time it reported for
that one, never more than the server saw it take: a worker ten times slower than the
others, an emulated board beside numpy workers, is judged by its own pace from its second
update on; before any, or if it reported none, the median of the others'), never less
than ``stall_seconds``.
Its clock starts when it last delivered an update or, if later, when it was last given
frames while it held none, so waiting for a lease never counts against it.
Where being late costs the worker its connection (sync mode), its first update on a
connection gets ``join_seconds`` more (it may still be loading the data); a worker scoring
a CV set gets the time that takes at the rate the server saw it train at, held to ten
times the others' (``scoring_deadline``: a peer's own claim of its compute time once held
the run for as long as it stayed). Its ``pace`` (its compute time
per pattern, never less than its interval shows) decides who gets an async epoch's last
frames and the CV set. Frames taken back from a late worker (async) leave their start
behind: the update it still sends for them, refused, measures its pace as an applied one
would (before, it measured nothing, so a worker slower than the others' pace had every
lease taken back before its update came).

What the coordinator does with a late worker depends on the mode: in async mode a late
worker is not counted or waited for, and its undelivered frames are taken back once the
others have nothing left to do (``check_progress`` in server/lateness.py); sync mode drops
a worker that misses the round deadline. The arithmetic is here, apart from both, so that it can be
tested with a clock in hand.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass

STALL_FACTOR = 10.0  # a worker is late after this many of its usual intervals
# a worker this many times slower than the quickest (by ``pace``) is far slower: its last
# leases are handed over at an epoch's end (server/lateness.py), and the CV set is not its
# while another can score it (server/evaluations.py)
FAR_SLOWER = 4.0
INTERVAL_WEIGHT = 0.2  # weight of the newest interval in the running mean


def quickest(clocks: Iterable[DeliveryClock]) -> float | None:
    """The least known ``pace`` of ``clocks`` (None: none known)."""
    return min((pace for clock in clocks if (pace := clock.pace)), default=None)


def far_slower(pace: float | None, quickest_pace: float | None) -> bool:
    """A ``pace`` ``FAR_SLOWER`` times the quickest (False when either is unknown)."""
    return bool(pace and quickest_pace and pace > FAR_SLOWER * quickest_pace)


@dataclass
class DeliveryClock:
    """One worker's delivery times (monotonic seconds)."""

    joined_at: float
    work_since: float | None = None  # given frames while it held none (None: holds none)
    last_update_at: float | None = None
    interval: float | None = None  # running mean seconds between its updates
    seconds_per_pattern: float | None = None  # its measured compute time per pattern
    # its first update's compute time, as it reported it but never more than the server saw
    # it take (start-up included): the typical time until an interval is measured
    first_compute: float | None = None
    # when the work it owed was taken back (revoked): the update it still sends for that
    # work, refused, shows its pace all the same
    taken_back_since: float | None = None
    patterns: int = 0  # in its latest update

    @property
    def seen_pace(self) -> float | None:
        """Seconds a pattern takes it as the server saw it, not as it says: between its
        updates, or its first one's time (never more than the server saw it take). A
        scorer that claimed 1000 s of compute once (in an update refused) was given a CV
        deadline of hours, and held it and its leases while the run stood still (a
        probe); what it is seen to take it can stretch too, by sending late, so a
        scoring deadline holds it to the others' as well (``_held_pace``)."""
        if self._between or not (self.first_compute and self.patterns):
            return self._between
        return self.first_compute / self.patterns

    @property
    def pace(self) -> float | None:
        """Seconds a pattern takes it: its reported compute time per pattern, but never
        less than the server sees it take between updates (None before either is known).
        Who gets an epoch's last frames and the CV set follows it (server/lateness.py,
        server/evaluations.py): a peer's own figure alone, a claim of 1e-9 s, had every
        other worker's last leases handed to it."""
        known = [pace for pace in (self.seconds_per_pattern, self._between) if pace]
        return max(known) if known else None

    @property
    def _between(self) -> float | None:
        """Seconds a pattern takes it between its updates (None until measured)."""
        return self.interval / self.patterns if self.interval and self.patterns else None

    @property
    def delivered(self) -> bool:
        """It has delivered at least one update on this connection."""
        return self.last_update_at is not None

    def got_work(self, now: float) -> None:
        """It was given frames; its clock starts now if it held none."""
        if self.work_since is None:
            self.work_since = now

    def ran_dry(self) -> None:
        """It holds no undelivered frames any more."""
        self.work_since = None

    def taken_back(self) -> None:
        """Its undelivered frames were taken back: it owes nothing now, but the update it
        was computing, when it comes, still measures its pace (``update_arrived``)."""
        if self.work_since is not None:
            self.taken_back_since = self.work_since
        self.work_since = None

    def update_arrived(self, now: float, patterns: int, compute_seconds: float) -> None:
        """An update came in (accepted or refused: either way it is alive)."""
        since = self.work_since if self.work_since is not None else self.taken_back_since
        self.taken_back_since = None
        if since is not None:
            # Without the revoked work's start, a worker slower than the others' pace never
            # got one of its own: each lease was taken back before its update came.
            sample = max(now - since, 0.0)
            if self.last_update_at is None:  # the first includes start-up: not an interval
                if compute_seconds > 0:  # unreported: the others' pace until it has one
                    self.first_compute = min(sample, compute_seconds)
            elif self.interval is None:
                self.interval = sample
            else:
                self.interval = (1 - INTERVAL_WEIGHT) * self.interval + INTERVAL_WEIGHT * sample
        self.last_update_at = now
        self.patterns = patterns if patterns > 0 else self.patterns
        if patterns > 0 and compute_seconds > 0:
            self.seconds_per_pattern = compute_seconds / patterns
        if self.work_since is not None:
            self.work_since = now  # it owes the next one from now

    def settled(self, now: float) -> None:
        """Its update was applied or refused: it was waiting on the server until now."""
        if self.work_since is not None:
            self.work_since = max(self.work_since, now)

    def clock_start(self) -> float | None:
        """Since when it owes an update (None: it holds no frames, it owes nothing)."""
        return self.work_since


@dataclass(frozen=True)
class ProgressWatch:
    """Deadlines from the workers' measured delivery intervals."""

    stall_seconds: float = 2.0
    join_seconds: float = 10.0

    def deadline(
        self,
        clock: DeliveryClock,
        others: list[DeliveryClock],
        cv_frames: int = 0,
        patient: bool = False,
    ) -> float:
        """Seconds the worker may take from ``clock.clock_start()`` to its next update
        (``patient``: with the start-up allowance for a first update)."""
        typical = clock.interval if clock.interval is not None else clock.first_compute
        if typical is None:
            measured = [other.interval for other in others if other.interval is not None]
            typical = statistics.median(measured) if measured else None
        allowed = max(self.stall_seconds, STALL_FACTOR * typical if typical else 0.0)
        if patient and not clock.delivered:
            allowed += self.join_seconds
        if cv_frames:  # scoring first: its updates wait behind the CV set
            allowed += self.scoring_deadline(clock, others, cv_frames)
        return allowed

    def scoring_deadline(
        self, clock: DeliveryClock, others: list[DeliveryClock], cv_frames: int
    ) -> float:
        """Seconds a worker may take to score the CV set from when it was asked: the bunch
        it may be computing and the CV frames, at its pace as the server saw it, held to
        the others' (``_held_pace``). Not its deadline for updates, which its own interval
        sets: a peer stretched that by sending late, and held the run's end 34 s."""
        per_pattern = _held_pace(clock, others)
        if per_pattern is None:
            return self.stall_seconds + self.join_seconds
        return max(self.stall_seconds, STALL_FACTOR * (clock.patterns + cv_frames) * per_pattern)


def _held_pace(clock: DeliveryClock, others: list[DeliveryClock]) -> float | None:
    """``clock.seen_pace``, at most STALL_FACTOR times the others' median; unseen, their
    median (a newcomer that never computes held a CV job 10x longer than before)."""
    seen = [pace for pace in (other.seen_pace for other in others) if pace]
    own, typical = clock.seen_pace, statistics.median(seen) if seen else None
    return min(own, STALL_FACTOR * typical) if own and typical else own or typical
