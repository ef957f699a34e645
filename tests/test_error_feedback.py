"""Error feedback beyond the plain case: topk's momentum correction (the worker keeps a
shorter momentum, the server applies such updates without its own), its sparsity warm-up,
local gradient clipping (sign, topk), and refused updates taken back out of the residual
so nothing is lost or counted twice."""

from __future__ import annotations

import numpy as np
import pytest

from snet.client.compression import (
    CLIP_FACTOR,
    CLIPPED_FAMILIES,
    KEEP_SENT,
    WORKER_MOMENTUM,
    UpdateCompressor,
)
from snet.protocol.codecs import carries_momentum, parse_codec
from snet.protocol.codecs.sparse import WARMUP_DENSITY, TopKCodec
from snet.protocol.messages import ErrorMessage
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.server.update_rule import UpdateRule

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("13:7:3"))
MOMENTUM = 0.9
MU = min(MOMENTUM, WORKER_MOMENTUM)  # what a topk worker keeps
GAIN = (1 - MU) / (1 - MOMENTUM)  # so that a gradient's total effect is unchanged


def gradient(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(LAYOUT.size) * np.exp(rng.uniform(-4, 3, LAYOUT.size))
    return values.astype("<f4")


class ReferenceClip:
    """Local clipping as documented, in float64: a gradient's norm per pattern at most
    ``factor`` times the running mean (decay 0.9) of the norms returned before."""

    def __init__(self, factor: float) -> None:
        self.factor = factor
        self.mean: float | None = None

    def __call__(self, g: np.ndarray, patterns: int = 1) -> np.ndarray:
        norm = float(np.linalg.norm(g.astype(np.float64))) / patterns
        if self.factor and self.mean is not None and norm > self.factor * self.mean:
            g = g.astype(np.float64) * (self.factor * self.mean / norm)
            norm = self.factor * self.mean
        if self.factor:
            self.mean = norm if self.mean is None else 0.9 * self.mean + 0.1 * norm
        return g


def decoded(name: str, compressor: UpdateCompressor, g: np.ndarray, key: int) -> np.ndarray:
    """Compress ``g`` as update ``key`` and decode it as the server does."""
    encoded = compressor.compress(g, (1, key))
    out = LAYOUT.allocate()
    parse_codec(name).decode(LAYOUT, encoded, out)
    assert np.array_equal(out, compressor.decoded)
    return out


def test_only_topk_carries_momentum() -> None:
    assert carries_momentum("topk:0.01") and carries_momentum("topk:1")
    for name in ("none", "fp16", "int8", "sign", "powersgd:2"):
        assert not carries_momentum(name)
    assert UpdateCompressor("sign", LAYOUT, momentum=MOMENTUM).velocity is None
    assert UpdateCompressor("topk:0.1", LAYOUT, momentum=MOMENTUM).velocity is not None


def test_momentum_corrected_error_feedback_loses_nothing() -> None:
    """Sum of decoded updates + final residual == sum of the velocities u = mu u + c g."""
    compressor = UpdateCompressor("topk:0.05", LAYOUT, momentum=MOMENTUM, clip_factor=0.0)
    velocity = np.zeros(LAYOUT.size, np.float64)
    velocities = np.zeros(LAYOUT.size, np.float64)
    sent = np.zeros(LAYOUT.size, np.float64)
    for step in range(60):
        g = gradient(step)
        velocity = MU * velocity + GAIN * g
        velocities += velocity
        sent += decoded("topk:0.05", compressor, g, step)
    scale = np.abs(velocities).max()
    np.testing.assert_allclose(sent + compressor.residual, velocities, atol=2e-5 * scale)
    assert compressor.velocity is not None
    np.testing.assert_allclose(compressor.velocity, velocity, atol=1e-5 * np.abs(velocity).max())


def test_a_gradient_moves_the_weights_as_far_as_under_the_servers_momentum() -> None:
    """With nothing dropped (topk:1), gradients applied through the worker's momentum and
    without the server's end where the server's momentum takes them: every gradient moves
    the weights by learning_rate / (1 - m) times itself in all, only sooner."""
    start = gradient(99)
    dense = UpdateRule(start, MOMENTUM)
    corrected = UpdateRule(start, MOMENTUM)
    compressor = UpdateCompressor("topk:1", LAYOUT, momentum=MOMENTUM, clip_factor=0.0)
    for step in range(300):
        g = gradient(step) if step < 5 else np.zeros(LAYOUT.size, np.float32)
        dense.step([g], 128, 0.1)
        corrected.step([], 128, 0.1, direct=[decoded("topk:1", compressor, g, step)])
    np.testing.assert_allclose(corrected.weights, dense.weights, rtol=1e-4, atol=1e-4)
    assert not corrected.velocity.any()  # the server kept no momentum of its own
    assert np.abs(dense.weights - start).max() > 0.1  # it really moved


def test_a_step_without_direct_updates_is_unchanged() -> None:
    start = gradient(7)
    plain, split = UpdateRule(start, MOMENTUM), UpdateRule(start, MOMENTUM)
    for step in range(5):
        gs = [gradient(10 * step + i) for i in range(3)]
        plain.step(gs, 384, 0.2)
        split.step(gs, 384, 0.2, direct=[])
    assert np.array_equal(plain.weights, split.weights)
    mixed = UpdateRule(start, MOMENTUM)
    mixed.step([gradient(1)], 256, 0.2, direct=[gradient(2)])
    scale = np.float32(-0.2 / 256)
    expected = start + gradient(1) * scale + gradient(2) * scale
    np.testing.assert_allclose(mixed.weights, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(mixed.velocity, gradient(1) * scale)  # only the plain one
    nan = gradient(3)
    nan[0] = np.nan
    assert mixed.step([gradient(1)], 256, 0.2, direct=[nan]) is None


def test_topk_warmup_keeps_more_then_exactly_f() -> None:
    codec = TopKCodec(0.01)
    size = 10_000
    counts = [codec.warmup_kept(size, n) for n in range(1, 200)]
    assert counts[0] == round(WARMUP_DENSITY * size) and counts == sorted(counts, reverse=True)
    assert counts[-1] == codec.kept(size) == 100
    x = gradient(3)
    for number in (1, 5, 1000):
        encoded = codec.encode_update(LAYOUT, x, number)
        k = sum(p.size for p in encoded.parts[::2])
        assert k == codec.warmup_kept(LAYOUT.size, number)
        out = LAYOUT.allocate()
        parse_codec("topk:0.01").decode(LAYOUT, encoded, out)  # any count from k to size
        kept = out != 0
        assert np.array_equal(out[kept], x[kept])
        if (~kept).any():
            assert np.abs(x[~kept]).max() <= np.abs(x[kept]).min()


@pytest.mark.parametrize("name", ["sign", "int8", "topk:0.05"])
def test_a_refused_update_is_taken_back_out_of_the_error_feedback(name: str) -> None:
    """Updates 5 and 8 are refused (each found out two updates later, as when the error
    arrives while others are in flight): then the decoded updates the server applied plus
    the residual equal the sum of what the worker would owe without the refused gradients:
    the raw gradients, or for topk the velocities of the gradient stream without them
    (each gradient as clipped locally: sign and topk clip, int8 does not)."""
    mu, gain = (MU, GAIN) if carries_momentum(name) else (0.0, 1.0)
    compressor = UpdateCompressor(name, LAYOUT, momentum=MOMENTUM)
    clip = ReferenceClip(CLIP_FACTOR if name.split(":")[0] in CLIPPED_FAMILIES else 0.0)
    refused = {5, 8}
    velocity = np.zeros(LAYOUT.size, np.float64)
    owed = np.zeros(LAYOUT.size, np.float64)
    applied = np.zeros(LAYOUT.size, np.float64)
    sent: dict[int, np.ndarray] = {}
    for step in range(40):
        sent[step] = decoded(name, compressor, gradient(step), step)
        g = clip(gradient(step))
        # Without g the refused step still decays the velocity (the worker's clock is
        # its own updates): u' = mu u' + (0 if refused else c g).
        velocity = mu * velocity + (0.0 if step in refused else gain * g)
        owed += velocity
        if step - 2 in refused:
            assert compressor.refused((1, step - 2))
        elif step - 2 >= 0:
            applied += sent[step - 2]
    applied += sent[38] + sent[39]
    scale = np.abs(owed).max()
    np.testing.assert_allclose(applied + compressor.residual, owed, atol=1e-5 * scale)
    if compressor.velocity is not None:
        np.testing.assert_allclose(compressor.velocity, velocity, atol=1e-5 * scale)
    assert compressor.figures()["refusals_undone"] == 2
    assert not compressor.refused((1, 5))  # undone once only
    assert not compressor.refused((1, 39 - KEEP_SENT))  # too old to undo: left alone


@pytest.mark.parametrize("name", ["sign", "topk:0.05"])
def test_local_clipping_bounds_each_gradient_and_loses_nothing_else(name: str) -> None:
    """sign and topk scale a gradient down to CLIP_FACTOR times the running mean norm per
    pattern (the first is never clipped); error feedback then holds for the clipped ones."""
    mu, gain = (MU, GAIN) if carries_momentum(name) else (0.0, 1.0)
    compressor = UpdateCompressor(name, LAYOUT, momentum=MOMENTUM)
    assert compressor.clip_factor == CLIP_FACTOR
    clip = ReferenceClip(CLIP_FACTOR)
    velocity = np.zeros(LAYOUT.size, np.float64)
    owed = np.zeros(LAYOUT.size, np.float64)
    sent = np.zeros(LAYOUT.size, np.float64)
    first = gradient(0)
    for step in range(30):
        # A burst ten times as large at steps 5-9, as a run's first bunches bring.
        g = gradient(step) * np.float32(10.0 if 5 <= step < 10 else 1.0)
        encoded = compressor.compress(g, (1, step), patterns=128)
        out = LAYOUT.allocate()
        parse_codec(name).decode(LAYOUT, encoded, out)
        sent += out
        before = clip.mean
        kept = clip(g, 128)
        if step == 0:
            assert np.array_equal(kept, first)  # nothing to compare with yet: never clipped
        if step == 5:  # the burst: clipped to exactly the limit, in the gradient's direction
            assert before is not None and np.linalg.norm(g) / 128 > CLIP_FACTOR * before
            assert np.linalg.norm(kept) / 128 == pytest.approx(CLIP_FACTOR * before, rel=1e-6)
        velocity = mu * velocity + gain * kept
        owed += velocity
    assert 5 <= compressor.clipped < 30
    assert compressor.figures()["clipped"] == compressor.clipped
    assert compressor.clip_mean == pytest.approx(clip.mean, rel=1e-5)
    scale = np.abs(owed).max()
    np.testing.assert_allclose(sent + compressor.residual, owed, atol=2e-5 * scale)


def test_only_sign_and_topk_clip() -> None:
    for name in ("none", "fp16", "int8", "powersgd:2"):
        compressor = UpdateCompressor(name, LAYOUT)
        assert compressor.clip_factor == 0.0
        g = gradient(1)
        assert compressor.clip(g * 1000, 1) is not None and compressor.clipped == 0
    compressor = UpdateCompressor("sign", LAYOUT, clip_factor=0.0)
    g = gradient(1)
    compressor.clip(g, 1)
    assert compressor.clip(g * 100, 1) is not None and compressor.clipped == 0
    nan = gradient(2)
    nan[0] = np.nan
    clipped = UpdateCompressor("sign", LAYOUT)
    clipped.clip(nan, 1)  # refused by the server anyway: the running mean stays unset
    assert clipped.clip_mean is None


def test_a_reconnection_forgets_the_old_connections_updates() -> None:
    compressor = UpdateCompressor("topk:0.1", LAYOUT, momentum=MOMENTUM)
    compressor.compress(gradient(1), (3, 0))
    again = UpdateCompressor.reuse(compressor, "topk:0.1", LAYOUT, MOMENTUM)
    assert again is compressor and not compressor.refused((3, 0))
    assert UpdateCompressor.reuse(compressor, "topk:0.1", LAYOUT, 0.5) is not compressor


def test_a_refusal_undoes_the_update_it_names() -> None:
    compressor = UpdateCompressor("sign", LAYOUT)
    g = gradient(1)
    d = decoded("sign", compressor, g, 128)
    before = compressor.residual.copy()  # g - d
    compressor.refused_update(ErrorMessage("update_rejected", "stale", False))  # names none
    compressor.refused_update(ErrorMessage("update_rejected", "stale", False, 1, 0))  # unknown
    assert np.array_equal(compressor.residual, before)
    compressor.refused_update(ErrorMessage("update_rejected", "stale", False, 1, 128))
    np.testing.assert_allclose(compressor.residual, before + d - g, atol=1e-5)
    assert np.abs(compressor.residual).max() <= 1e-4 * np.abs(g).max()  # back to 0
    assert compressor.refusals == 1
