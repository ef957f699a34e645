"""``ElementPool``: reused elements, a free queue and a received queue.

Update payloads are received straight into a free element (the decoder asks the pool for
a target buffer once it has read a frame's header), queued as received, applied, and
then returned to the free queue: no allocation per update in the steady state. An
element is made the first time one more is needed, up to the pool's size, and kept from
then on: a server given a large ``--pool-size`` for bursts does not pay for all of it at
start (40,000 elements took 2 s to allocate) nor hold what its workers never fill. When the
free queue runs dry the pool still hands out a fresh element (counted as an overflow) so
that no update is ever dropped, and the server stops reading from its workers until
elements are free again, which bounds the overflow to one frame per connection.
The free elements are a stack: the one released last is handed out first, so a server
that is keeping up cycles through a few elements that stay in the cache instead of
walking the whole pool (64 MB for 32 elements of 2 MB) through memory.

Ownership: an element out of the pool always has exactly one owner, and one way back.
``acquire()`` hands out an ``ElementLoan``; the loan is the owner's ticket, and its
``release()`` is the only way an element returns to the free queue (a second call does
nothing; the element is unreachable through the loan after the first). The loan moves,
it is never shared:

    decoder (the connection's ``ElementShare.payload_target``) -> the frame's ``Decoded``
      (message, loan)
      -> connection: a ``Received`` (the update and its loan), to the coordinator, and
         once the coordinator is done with it, whatever it did, ``release()``: the one
         release point of an update that was not queued (refused, repeated, np's)
      -> ``UpdateIntake.admit``: refuses it (keeping nothing) or makes a
         ``PendingUpdate`` for the queue, which takes the loan (``Received.keep()``)
      -> step queue: applies it, then releases it in its ``finally`` (whatever
         happened), or releases it when a refusal takes it out of the queue (``_free``).

What never reaches the connection goes back in the transport (transport/stream.py):
a frame cut short (``Channel.abandon()``), a frame refused as out of turn, a message
arriving while the connection closes. An encoded update is decoded into a second loan,
which replaces the first in its ``Received`` (``adopt``).

Shares: each connection draws on the pool through its ``ElementShare``. A payload being
received holds its element until the frame is whole, so peers that each sent all but the
last bytes of an update and stopped held every element (36 such connections against a
pool of 32): the server stopped reading from everyone until elements came back, and
training froze until they were closed (60 s later, and they could come again). So the
unfinished payloads of newcomers (connections none of whose updates has been applied yet)
hold half the pool at most: beyond that a newcomer's update is received into a buffer of
its own (one frame per connection, as any payload the pool does not take) and refused as
``update_rejected``, its frames leased again. A whole update is the server's to apply,
however it came, and its element comes back after its step: only an unfinished payload
can be held for as long as its sender likes. Workers that have trained keep the other
half whatever newcomers do. And none can be held for long: a payload unfinished
``UNFINISHED_SECONDS`` after its header, and a second more a MiB, closes its connection
(server/connection_set.py), since peers made "proven" by one small update each held
every element too.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

import numpy as np

from snet.protocol.framing import ArrayInfo
from snet.protocol.messages import Update
from snet.protocol.network import ELEMENT_DTYPE, ElementLayout


class PooledElement:
    """One element's flat float32 buffer, identified for the pool."""

    __slots__ = ("flat", "index")

    def __init__(self, index: int, layout: ElementLayout) -> None:
        self.index = index
        self.flat = layout.allocate()


class ElementLoan:
    """One acquisition of a pooled element: the holder owns it until ``release()``."""

    __slots__ = ("_element", "_pool", "_receiving")

    def __init__(self, pool: ElementPool, element: PooledElement, receiving: bool = False) -> None:
        self._pool = pool
        self._element: PooledElement | None = element
        self._receiving = receiving  # a newcomer's payload being received into it (counted)

    @property
    def element(self) -> PooledElement:
        if self._element is None:
            raise RuntimeError("element used after its loan was released")
        return self._element

    @property
    def flat(self) -> np.ndarray:
        return self.element.flat

    @property
    def index(self) -> int:
        """The element's place in the pool (-1: an overflow element, not kept)."""
        return self.element.index

    @property
    def released(self) -> bool:
        return self._element is None

    def received(self) -> None:
        """Its payload is whole (or never will be): no longer a newcomer's unfinished one."""
        if self._receiving:
            self._receiving = False
            self._pool.newcomers_receiving -= 1

    def release(self) -> None:
        """Give the element back to the pool; later calls do nothing."""
        self.received()
        element, self._element = self._element, None
        if element is not None:
            self._pool._give_back(element)


