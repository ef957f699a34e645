"""``UpdateCompressor``: a worker's updates through a codec, with error feedback.

Each update the worker means to send is its new gradient sum g plus the residual r the
codec left out so far; the codec encodes t = g + r, the worker decodes what it sent
exactly as the server will (d), and keeps r' = t - d for the next update. So

    sum of decoded updates + final residual == sum of raw gradients

(to float rounding): compression error is delayed, never lost (1-bit SGD, Seide et al.;
EF-SGD, Karimireddy et al.). The figures for the compression ledger come from here: the
residual's norm and, every ``cosine_every`` updates, the cosine similarity between the
decoded update and the raw gradient.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from snet.protocol.codecs import parse_codec
from snet.protocol.messages import Encoded
from snet.protocol.network import ElementLayout

COSINE_EVERY = 16


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two vectors in float64 (1.0 when both are zero)."""
    na = float(np.linalg.norm(a.astype(np.float64)))
    nb = float(np.linalg.norm(b.astype(np.float64)))
    if na == 0.0 or nb == 0.0:
        return 1.0 if na == nb else 0.0
    return float(np.dot(a.astype(np.float64), b.astype(np.float64)) / (na * nb))


class UpdateCompressor:
    """Encodes gradient sums with a codec and keeps the residual (error feedback)."""

    def __init__(
        self, codec_name: str, layout: ElementLayout, cosine_every: int = COSINE_EVERY
    ) -> None:
        self.codec = parse_codec(codec_name)
        self.layout = layout
        self.cosine_every = max(1, cosine_every)
        self.residual = layout.allocate()
        self._target = layout.allocate()
        self._decoded = layout.allocate()
        self.updates = 0
        self.payload_bytes = 0
        self.cosine_last: float | None = None
        self.cosine_sum = 0.0
        self.cosine_count = 0

    @property
    def name(self) -> str:
        return self.codec.name

    @classmethod
    def reuse(
        cls, current: UpdateCompressor | None, codec_name: str, layout: ElementLayout
    ) -> UpdateCompressor | None:
        """The compressor for ``codec_name``: ``current`` (and its residual) if it fits,
        a new one if not, None for ``"none"``. A reconnecting worker keeps its residual,
        which is owed to the weights whoever holds them."""
        if codec_name == "none":
            return None
        if current is not None and current.name == codec_name and current.layout == layout:
            return current
        return cls(codec_name, layout)

    def compress(self, gradient: np.ndarray) -> Encoded:
        """The encoded update for ``gradient`` plus the residual; the residual moves on.

        Runs in the compute thread; the returned parts are new arrays, so ``gradient``
        may be overwritten as soon as this returns.
        """
        np.add(gradient, self.residual, out=self._target)
        encoded = self.codec.encode(self.layout, self._target)
        self.codec.decode(self.layout, encoded, self._decoded)
        np.subtract(self._target, self._decoded, out=self.residual)
        self.updates += 1
        self.payload_bytes += encoded.nbytes
        if self.updates % self.cosine_every == 1 or self.cosine_every == 1:
            self.cosine_last = cosine(self._decoded, gradient)
            self.cosine_sum += self.cosine_last
            self.cosine_count += 1
        return encoded

    @property
    def decoded(self) -> np.ndarray:
        """What the server decodes from the last update (for tests and figures)."""
        return self._decoded

    def figures(self) -> dict[str, Any]:
        """The worker's side of the compression ledger (sent in its WorkerReport)."""
        norm = float(np.linalg.norm(self.residual.astype(np.float64)))
        return {
            "codec": self.name,
            "updates": self.updates,
            "payload_bytes": self.payload_bytes,
            "raw_bytes": self.updates * self.layout.nbytes,
            "residual_norm": round(norm, 6) if math.isfinite(norm) else None,
            "cosine_last": None if self.cosine_last is None else round(self.cosine_last, 6),
            "cosine_mean": (
                round(self.cosine_sum / self.cosine_count, 6) if self.cosine_count else None
            ),
        }
