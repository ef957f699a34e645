"""``UpdateCompressor``: a worker's updates through a codec, with error feedback.

Each update the worker means to send is its new gradient sum g plus the residual r the
codec left out so far; the codec encodes t = g + r, the worker decodes what it sent
exactly as the server will (d), and keeps r' = t - d for the next update. So

    sum of decoded updates + final residual == sum of raw gradients

(to float rounding): compression error is delayed, never lost (1-bit SGD, Seide et al.;
EF-SGD, Karimireddy et al.).

With a momentum-corrected codec (``topk``, see ``carries_momentum``) the worker keeps the
momentum itself, as Deep Gradient Compression does (Lin et al.), and the server applies
such updates without its own: the worker encodes t = u + r after u = mu u + c g. With the
job's momentum m, mu = min(m, WORKER_MOMENTUM) and c = (1 - mu) / (1 - m), so that every
gradient still moves the weights by learning_rate / (1 - m) times itself in all, as under
the server's momentum, but over fewer steps. (Measured: a coordinate that travels once
in ~100 updates is delayed enough; momentum's spreading on top of that cost the first
epoch half its progress. See docs/compression.md.) The sum of decoded updates plus the
final residual is then the sum of the velocities u.

The codecs that leave most of an update to later ones (``sign``, ``topk``; see
``CLIPPED_FAMILIES``) clip each gradient sum first, as Deep Gradient Compression's *local
gradient clipping* does: its norm per pattern may be at most ``CLIP_FACTOR`` times the
running mean (``CLIP_AVERAGING``) of the norms this worker sent before, else the sum is
scaled down to that. The threshold needs no constant of the job's scale, and in the first
updates, whose gradients grow from small to ten times larger within a few bunches, it
works as a warm-up of the learning rate. Without it, a worker that steps alone at the
start (the others still starting: every update of it is then a whole step) piles up
residuals and bursts that saturate most hidden units in a dozen steps, and the run ends
3-4 points down (measured by replaying such runs, docs/compression.md). The sums above
then hold for the clipped gradients; what clipping removes is dropped, as any gradient
clipping does.

A refused update was never applied, and its frames are trained again elsewhere: the
worker takes its gradient back out (``refused``) and puts back what the update carried
from earlier residuals, so the sums above hold over the updates actually applied. It
keeps what that needs for the last few updates it sent (``KEEP_SENT``).

The figures for the compression ledger come from here: the
residual's norm and, every ``cosine_every`` updates, the cosine similarity between the
decoded update and the raw gradient.
"""

from __future__ import annotations

import logging
import math
from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from snet.protocol.codecs import ElementCodec, parse_codec
from snet.protocol.errors import RejectedUpdate
from snet.protocol.messages import Encoded, ErrorMessage
from snet.protocol.network import ElementLayout

if TYPE_CHECKING:
    from .policies import Compute

COSINE_EVERY = 16
CLIPPED_FAMILIES = ("sign", "topk")  # codecs whose updates are clipped locally (see above)
CLIP_FACTOR = 1.2  # a gradient's norm per pattern is at most this times the running mean
CLIP_AVERAGING = 0.9  # the running mean's decay per update
WORKER_MOMENTUM = 0.5  # the most momentum a momentum-corrected worker keeps itself
KEEP_SENT = 8  # updates whose refusal can still be undone (at most max_in_flight are open)

log = logging.getLogger("snet.worker")

UpdateKey = tuple[int, int]  # (lease_id, offset): names an update on one connection


@dataclass
class _Sent:
    """What undoing one sent update needs: its raw gradient, its parts, its number."""

    gradient: np.ndarray
    encoded: Encoded
    number: int