class TurnedAway:
    """The sink token of an update its connection's share could not take (``ElementShare``)."""


TURNED_AWAY = TurnedAway()
# an update payload received into a pooled element is closed when it is unfinished this
# long, and a second more a MiB (2 MB: 17 s; a large frame needs 1 MiB/s): it holds one
UNFINISHED_SECONDS = 15.0
UNFINISHED_FLOOR_RATE = float(1 << 20)  # bytes a second


class Received:
    """A received update and the loan of the pooled element its gradient sits in (none
    when the payload did not fit the pool, or its share: ``turned_away``; the coordinator
    refuses such an update)."""

    __slots__ = ("loan", "message", "source", "turned_away")

    def __init__(
        self, message: Update, loan: ElementLoan | None, turned_away: bool = False,
        source: Callable[[np.ndarray], None] | None = None,
    ) -> None:  # fmt: skip
        """``source``: what fills the loan's element, when the update's element is not
        in its frame (a slot of the worker's update board): called by ``fill``."""
        self.message = message
        self.loan = loan
        self.turned_away = turned_away
        self.source = source

    def fill(self) -> None:
        """Copy the element in from its ``source`` (once; none: it came in the frame)."""
        source, self.source = self.source, None
        if source is not None and self.loan is not None:
            source(self.loan.flat)

    def adopt(self, loan: ElementLoan) -> None:
        """Hold ``loan`` (an encoded update decoded into it) instead of the one held."""
        self.release()
        self.loan = loan

    def keep(self) -> ElementLoan | None:
        """The loan, handed on to whoever keeps the update (a queued ``PendingUpdate``):
        this ``Received`` holds nothing from now on, so its ``release()`` does nothing."""
        loan, self.loan = self.loan, None
        return loan

    def release(self) -> None:
        """Give back what was not kept: the connection calls it once the coordinator is
        done with the update, taken or refused (server/connection.py)."""
        if self.loan is not None:
            self.loan.release()
            self.loan = None


