"""The worker's two element queues, as in SNet v2.

``WeightsBox`` receives weights: incoming copies land in free preallocated elements; at
each bunch boundary the compute side takes the newest and the older ones go back to the
free queue. Compressed copies (fp16, or deltas from the newest copy held) are decoded,
and copies in the server's weights board (``shared``) copied out, into a free element on
arrival, so the compute side always sees plain float32 it alone holds.
``SendBuffers`` holds the update elements the compute side fills; an element
is reused only once the transport has handed all of it to the kernel (the transport may
keep a reference to the buffer instead of copying it).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from snet.protocol.codecs.weights import decode_weights
from snet.protocol.digest import weights_digest
from snet.protocol.errors import CodecError
from snet.protocol.framing import ArrayInfo
from snet.protocol.messages import Weights
from snet.protocol.network import ELEMENT_DTYPE, ElementLayout
from snet.transport.shared_board import BoardReader


@dataclass
class WeightsCopy:
    version: int
    epoch: int
    learning_rate: float
    settled: int  # this worker's updates the server had applied or refused by then
    flat: np.ndarray


class BoxSlot:
    """A free element of a ``WeightsBox`` a weights payload is being received into; the
    token the decoder hands back beside the message. ``release()`` returns it unused
    (a frame cut short, or refused)."""

    __slots__ = ("_free", "flat")

    def __init__(self, flat: np.ndarray, free: deque[np.ndarray]) -> None:
        self.flat = flat
        self._free: deque[np.ndarray] | None = free

    def take(self) -> np.ndarray:
        """The element, now the box's (no longer returned by ``release``)."""
        self._free = None
        return self.flat

    def release(self) -> None:
        free, self._free = self._free, None
        if free is not None:
            free.append(self.flat)


class WeightsBox:
    """Newest-wins queue of received weights over a few preallocated elements."""

    def __init__(
        self, layout: ElementLayout, wake: asyncio.Event, slots: int = 3,
        board: BoardReader | None = None,
    ) -> None:  # fmt: skip
        """``board``: the server's weights board, when it sends copies there."""
        self.layout = layout
        self.board = board
        self.wake = wake
        self._free: deque[np.ndarray] = deque(layout.allocate() for _ in range(slots))
        self._pending: WeightsCopy | None = None
        self.current: WeightsCopy | None = None
        self.received = 0
        self.skipped = 0  # copies replaced by a newer one before they were used
        self.awaiting_full = False  # a Resync was sent: deltas are useless until a full copy
        self.undecodable = 0  # copies that could not be used (decoded, read, checked)
        self.arrived: Callable[[WeightsCopy], None] | None = None  # told of each new copy

    @property
    def newest_version(self) -> int:
        """The version of the newest weights received, used or not (-1: none yet)."""
        newest = self._pending or self.current
        return newest.version if newest else -1

    def payload_target(
        self, message_type: str, arrays: tuple[ArrayInfo, ...], payload_bytes: int
    ) -> tuple[memoryview, object] | None:
        """``PayloadSink`` hook: weights of the job's layout land in a free element."""
        fits = (
            message_type == "weights"
            and len(arrays) == 1
            and arrays[0].dtype == ELEMENT_DTYPE.str
            and arrays[0].shape == (self.layout.size,)
        )
        if not fits:
            return None
        flat = self._free.popleft() if self._free else self.layout.allocate()
        return flat.data.cast("B"), BoxSlot(flat, self._free)

    def ask_for_full_copy(self) -> bool:
        """A copy could not be used: True if a full one is to be asked for now (False:
        asked already, and deltas are useless until it comes)."""
        asking, self.awaiting_full = not self.awaiting_full, True
        return asking

    def receive(self, message: Weights, slot: object = None) -> None:
        """File a received ``Weights``: in place, copied, or decoded into a free element.

        ``slot`` is the decoder's token when the payload was received into one of this
        box's elements. Raises ``CodecError`` when a copy cannot be used (a delta from a
        version this worker does not hold, a malformed encoding, a board slot that holds
        another version, a digest that differs from the server's); the caller then asks
        the server for a full copy and sets ``awaiting_full``.
        """
        flat = self._filled(message, slot)
        self.put(
            WeightsCopy(
                message.version, message.epoch, message.learning_rate, message.settled, flat
            )
        )

    def _filled(self, message: Weights, slot: object) -> np.ndarray:
        """The element holding ``message``'s weights: received in place, read from the
        server's board (transport/shared_board.py), or decoded; ``CodecError`` (counted,
        the element free again) when they cannot be used."""
        if message.slot < 0 and message.encoded is None:
            flat = slot.take() if isinstance(slot, BoxSlot) else np.array(message.element, "<f4")
            if flat.shape != (self.layout.size,):
                raise CodecError(f"weights of shape {flat.shape}, need ({self.layout.size},)")
        else:
            flat = self._free.popleft() if self._free else self.layout.allocate()
        try:
            if message.slot >= 0:
                if self.board is None:
                    raise CodecError("weights in a board slot, and no board was opened")
                self.board.read_into(message.slot, message.version, flat)
            elif message.encoded is not None:
                newest = self._pending or self.current
                decode_weights(self.layout, message, newest.flat if newest else None,
                               newest.version if newest else -1, flat)  # fmt: skip
            if message.encoded is None:  # a whole float32 copy: the server's, exactly?
                self._check_digest(message, flat)
        except CodecError:
            self.undecodable += 1
            self._free.append(flat)
            raise
        if message.delta_from < 0:  # whole: deltas can be applied again
            self.awaiting_full = False
        return flat

    def _check_digest(self, message: Weights, flat: np.ndarray) -> None:
        """``CodecError`` when ``flat`` is not what the server announced."""
        if message.digest and (digest := weights_digest(flat)) != message.digest:
            raise CodecError(
                f"weights {message.version} have digest {digest}, "
                f"the server announced {message.digest}"
            )

    def put(self, copy: WeightsCopy) -> None:
        self.received += 1
        if self._pending is not None:
            self.skipped += 1
            self._free.append(self._pending.flat)
        self._pending = copy
        if self.arrived is not None:
            self.arrived(copy)
        self.wake.set()

    def take_newest(self) -> WeightsCopy | None:
        """Switch to the newest copy (if a newer one came) and free the previous one."""
        if self._pending is not None:
            if self.current is not None:
                self._free.append(self.current.flat)
            self.current, self._pending = self._pending, None
        return self.current

    @property
    def settled(self) -> int:
        """This worker's updates applied or refused, as of the newest copy received."""
        newest = self._pending or self.current
        return newest.settled if newest else 0


class SendBuffers:
    """Update elements: free, or in flight until the transport has written them out."""

    def __init__(self, layout: ElementLayout, count: int) -> None:
        self._free: deque[np.ndarray] = deque(layout.allocate() for _ in range(count))
        self._in_flight: list[np.ndarray] = []
        self._available = asyncio.Event()
        self._available.set()

    async def acquire(self) -> np.ndarray:
        while not self._free:
            self._available.clear()
            await self._available.wait()
        return self._free.popleft()

    def release(self, buffer: np.ndarray) -> None:
        """``buffer`` is free again at once (its update was copied, not written out)."""
        self._free.append(buffer)
        self._available.set()

    def mark_in_flight(self, buffer: np.ndarray) -> None:
        """``buffer`` is about to be written; it is not free until all_flushed()."""
        self._in_flight.append(buffer)

    def all_flushed(self) -> None:
        """Everything written so far has left the process: in-flight buffers are free."""
        self._free.extend(self._in_flight)
        self._in_flight.clear()
        self._available.set()