def _settings(
    codec: ElementCodec, momentum: float, clip_factor: float | None
) -> tuple[float, float, float]:
    """(worker momentum, gradient gain, clip factor) of a compressor for ``codec`` in a job
    with ``momentum``; ``clip_factor`` None for the codec's default.

    The worker keeps a momentum and a gain only for momentum-corrected codecs, with
    gain / (1 - worker momentum) = 1 / (1 - job momentum): the total of a gradient's effect.
    """
    if codec.momentum_corrected:
        worker_momentum = min(momentum, WORKER_MOMENTUM)
        gain = (1.0 - worker_momentum) / (1.0 - momentum)
    else:
        worker_momentum, gain = 0.0, 1.0
    if clip_factor is None:
        clip_factor = CLIP_FACTOR if codec.family in CLIPPED_FAMILIES else 0.0
    return worker_momentum, gain, clip_factor


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
        self,
        codec_name: str,
        layout: ElementLayout,
        cosine_every: int = COSINE_EVERY,
        momentum: float = 0.0,
        clip_factor: float | None = None,
    ) -> None:
        """``clip_factor``: the local clipping threshold as a multiple of the running
        mean norm (0 for none); by default ``CLIP_FACTOR`` for ``CLIPPED_FAMILIES``."""
        self.codec = parse_codec(codec_name)
        self.layout = layout
        self.cosine_every = max(1, cosine_every)
        self.momentum, self.gain, self.clip_factor = _settings(self.codec, momentum, clip_factor)
        self.velocity = layout.allocate() if self.codec.momentum_corrected else None
        self.residual = layout.allocate()
        self.clip_mean: float | None = None  # running mean norm per pattern of what was sent
        self.clipped = 0  # updates whose gradient was scaled down
        # Where a clipped gradient is written (only codecs that clip need one).
        self._scaled_down = layout.allocate() if self.clip_factor else None
        self._sent: OrderedDict[UpdateKey, _Sent] = OrderedDict()
        self.refusals = 0
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
        cls,
        current: UpdateCompressor | None,
        codec_name: str,
        layout: ElementLayout,
        momentum: float = 0.0,
    ) -> UpdateCompressor | None:
        """The compressor for ``codec_name``: ``current`` (and its residual) if it fits,
        a new one if not, None for ``"none"``. A reconnecting worker keeps its residual,
        which is owed to the weights whoever holds them; the updates it sent on the old
        connection can no longer be named, so their refusals are forgotten."""
        if codec_name == "none":
            return None
        if (
            current is not None
            and current.name == codec_name
            and current.layout == layout
            and (current.momentum, current.gain, current.clip_factor)
            == _settings(current.codec, momentum, None)
        ):
            current._sent.clear()
            return current
        return cls(codec_name, layout, momentum=momentum)

    def clip(self, gradient: np.ndarray, patterns: int) -> np.ndarray:
        """``gradient`` (a sum over ``patterns``), or a scaled-down copy of it when its
        norm per pattern exceeds ``clip_factor`` times the running mean; the running mean
        moves on with what is returned. The first gradient is never clipped."""
        if not self.clip_factor:
            return gradient
        norm = float(np.linalg.norm(gradient)) / max(patterns, 1)
        if not math.isfinite(norm):  # the server refuses it; keep the mean finite
            return gradient
        limit = None if self.clip_mean is None else self.clip_factor * self.clip_mean
        if limit is not None and norm > limit:
            assert self._scaled_down is not None  # allocated when clip_factor is set
            np.multiply(gradient, np.float32(limit / norm), out=self._scaled_down)
            gradient, norm = self._scaled_down, limit
            self.clipped += 1
        mean = self.clip_mean
        self.clip_mean = norm if mean is None else mean + (1 - CLIP_AVERAGING) * (norm - mean)
        return gradient

    def compress(
        self, gradient: np.ndarray, key: UpdateKey | None = None, patterns: int = 1
    ) -> Encoded:
        """The encoded update for ``gradient`` (a sum over ``patterns``, clipped first,
        see ``clip``) plus the residual; the residual moves on.

        ``key`` names the update (lease id, offset), so that ``refused(key)`` can undo it.
        Runs in the compute thread; the returned parts are new arrays, so ``gradient``
        may be overwritten as soon as this returns.
        """
        gradient = self.clip(gradient, patterns)
        if self.velocity is not None:
            self.velocity *= np.float32(self.momentum)
            self.velocity += np.float32(self.gain) * gradient
            np.add(self.velocity, self.residual, out=self._target)
        else:
            np.add(gradient, self.residual, out=self._target)
        encoded = self.codec.encode_update(self.layout, self._target, self.updates + 1)
        self.codec.decode(self.layout, encoded, self._decoded)
        np.subtract(self._target, self._decoded, out=self.residual)
        self.updates += 1
        if key is not None:
            self._sent[key] = _Sent(gradient.copy(), encoded, self.updates)
            while len(self._sent) > KEEP_SENT:
                self._sent.popitem(last=False)
        self.payload_bytes += encoded.nbytes
        if self.updates % self.cosine_every == 1 or self.cosine_every == 1:
            self.cosine_last = cosine(self._decoded, gradient)
            self.cosine_sum += self.cosine_last
            self.cosine_count += 1
        return encoded

    def computed(
        self,
        compute: Compute,
        weights: np.ndarray,
        frames: np.ndarray,
        scratch: np.ndarray,
        rate: float,
        key: UpdateKey,
    ) -> tuple[float, int, int, Encoded]:
        """Compute thread: the update ``compute`` makes in ``scratch`` (a gradient sum, or a
        block's delta), then its encoding with error feedback (``compress``)."""
        loss, correct, count = compute(weights, frames, scratch, rate)
        return loss, correct, count, self.compress(scratch, key, count)

    def refused_update(self, message: ErrorMessage) -> None:
        """The server refused an update (``message``): undo it if it was one of ours that
        it names (the compute thread is idle: this runs between bunches, on the event
        loop)."""
        if message.code != RejectedUpdate.code or message.lease_id < 0:
            return
        if not self.refused((message.lease_id, message.offset)):
            log.warning(
                "refused update (lease %d, offset %d) is not among the last sent; its "
                "residual share is lost", message.lease_id, message.offset,
            )  # fmt: skip

    def refused(self, key: UpdateKey) -> bool:
        """The server refused the update ``key``: undo it. False if it is not known.

        The update's gradient g leaves the sums (its frames are trained again), and what
        the update carried goes back into the residual: r += d - c g (1 + mu + ... + mu^n),
        u -= mu^n c g, n being the updates encoded since (c the gain, mu the worker's
        momentum; c = 1 and no velocity for codecs that are not momentum-corrected). After
        this the residual is exactly what it would be had g never been computed and the
        update's parts never sent.
        """
        sent = self._sent.pop(key, None)
        if sent is None:
            return False
        # This runs on the worker's event loop: no element-sized temporaries. The target
        # buffer is free between updates (compress fills it anew).
        scratch = self._target
        self.codec.decode(self.layout, sent.encoded, scratch)
        self.residual += scratch
        later = self.updates - sent.number
        owed = self.gain * sum(self.momentum**j for j in range(later + 1))
        self.residual -= np.multiply(sent.gradient, np.float32(owed), out=scratch)
        if self.velocity is not None:
            carried = np.float32(self.gain * self.momentum**later)
            self.velocity -= np.multiply(sent.gradient, carried, out=scratch)
        self.refusals += 1
        return True

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
            "refusals_undone": self.refusals,
            "clipped": self.clipped,
            "payload_bytes": self.payload_bytes,
            "raw_bytes": self.updates * self.layout.nbytes,
            "residual_norm": round(norm, 6) if math.isfinite(norm) else None,
            "cosine_last": None if self.cosine_last is None else round(self.cosine_last, 6),
            "cosine_mean": (
                round(self.cosine_sum / self.cosine_count, 6) if self.cosine_count else None
            ),
        }