class ElementPool:
    """Bounded free and received queues of update elements, made as first needed."""

    def __init__(self, layout: ElementLayout, size: int) -> None:
        if size < 1:
            raise ValueError("an element pool needs at least one element")
        self.layout = layout
        self.size = size
        self._free: deque[PooledElement] = deque()
        self._made = 0  # elements made so far (indices 0 .. _made-1); at most size
        self.overflows = 0
        self.in_use = 0
        self.newcomer_limit = max(1, size // 2)  # unfinished newcomers' payloads, at most
        self.newcomers_receiving = 0
        self.on_empty: Callable[[], None] | None = None
        self.on_available: Callable[[], None] | None = None

    def watch(self, on_empty: Callable[[], None], on_available: Callable[[], None]) -> None:
        """Have ``on_empty`` called when the last free element goes, ``on_available``
        when one is free again (the server stops and resumes reading from workers)."""
        self.on_empty, self.on_available = on_empty, on_available

    @property
    def free(self) -> int:
        """Elements that can be handed out without an overflow: released or not yet made."""
        return len(self._free) + self.size - self._made

    @property
    def made(self) -> int:
        """Elements made so far and kept (overflow elements are not counted)."""
        return self._made

    def acquire(self, receiving: bool = False) -> ElementLoan:
        """A free element, or a fresh one (counted) when the pool is exhausted;
        ``receiving``: for a newcomer's payload, counted until whole (``received``)."""
        if self._free:
            element = self._free.pop()  # the most recently released: warm in the cache
        elif self._made < self.size:
            element = PooledElement(self._made, self.layout)
            self._made += 1
        else:
            self.overflows += 1
            element = PooledElement(-1, self.layout)
        self.in_use += 1
        if self.free == 0 and self.on_empty is not None:
            self.on_empty()
        if receiving:
            self.newcomers_receiving += 1
        return ElementLoan(self, element, receiving)

    def _give_back(self, element: PooledElement) -> None:
        """``ElementLoan.release``: overflow elements are dropped for the collector."""
        self.in_use -= 1
        if element.index < 0:
            return
        was_empty = self.free == 0
        self._free.append(element)
        if was_empty and self.on_available is not None:
            self.on_available()

    def matches(self, arrays: tuple[ArrayInfo, ...]) -> bool:
        """True when a frame's single array has exactly this pool's element layout."""
        return (
            len(arrays) == 1
            and arrays[0].dtype == ELEMENT_DTYPE.str
            and arrays[0].shape == (self.layout.size,)
            and arrays[0].codec == "none"
        )


class ElementShare:
    """One connection's draw on the pool, and its ``PayloadSink``: its updates land in the
    pool's elements, but while none of its updates has been applied, or one was refused
    for its numbers since (``proven()`` false: session.py, ``pool_trusted``), only as long
    as newcomers' unfinished payloads hold less than half the pool."""

    def __init__(self, pool: ElementPool, proven: Callable[[], bool]) -> None:
        self.pool = pool
        self.proven = proven
        # the update payload being received: (its loan, None for a buffer of its own past
        # the newcomers' share, since, bytes)
        self.unfinished: tuple[ElementLoan | None, float, int] | None = None

    @property
    def receiving(self) -> bool:
        """A payload is being received into a pooled element it holds (or is about to):
        pausing it would hold that element for as long as the pause lasts."""
        if self.unfinished is None:
            return False
        loan = self.unfinished[0]
        return loan is None or not loan.released

    def unfinished_past(self, now: float) -> float:
        """Seconds its payload has been unfinished, if past what any honest link needs
        (``UNFINISHED_SECONDS`` and a second a MiB), else 0. Proven peers' payloads
        held every element (36 of them, each all of an update but its last bytes, against
        a pool of 32): the server read from no one, training froze, and honest workers
        were dropped as silent."""
        if self.unfinished is None or not self.receiving:
            return 0.0
        _, since, size = self.unfinished
        held = now - since
        return held if held > UNFINISHED_SECONDS + size / UNFINISHED_FLOOR_RATE else 0.0

    def payload_target(
        self, message_type: str, arrays: tuple[ArrayInfo, ...], payload_bytes: int
    ) -> tuple[memoryview, object] | None:
        """Updates of the pool's layout land in one of its elements, within the share; one
        beyond it in a buffer of its own, with the ``TURNED_AWAY`` token."""
        if message_type != "update" or not self.pool.matches(arrays):
            return None
        # receiving before the element is taken: the last one's on_empty pauses every
        # connection but this one, whose payload it takes (it was paused mid-payload)
        since = time.monotonic()
        self.unfinished = (None, since, payload_bytes)
        loan = self.element()
        self.unfinished = (loan, since, payload_bytes)  # either: held 15 s+, closed
        if loan is None:  # (a buffer of its own is held too: closed alike, not at 60 s)
            return memoryview(bytearray(payload_bytes)), TURNED_AWAY
        return loan.flat.data.cast("B"), loan

    def payload_done(self, loan: ElementLoan | None) -> None:
        """The update payload is whole (or, ``loan`` None, came in no pooled element)."""
        self.unfinished = None
        if loan is not None:
            loan.received()  # no longer a newcomer's unfinished payload

    def element(self) -> ElementLoan | None:
        """An element for one update, within the share (None: a newcomer's share of the
        pool is taken); also for an update copied from the worker's update board."""
        pool = self.pool
        newcomer = not self.proven()
        if newcomer and pool.newcomers_receiving >= pool.newcomer_limit:
            return None
        return pool.acquire(receiving=newcomer)


def is_finite(flat: np.ndarray) -> bool:
    """True when no value is NaN or infinite (checked per update only after a step found
    NaN or Inf, to tell which updates to refuse)."""
    return bool(np.isfinite(flat).all())
