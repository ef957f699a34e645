"""``ElementCodec``: how an element (or an update) is cut into compressed parts and back.

A codec works layer array by layer array (W0, b0, W1, b1, ...: the element's *segments*,
see ``network.ElementLayout``). Each segment becomes a fixed number of *parts*, numpy
arrays whose dtype and shape follow from the segment's shape and the codec's parameters
alone (``part_specs``), except where a codec overrides ``encode`` and ``check_parts``
(top-k chooses over the whole element, so its per-segment lengths vary). The parts of all
segments, in order, travel as the arrays of one frame, each described with the codec's
name (see protocol/README.md).

Decoding trusts nothing: the number of parts, every part's dtype and shape, every index
and every scale are checked before anything is written (``check_parts``, then
``check_values`` for every segment, and only then ``decode_segment``), and a payload that
fails a check raises ``CodecError`` with a message that says what is wrong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from ..errors import CodecError
from ..messages import Encoded
from ..network import ElementLayout


@dataclass(frozen=True)
class PartSpec:
    """The dtype (numpy ``.str``) and shape a part must have."""

    dtype: str
    shape: tuple[int, ...]


class ElementCodec:
    """Base of the codecs. Subclasses set ``family`` and implement the three hooks.

    ``momentum_corrected`` codecs (``topk``) are sent as the sparsified accumulation of
    the worker's velocity, not of its gradient sums; see ``carries_momentum``.

    ``name`` is canonical (``"topk:0.01"``, never ``"topk:.010"``): the server compares the
    name in each frame with the name agreed in the handshake. A codec object may keep
    encoder state between calls (the low-rank codec's warm start); decoding is stateless.
    """

    family = ""
    lossy = True
    # True: an update in this codec carries the worker's momentum (Deep Gradient
    # Compression's momentum correction), so the server applies it without its own.
    momentum_corrected = False

    @property
    def name(self) -> str:
        return self.family

    # -- hooks

    def part_specs(self, shape: tuple[int, ...]) -> tuple[PartSpec, ...]:
        """What the parts of a segment of ``shape`` look like."""
        raise NotImplementedError

    def encode_segment(self, index: int, segment: np.ndarray) -> tuple[np.ndarray, ...]:
        """The parts of segment number ``index`` (float32, its layout shape)."""
        raise NotImplementedError

    def check_values(self, parts: Sequence[np.ndarray], shape: tuple[int, ...]) -> None:
        """Check the parts' values (dtypes and shapes are already checked): indices in
        range, scales finite. Raise ``CodecError`` when one does not fit."""
        raise NotImplementedError

    def decode_segment(self, parts: Sequence[np.ndarray], out: np.ndarray) -> None:
        """Write the segment that checked ``parts`` describe into ``out``."""
        raise NotImplementedError

    # -- whole elements

    def encode(self, layout: ElementLayout, flat: np.ndarray) -> Encoded:
        """The element ``flat`` as this codec's parts (new arrays; ``flat`` is not kept)."""
        parts: list[np.ndarray] = []
        for index, segment in enumerate(layout.views(flat)):
            produced = self.encode_segment(index, segment)
            parts.extend(np.ascontiguousarray(p) for p in produced)
        return Encoded(self.name, tuple(parts))

    def encode_update(self, layout: ElementLayout, flat: np.ndarray, number: int) -> Encoded:
        """A worker's update number ``number`` (1, 2, ...): as ``encode``, except where a
        codec sends more at the start (``topk``'s sparsity warm-up)."""
        return self.encode(layout, flat)

    def decode(self, layout: ElementLayout, encoded: Encoded, out: np.ndarray) -> None:
        """Write the element ``encoded`` carries into ``out`` (float32, the layout's size).

        Raises ``CodecError`` (and leaves ``out`` untouched) when the codec name, the
        number of parts, a part's dtype or shape, or any value does not fit.
        """
        if encoded.codec != self.name:
            raise CodecError(f"element encoded with {encoded.codec!r}, expected {self.name!r}")
        plan = self.check_parts(layout, encoded.parts)
        for shape, parts in zip(layout.shapes, plan, strict=True):
            self.check_values(parts, shape)
        for segment, parts in zip(layout.views(out), plan, strict=True):
            self.decode_segment(parts, segment)

    def check_parts(
        self, layout: ElementLayout, parts: Sequence[np.ndarray]
    ) -> list[Sequence[np.ndarray]]:
        """The parts grouped by segment, after checking their count, dtypes and shapes
        (an override may hand them on to ``check_values`` and ``decode_segment`` in a
        form it decoded once, as ``topk`` does its index gaps)."""
        specs = [self.part_specs(shape) for shape in layout.shapes]
        wanted = sum(len(s) for s in specs)
        if len(parts) != wanted:
            raise CodecError(f"{self.name}: {len(parts)} part(s) for a network that needs {wanted}")
        grouped: list[Sequence[np.ndarray]] = []
        position = 0
        for number, segment_specs in enumerate(specs):
            group = parts[position : position + len(segment_specs)]
            for part, spec in zip(group, segment_specs, strict=True):
                if part.dtype.str != spec.dtype or tuple(part.shape) != spec.shape:
                    raise CodecError(
                        f"{self.name}: segment {number} part is {part.dtype.str} "
                        f"{list(part.shape)}, expected {spec.dtype} {list(spec.shape)}"
                    )
            grouped.append(group)
            position += len(segment_specs)
        return grouped


FLOAT32_MAX = float(np.finfo(np.float32).max)


def require_finite(codec: str, what: str, values: np.ndarray) -> None:
    """Refuse NaN and infinities in a part (a poisoned scale would poison the weights)."""
    if values.size and not np.isfinite(values).all():
        raise CodecError(f"{codec}: {what} contain NaN or infinite values")


def blocks_of(size: int, block: int) -> int:
    """How many blocks of ``block`` values cover ``size`` values (the last may be short)."""
    return math.ceil(size / block)
