"""``WorkerSession``: what the server knows about one connected (or departed) worker."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Collection, Container, Iterable
from dataclasses import dataclass, field
from typing import Any

from snet.protocol.errors import RejectedUpdate
from snet.protocol.messages import TAKEN_BACK_REMEMBERED, Message

from .ledger import CompressionLedger
from .progress import DeliveryClock

log = logging.getLogger("snet.server")


def log_warning(text: str, *args: object) -> None:
    """A session's ``warn`` with no connection to keep its budget (the server's own)."""
    log.warning(text, *args)


def unique_name(name: str, taken: Iterable[str]) -> str:
    """``name``, or with a suffix (``name-2``, ...) if a live worker has it already."""
    names = set(taken)
    candidate, number = name, 1
    while candidate in names:
        number += 1
        candidate = f"{name}-{number}"
    return candidate


@dataclass
class WorkerSession:
    """One worker as the coordinator sees it; the connection supplies send and close.

    The server's parts read its fields and change them only through its methods, each a
    thing that happened to the worker (an update delivered, refused or applied, a lease
    taken back, a CV result refused): tests/test_policies.py checks that no other module
    assigns them."""

    worker_id: int
    name: str
    address: str
    backend: str
    capabilities: tuple[str, ...]
    send: Callable[[Message], None]
    close: Callable[[str], None]
    # a warning about what this worker sent, within its connection's budget (PEER_WARNINGS)
    warn: Callable[..., None] = log_warning
    joined_at: float = field(default_factory=time.time)
    last_seen: float = field(default_factory=time.monotonic)
    unread_seconds: float = 0.0  # since last_seen, the server did not read it (pool dry)
    last_seen_wall: float = field(default_factory=time.time)
    state: str = "training"
    left_reason: str = ""
    updates_sent: int = 0
    updates_settled: int = 0  # applied or refused: reported back to the worker in Weights
    updates_rejected: int = 0
    updates_applied: int = 0  # in this connection: until one is, it is a newcomer (pool.py)
    numbers_refused: bool = False  # an update refused for its numbers since one applied
    # it joined once this server had started a step (policies.py: sync rounds); a worker
    # joining a restarted server before its first step is on time, as at a run's start
    joined_late: bool = False
    patterns: int = 0
    compute_seconds: float = 0.0
    staleness_last: int = 0
    staleness_sum: int = 0
    staleness_count: int = 0
    staleness_histogram: dict[int, int] = field(default_factory=dict)  # versions -> updates
    idle_epochs: int = 0  # epochs it was connected for but leased no frame (idleness.py)
    weights_version_sent: int = -1
    full_copy_version: int = -1  # the version of the last full copy it asked for (resync)
    settled_sent: int = -1  # the updates_settled the last Weights sent to it carried
    # sends it the newest weights if it was not sent them (before a lease: wants_weights)
    refresh: Callable[[], None] = lambda: None
    evaluations: int = 0
    inline_frames: bool = False  # it cannot read the data; the server sends its frames
    report: dict[str, Any] = field(default_factory=dict)  # the worker's latest WorkerReport
    ledger: CompressionLedger | None = None  # codecs agreed at the handshake, bytes, ratios
    clock: DeliveryClock = field(default_factory=lambda: DeliveryClock(time.monotonic()))
    leases_revoked: int = 0  # leases taken back because it delivered nothing in time
    leases_handed_over: int = 0  # taken back at an epoch's end: idle workers were far quicker
    handed_over: bool = False  # its latest leases taken back were handed over, not revoked late
    # the latest of them, each twice: the refusal of an update it was computing on one is
    # expected (the bunch under way; and the next, if that lease was all it held)
    taken_back_ids: deque[int] = field(
        default_factory=lambda: deque(maxlen=2 * TAKEN_BACK_REMEMBERED)
    )
    probation: bool = False  # its leases were taken back: none again until it delivers
    # it scored late or wrongly: not asked to score again before it delivers an update (it
    # may hold leases: probation here left an idle scorer unleased, and so for ever)
    scoring_held: bool = False

    @property
    def momentum_corrected(self) -> bool:
        """Its updates carry its own momentum: the update rule applies them without the
        server's (an update codec such as ``topk``; protocol 8.8)."""
        return self.ledger is not None and self.ledger.momentum_corrected

    def not_read_for(self, seconds: float) -> None:
        """The server did not read its connection for ``seconds`` (its pool dry): not the
        worker's silence (``quiet``); only that time, not the silence before it (a pause
        of a millisecond forgave a dead worker's hour)."""
        self.unread_seconds += seconds

    def quiet(self, now: float) -> float:
        """Seconds of this worker's silence since its last message, less the time the
        server did not read it."""
        return now - self.last_seen - self.unread_seconds

    def touch(self) -> None:
        self.last_seen = time.monotonic()
        self.last_seen_wall = time.time()
        self.unread_seconds = 0.0

    def wants_weights(self, holders: Container[int]) -> bool:
        """After a step: whether it is sent the new weights. It computes (it is among the
        ``holders`` of frames: a newcomer too, which may still be loading and would
        otherwise start on the weights it joined with, hundreds of versions old in async
        mode), or the step settled an update of its (the Weights carry that count, its flow
        control). An idle one is sent
        the newest with its next lease instead (``refresh``): 30 idle connections, each
        sent every step's weights (262 kB), cut a run to 0.38 of its steps a second."""
        return self.worker_id in holders or self.updates_settled != self.settled_sent

    def delivered(self, patterns: int, compute_seconds: float) -> None:
        """It delivered an update (or np's partial outputs) of ``patterns`` patterns."""
        self.updates_sent += 1
        self.patterns += patterns
        self.compute_seconds += compute_seconds

    def refused(self, numeric: bool = False) -> None:
        """An update of its was refused (``numeric``: for its numbers, NaN or beyond the
        plausible): settled all the same (it may send more)."""
        self.updates_rejected += 1
        self.updates_settled += 1
        self.numbers_refused = self.numbers_refused or numeric

    @property
    def proven(self) -> bool:
        """It has delivered an update, and none refused for its numbers since its last one
        applied: one the steps wait for, the leases and the CV go to. A peer sending a NaN
        update every half second, each refused, had each refusal taken for a delivery, and
        held every sync round and async step to its pace (166k -> 2.9k patterns a second);
        a latecomer's update refused only as stale (for when it was sent) still proves
        it, and the rounds then wait for it (server/policies.py)."""
        return self.clock.delivered and not self.numbers_refused

    @property
    def pool_trusted(self) -> bool:
        """An update of it has been applied and none refused for its numbers since: the
        pool's bound for newcomers (server/pool.py) no longer holds it. Not ``proven``,
        which a stale update, whose base version a peer chooses, satisfies too: the bound
        is against strangers."""
        return self.updates_applied > 0 and not self.numbers_refused

    def settled_lost(self, updates: int) -> None:
        """``updates`` of its updates were lost on their way (its next one names a later
        offset): settled, so that its flow control counts them."""
        self.updates_settled += updates

    def alive(self) -> None:
        """It delivered something: it may hold leases and score CV again."""
        self.probation = self.scoring_held = False

    def hold_scoring(self) -> None:
        """It scored late or wrongly: not asked to score again before it delivers."""
        self.scoring_held = True

    def cv_refused(self) -> None:
        """A CV result of its differed from the server's: refused, counted with its
        refused updates, and it is not asked to score again before it delivers."""
        self.hold_scoring()
        self.updates_rejected += 1

    def asked_to_score(self) -> None:
        self.evaluations += 1

    def idle_for_an_epoch(self) -> None:
        self.idle_epochs += 1

    def fed_inline(self) -> None:
        """It cannot read the data: the server sends its frames from now on."""
        self.inline_frames = True

    def expected_refusal(self, refusal: RejectedUpdate) -> bool:
        """Whether a refused update of its was to be expected: one it was computing on a
        lease it was told was taken back (twice at most for each, and never one refused
        for its numbers), logged as information, not a warning within its budget."""
        if refusal.numeric or refusal.lease_id not in self.taken_back_ids:
            return False
        self.taken_back_ids.remove(refusal.lease_id)
        return True

    def taken_back(self, lease_ids: Collection[int], late: bool = True) -> None:
        """Its leases ``lease_ids`` were taken back (``late``, or handed over to idle
        workers at an epoch's end): none again until it delivers."""
        if late:
            self.leases_revoked += len(lease_ids)
        else:
            self.leases_handed_over += len(lease_ids)
        self.handed_over = not late  # why it is on probation (its idle epochs are said so)
        for lease_id in lease_ids:  # the bunch under way, and the next if it was its last
            self.taken_back_ids.extend((lease_id, lease_id))
        self.probation = True

    def weights_sent(self, version: int, published_from: int = 0) -> None:
        """It is sent the weights of ``version``, with its settled count as it is now. If
        it missed a publish (it holds a version older than ``published_from``, the one
        the workers held before the newest: an idle worker is not sent every step's), a
        lossy delta over all it missed would leave its copy far off (topk: an error of 17
        against weights of norm 20 after 200 steps): the copy goes whole."""
        if self.ledger is not None and self.weights_version_sent < published_from:
            self.ledger.weights.missed_versions()
        self.weights_version_sent, self.settled_sent = version, self.updates_settled

    def cannot_read_board(self) -> None:
        """It cannot read the weights board (``Resync.no_board``): its copies go in the frame
        from now on, and none now (it got its first whole, and asks again for any slot it
        was sent and could not read)."""
        if self.ledger is not None and self.ledger.weights.board_unreadable():
            log.info("worker %s cannot read the weights board: its weights go in frames",
                     self.name)  # fmt: skip

    def full_copy_asked(self, version: int, reason: str) -> bool:
        """It asks for a full float32 copy of the weights (a resync, ``reason``): whether to
        send one of ``version`` (its codec told to make the next copy whole). One a
        version: a peer asking for ever (30 bytes each) had the server send a 262 kB copy
        for each, 9 GB in 8 s, and log a line for each; a worker computing is sent one a
        step."""
        if self.full_copy_version == version:
            return False
        self.full_copy_version = version
        said = "worker %s asks for a full copy of the weights: %s"
        if self.ledger is not None and self.ledger.weights.board is not None:
            # from the board, mostly a slot the server went round before a worker behind on
            # a loaded machine read it: expected, as its worker says (an info line there,
            # client/connection.py), and anything else is a warning on the worker's side
            log.info(said, self.name, reason[:100])
        else:
            self.warn(said, self.name, reason[:100])
        if self.ledger is not None:
            self.ledger.weights.request_full()
        return True

    def reported(self, report: dict[str, Any]) -> None:
        """Its newest ``WorkerReport`` (its backend's figures, shown in /status)."""
        self.report = report

    def left(self, reason: str) -> None:
        """It left: its row stays for /status a while (``Departures``), the copy of its
        weights a delta encoder kept does not (an element each: 250 such peers, come and
        gone, held 330 MB more, a probe)."""
        self.state, self.left_reason = "gone", reason
        if self.ledger is not None:
            self.ledger.weights.release()

    def settle_applied(self, staleness: int, now: float) -> None:
        """One of its updates was applied ``staleness`` versions after its base, at ``now``."""
        self.updates_settled += 1
        self.updates_applied += 1
        self.numbers_refused = False
        self.clock.settled(now)
        self.staleness_last = staleness
        self.staleness_sum += staleness
        self.staleness_count += 1
        self.staleness_histogram[staleness] = self.staleness_histogram.get(staleness, 0) + 1

    def mcups(self, connections: int) -> float:
        """Million connection updates per second of the worker's own compute time."""
        if self.compute_seconds <= 0:
            return 0.0
        return connections * self.patterns / self.compute_seconds / 1e6

    def row(self, connections: int) -> dict[str, Any]:
        """The worker's row in /status."""
        mean = self.staleness_sum / self.staleness_count if self.staleness_count else 0.0
        return {
            "id": self.worker_id,
            "name": self.name,
            "address": self.address,
            "backend": self.backend,
            "state": self.state,
            "left_reason": self.left_reason,
            "updates_sent": self.updates_sent,
            "updates_rejected": self.updates_rejected,
            "patterns": self.patterns,
            "staleness_last": self.staleness_last,
            "staleness_mean": round(mean, 3),
            "staleness_histogram": {str(k): v for k, v in sorted(self.staleness_histogram.items())},
            "idle_epochs": self.idle_epochs,
            "mcups": round(self.mcups(connections), 2),
            "last_seen": self.last_seen_wall,
            "last_seen_ago": round(time.monotonic() - self.last_seen, 3),
            "report": self.report,
            "inline_frames": self.inline_frames,
            "leases_revoked": self.leases_revoked,
            "leases_handed_over": self.leases_handed_over,
            "probation": self.probation,
            "scoring_held": self.scoring_held,
            "update_interval": (
                round(self.clock.interval, 6) if self.clock.interval is not None else None
            ),
            "compression": self.ledger.row() if self.ledger is not None else None,
        }
