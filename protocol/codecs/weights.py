"""Compressed weights from the server to a worker, when the worker asks for them.

Forms (a worker's ``--weights-codec``)::

    none          every copy in float32 (the default)
    fp16          every copy in half precision (2x fewer bytes)
    delta:CODEC   the difference from the copy the worker holds, in any update codec
                  but none (``delta:none`` is taken as ``none``: the same bytes)
    shared        for a worker on the server's machine: every copy in float32 in the
                  server's weights board (shared memory, transport/shared_board.py),
                  the frame naming its slot; elsewhere the server agrees ``none``

The first copy after a (re)connection and the copy after a ``Resync`` are always full
float32 in the frame. For deltas the server keeps a *mirror* of what the worker has reconstructed
(mirror += decode(delta)) and encodes ``weights - mirror``: whatever a lossy codec leaves
out of one delta is part of the next one, so the worker's copy never drifts further
than one delta's error from the server's weights (error feedback on the downlink).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import numpy as np

from ..errors import CodecError, ConfigError
from ..messages import NO_ELEMENT, Message, Weights
from ..network import ElementLayout
from . import CODEC_FORMS, ElementCodec, parse_codec

WEIGHTS_FORMS = ("none", "fp16", "delta:CODEC", "shared")
DELTA_PREFIX = "delta:"
SHARED = "shared"


class Board(Protocol):
    """Where ``shared`` copies go (the server's ``WeightsBoard``)."""

    def publish(self, version: int, element: np.ndarray) -> int:
        """The slot holding ``version``, written there unless it already is; -1 when
        the board can take no more (closed)."""

    def described(self) -> dict[str, Any]:
        """Where a worker finds it, as ``Welcome.codecs["board"]`` carries it."""


def canonical_weights_form(text: str) -> str:
    """The canonical spelling of a weights form; ``ConfigError`` when there is none.

    ``delta:none`` is ``none``: a float32 delta is as large as the float32 weights, and a
    frame of float32 values is a whole copy on the wire (a frame's codec "none" means
    unencoded), so such deltas could not be sent (the worker refused every one of them
    as malformed, reconnected and trained one bunch per connection).
    """
    text = str(text).strip().lower()  # any case, as a codec's (``canonical``)
    if text in ("none", "fp16", SHARED):
        return text
    if text.startswith(DELTA_PREFIX):
        try:
            codec = parse_codec(text[len(DELTA_PREFIX) :]).name
        except ConfigError:
            pass
        else:
            return "none" if codec == "none" else DELTA_PREFIX + codec
    raise ConfigError(
        f"unknown weights codec {text!r:.40}; use none, fp16, shared or delta:CODEC "
        f"with CODEC one of {', '.join(CODEC_FORMS)}"
    )


class WeightsEncoder:
    """Server side, one per worker: the form each ``Weights`` takes when it is written."""

    def __init__(self, form: str, layout: ElementLayout, board: Board | None = None) -> None:
        """``board``: where ``shared`` copies go (without one, ``shared`` is ``none``)."""
        self.form = canonical_weights_form(form)
        if self.form == SHARED and board is None:
            self.form = "none"
        self.layout = layout
        self.board = board if self.form == SHARED else None
        self._delta = self.form.startswith(DELTA_PREFIX)
        self._codec: ElementCodec | None = None
        if self.form not in ("none", SHARED):
            self._codec = parse_codec(self.form[len(DELTA_PREFIX) :] if self._delta else "fp16")
        self._mirror = layout.allocate() if self._delta else None
        self._mirror_version = -1
        self._full_next = True
        self.copies = 0
        self.full_copies = 0
        self.shared_copies = 0  # copies sent as a slot of the board (in no byte count)
        self.payload_bytes = 0  # the element's bytes as sent in frames (encoded or not)
        self.raw_bytes = 0  # the same copies as float32

    def release(self) -> None:
        """Its worker left: the mirror of the worker's copy goes (the counts stay; a copy
        written after this, none should be, goes whole)."""
        self._mirror, self._codec, self._full_next = None, None, True

    def request_full(self) -> None:
        """The next copy goes as full float32 in the frame (a new connection, or the
        worker asked)."""
        self._full_next = True

    def missed_versions(self) -> None:
        """The worker missed versions (an idle worker is not sent every step's): a lossy
        delta over all of them would leave its copy far off, so the next copy goes whole;
        a board's slot is a whole copy already."""
        if self.board is None:
            self._full_next = True

    def board_unreadable(self) -> bool:
        """The worker cannot read the board (``Resync.no_board``): its copies go in the
        frame from now on. True if it was sent slots until now."""
        if self.board is None:
            return False
        self.board, self.form = None, "none"
        self._full_next = True
        return True

    def prepare(self, message: Message) -> Message:
        """``Channel.before_send``: encode a plain ``Weights``; pass anything else on."""
        if not isinstance(message, Weights) or message.encoded is not None:
            return message
        element = message.element
        self.copies += 1
        slot = -1
        if self.board is not None and not self._full_next:
            slot = self.board.publish(message.version, element)
        if slot >= 0:  # not on the wire: no bytes
            self.shared_copies += 1
            return dataclasses.replace(message, element=NO_ELEMENT, slot=slot)
        self.raw_bytes += element.nbytes
        if self._codec is None or self._full_next:
            self._full_next = False
            self.full_copies += 1
            self.payload_bytes += element.nbytes
            if self._mirror is not None:
                np.copyto(self._mirror, element)
                self._mirror_version = message.version
            return message
        if self._mirror is None:
            encoded = self._codec.encode(self.layout, element)
            self.payload_bytes += encoded.nbytes
            return dataclasses.replace(message, element=NO_ELEMENT, encoded=encoded)
        encoded = self._codec.encode(self.layout, element - self._mirror)
        decoded = self.layout.allocate()
        self._codec.decode(self.layout, encoded, decoded)
        self._mirror += decoded
        delta_from, self._mirror_version = self._mirror_version, message.version
        self.payload_bytes += encoded.nbytes
        return dataclasses.replace(
            message, element=NO_ELEMENT, encoded=encoded, delta_from=delta_from
        )


def decode_weights(
    layout: ElementLayout,
    message: Weights,
    base: np.ndarray | None,
    base_version: int,
    out: np.ndarray,
) -> None:
    """Worker side: write the weights ``message`` carries into ``out``.

    ``base`` is the worker's newest copy (version ``base_version``), which a delta is
    added to. Raises ``CodecError`` when the message cannot be applied: a delta from a
    version the worker does not hold, or an encoding that does not fit the layout. The
    worker then asks for a full copy (``Resync``).
    """
    if message.encoded is None:
        if message.element.shape != (layout.size,):
            raise CodecError(f"weights of shape {message.element.shape}, need ({layout.size},)")
        np.copyto(out, message.element)
        return
    try:
        codec = parse_codec(message.encoded.codec)
    except ConfigError as exc:
        raise CodecError(str(exc)) from exc
    if message.delta_from < 0:
        codec.decode(layout, message.encoded, out)
        return
    if base is None or base_version != message.delta_from:
        raise CodecError(
            f"weights {message.version} are a delta from version {message.delta_from}, "
            f"this worker holds {base_version if base is not None else 'none'}"
        )
    codec.decode(layout, message.encoded, out)
    out += base
