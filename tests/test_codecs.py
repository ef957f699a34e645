"""Codecs: each round-trips within its stated error bound, error feedback loses nothing,
malformed parts are refused before anything is written, compressed weights track the
server's, and the handshake agrees on codecs or refuses unknown ones."""

from __future__ import annotations

import math

import numpy as np
import pytest

from snet.client.compression import UpdateCompressor, cosine
from snet.client.config import WorkerConfig
from snet.protocol.codecs import parse_codec
from snet.protocol.codecs.handshake import agree_codecs, worker_capabilities
from snet.protocol.codecs.quantize import INT8_BLOCK, SIGN_BLOCK
from snet.protocol.codecs.varint import decode_gaps, encode_gaps
from snet.protocol.codecs.weights import WeightsEncoder, decode_weights
from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import CodecError, ConfigError, UnknownCodec
from snet.protocol.framing import encode_bytes
from snet.protocol.job import JobSpec
from snet.protocol.messages import Encoded, Update, Weights
from snet.protocol.network import ElementLayout, NetworkSpec

# W0 has 90,000 values: over 65536, so some topk index gaps take three varint bytes.
LAYOUT = ElementLayout.for_network(NetworkSpec.parse("300:300:10"))
SMALL = ElementLayout.for_network(NetworkSpec.parse("13:7:3"))
CODECS = ["none", "fp16", "int8", "sign", "topk:0.01", "topk:0.3", "powersgd:2"]


def gradient(seed: int, layout: ElementLayout = LAYOUT) -> np.ndarray:
    """Values over many magnitudes, some exact zeros, like a gradient sum."""
    rng = np.random.default_rng(seed)
    values = rng.standard_normal(layout.size) * np.exp(rng.uniform(-6, 4, layout.size))
    values[rng.random(layout.size) < 0.05] = 0.0
    return values.astype("<f4")


def round_trip(name: str, x: np.ndarray, layout: ElementLayout = LAYOUT) -> np.ndarray:
    codec = parse_codec(name)
    out = layout.allocate()
    parse_codec(name).decode(layout, codec.encode(layout, x), out)
    return out


def test_none_is_exact() -> None:
    x = gradient(1)
    assert np.array_equal(round_trip("none", x), x)


def test_fp16_relative_error_bound() -> None:
    x = gradient(2)
    x[:3] = [70000.0, -1e6, 65504.0]  # beyond fp16's range: clipped to +-65504
    d = round_trip("fp16", x)
    assert d[:3].tolist() == [65504.0, -65504.0, 65504.0]
    normal = (np.abs(x) >= 2**-14) & (np.abs(x) <= 65504)
    assert normal.sum() > 80_000
    assert (np.abs(x - d)[normal] <= 2**-11 * np.abs(x[normal])).all()
    assert (np.abs(x - d)[~normal & (np.abs(x) < 2**-14)] <= 2**-25).all()


def test_int8_error_is_at_most_half_a_step_of_its_block() -> None:
    x = gradient(3)
    d = round_trip("int8", x)
    for segment, decoded in zip(LAYOUT.views(x), LAYOUT.views(d), strict=True):
        flat, got = segment.reshape(-1), decoded.reshape(-1)
        for start in range(0, flat.size, INT8_BLOCK):
            block = flat[start : start + INT8_BLOCK]
            step = np.abs(block).max() / 127
            error = np.abs(block - got[start : start + INT8_BLOCK])
            assert (error <= step / 2 * (1 + 1e-5) + 1e-30).all()


def test_sign_block_error_is_exactly_energy_minus_scale_energy() -> None:
    x = gradient(4)
    d = round_trip("sign", x)
    for segment, decoded in zip(LAYOUT.views(x), LAYOUT.views(d), strict=True):
        flat, got = segment.reshape(-1).astype(np.float64), decoded.reshape(-1)
        for start in range(0, flat.size, SIGN_BLOCK):
            block, out = flat[start : start + SIGN_BLOCK], got[start : start + SIGN_BLOCK]
            scale = np.abs(block).mean()
            assert np.allclose(np.abs(out), scale, rtol=1e-6)
            assert (np.sign(out) == np.where(block >= 0, 1, -1)).all()
            error = ((block - out) ** 2).sum()
            assert error == pytest.approx((block**2).sum() - block.size * scale**2, rel=1e-4)
            assert error <= (block**2).sum() * (1 + 1e-6)


@pytest.mark.parametrize("name", ["topk:0.01", "topk:0.3", "topk:1"])
def test_topk_keeps_the_largest_exactly(name: str) -> None:
    fraction = float(name.split(":")[1])
    x = gradient(5)
    encoded = parse_codec(name).encode(LAYOUT, x)
    assert [p.dtype.str for p in encoded.parts[::2]] == ["|u1"] * 4  # varint index gaps
    assert sum(p.size for p in encoded.parts[1::2]) == math.ceil(fraction * LAYOUT.size)
    if fraction < 0.1:  # gaps mostly under 128: well under 2 bytes per index
        assert sum(p.size for p in encoded.parts[::2]) < 1.6 * math.ceil(fraction * LAYOUT.size)
    d = round_trip(name, x)
    kept = d != 0
    assert kept.sum() <= math.ceil(fraction * x.size)
    assert np.array_equal(d[kept], x[kept])  # kept values are exact
    if (~kept).any():
        assert np.abs(x[~kept]).max() <= np.abs(x[kept]).min()  # over the whole element


def test_powersgd_is_a_projection_and_exact_on_low_rank() -> None:
    rng = np.random.default_rng(6)
    x = gradient(6)
    d = round_trip("powersgd:2", x)
    for segment, decoded in zip(LAYOUT.views(x), LAYOUT.views(d), strict=True):
        if segment.ndim == 1:
            assert np.array_equal(segment, decoded)  # biases travel uncompressed
        else:
            assert np.linalg.norm(segment - decoded) <= np.linalg.norm(segment) * (1 + 1e-5)
    low = LAYOUT.allocate()
    for view in LAYOUT.views(low):
        if view.ndim == 2:
            a, b = rng.standard_normal((view.shape[0], 2)), rng.standard_normal((2, view.shape[1]))
            view[...] = a @ b
    d = round_trip("powersgd:2", low)
    assert np.linalg.norm(d - low) <= 1e-4 * np.linalg.norm(low)


def test_powersgd_warm_start_converges_on_a_fixed_matrix() -> None:
    codec, x, out = parse_codec("powersgd:4"), gradient(7, SMALL), SMALL.allocate()
    errors = []
    for _ in range(8):
        codec.decode(SMALL, codec.encode(SMALL, x), out)
        errors.append(float(np.linalg.norm(out - x)))
    assert errors[-1] < errors[0]


@pytest.mark.parametrize("name", CODECS)
def test_error_feedback_loses_nothing(name: str) -> None:
    # Local clipping (on for sign and topk) is tested in test_error_feedback.py.
    compressor = UpdateCompressor(name, SMALL, cosine_every=1, clip_factor=0.0)
    raw_sum = np.zeros(SMALL.size, np.float64)
    decoded_sum = np.zeros(SMALL.size, np.float64)
    for step in range(40):
        g = gradient(100 + step, SMALL)
        encoded = compressor.compress(g)
        out = SMALL.allocate()
        parse_codec(name).decode(SMALL, encoded, out)  # what the server will apply
        assert np.array_equal(out, compressor.decoded)
        raw_sum += g
        decoded_sum += out
    scale = np.abs(raw_sum).max()
    np.testing.assert_allclose(decoded_sum + compressor.residual, raw_sum, atol=1e-5 * scale)
    figures = compressor.figures()
    assert figures["updates"] == 40 and figures["codec"] == parse_codec(name).name
    assert -1.0 <= figures["cosine_mean"] <= 1.0
    if name == "none":
        assert figures["residual_norm"] == 0.0 and figures["cosine_last"] == pytest.approx(1.0)


def test_cosine() -> None:
    a = np.array([1.0, 0.0], np.float32)
    assert cosine(a, a) == pytest.approx(1.0)
    assert cosine(a, -a) == pytest.approx(-1.0)
    assert cosine(a, np.zeros(2, np.float32)) == 0.0


# ---------------------------------------------------------------- malformed parts


def _mutations(name: str, encoded: Encoded) -> list[tuple[str, tuple[np.ndarray, ...]]]:
    parts = [p.copy() for p in encoded.parts]
    cases: list[tuple[str, tuple[np.ndarray, ...]]] = [
        ("part", tuple(parts[:-1])),
        ("part", (*parts, parts[-1])),
        ("expected", (parts[0].astype("<f8"), *parts[1:])),
        # one item too many in the first part (for topk: one index varint too many)
        ("expected|indices for", (np.append(parts[0], parts[0][:1]), *parts[1:])),
    ]
    if name in ("int8", "sign"):
        for bad, why in ((np.nan, "NaN"), (np.inf, "NaN"), (-1.0, "negative")):
            scales = parts[0].copy()
            scales[-1] = bad
            cases.append((why, (scales, *parts[1:])))
    if name.startswith("topk"):
        w0 = decode_gaps(parts[0], parts[1].size, name)  # segment 0: W0, 90,000 values
        past_the_end = np.append(w0[:-1], 90000)
        cases.append(("out of range", (encode_gaps(past_the_end), *parts[1:])))
        cases.append(("inside a varint", (np.append(parts[0], np.uint8(0x81)), *parts[1:])))
        cases.append(("indices for", (np.append(parts[0], np.uint8(3)), *parts[1:])))
        six = np.array([0x80, 0x80, 0x80, 0x80, 0x80, 0x01], np.uint8)
        cases.append(("longer than", (np.append(parts[0][:-1], six), *parts[1:])))
        overlong = np.append(parts[0][:-1], [0x81, 0x00]).astype("|u1")
        cases.append(("overlong", (overlong, *parts[1:])))
        values = parts[1].copy()
        values[0] = np.nan
        cases.append(("NaN", (parts[0], values, *parts[2:])))
        # One value fewer in all: the lengths no longer add up to k.
        cases.append(("values, expected", (parts[0][:-1].copy(), parts[1][:-1].copy(), *parts[2:])))
        cases.append(("expected |u1", (parts[0].astype("<u2"), *parts[1:])))
    if name.startswith("powersgd"):
        p = parts[0].copy()
        p[0, 0] = np.inf
        cases.append(("NaN", (p, *parts[1:])))
        cases.append(("expected", (parts[0][:, :1].copy(), *parts[1:])))  # rank 1, not 2
    return cases


@pytest.mark.parametrize("name", CODECS)
def test_malformed_parts_are_refused_and_nothing_is_written(name: str) -> None:
    codec = parse_codec(name)
    encoded = codec.encode(LAYOUT, gradient(8))
    for why, parts in _mutations(name, encoded):
        out = np.full(LAYOUT.size, 7.0, np.float32)
        with pytest.raises(CodecError, match=why):
            parse_codec(name).decode(LAYOUT, Encoded(encoded.codec, parts), out)
        assert (out == 7.0).all(), why
    with pytest.raises(CodecError, match="expected"):
        parse_codec(name).decode(LAYOUT, Encoded("int8" if name != "int8" else "sign", ()), out)


@pytest.mark.parametrize(
    "name",
    ["zstd", "topk", "topk:0", "topk:1.5", "topk:nan", "powersgd:0", "powersgd:x", "",
     # taken before (a probe): a colon with nothing after it, int()'s and float()'s
     # underscores and other scripts' digits
     "fp16:", "sign:", "none:", "topk:", "topk:0_1", "powersgd:1_0", "powersgd:\u0662"],
)  # fmt: skip
def test_unknown_codec_names(name: str) -> None:
    with pytest.raises(ConfigError):
        parse_codec(name)


def test_canonical_names() -> None:
    assert parse_codec("topk:.010").name == "topk:0.01"
    assert JobSpec(compress=" topk:0.10").compress == "topk:0.1"
    assert WorkerConfig(compress="powersgd:04", weights_codec="delta:topk:.5").weights_codec == (
        "delta:topk:0.5"
    )
    with pytest.raises(ConfigError, match="known: none, fp16"):
        JobSpec(compress="zstd")
    with pytest.raises(ConfigError, match="weights codec"):
        WorkerConfig(weights_codec="int8")
    assert WorkerConfig(weights_codec=" delta:none").weights_codec == "none"  # same bytes
    assert agree_codecs(("weights:delta:none",), "none")["weights"] == "none"  # older workers


# ---------------------------------------------------------------- the wire


def test_encoded_update_round_trips_through_frames_byte_by_byte() -> None:
    encoded = parse_codec("topk:0.01").encode(LAYOUT, gradient(9))
    message = Update(3, 4, 128, 128, 1.5, 7, 0.25, encoded=encoded)
    frame = encode_bytes(message)
    decoder = FrameDecoder()
    got = [m for i in range(len(frame)) for m in decoder.feed(frame[i : i + 1])]
    assert len(got) == 1 and got[0] == message
    assert isinstance(got[0], Update) and got[0].encoded is not None
    assert got[0].encoded.codec == "topk:0.01" and got[0].element.size == 0
    for a, b in zip(got[0].encoded.parts, encoded.parts, strict=True):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert decoder.received.bytes == {"update": len(frame)}


# ---------------------------------------------------------------- weights to workers


@pytest.mark.parametrize("form", ["fp16", "delta:int8", "delta:sign", "delta:topk:0.05"])
def test_compressed_weights_follow_the_servers(form: str) -> None:
    encoder = WeightsEncoder(form, SMALL)
    rng = np.random.default_rng(10)
    weights = gradient(11, SMALL)
    held, held_version = None, -1
    for version in range(60):
        weights = weights + 0.05 * rng.standard_normal(SMALL.size).astype("<f4")
        sent = encoder.prepare(Weights(version, 0, 0.1, 0, weights.copy()))
        assert isinstance(sent, Weights)
        if version == 0:  # the first copy is always whole float32
            assert sent.encoded is None and sent.delta_from == -1
        else:
            assert sent.encoded is not None
            assert sent.delta_from == (held_version if form.startswith("delta") else -1)
        out = SMALL.allocate()
        decode_weights(SMALL, sent, held, held_version, out)
        held, held_version = out, version
    assert held is not None
    error = np.linalg.norm(held - weights) / np.linalg.norm(weights)
    assert error < {"fp16": 1e-3, "delta:int8": 1e-2}.get(form, 0.5), error
    assert encoder.payload_bytes < encoder.raw_bytes
    encoder.request_full()  # a resync: the next copy is whole float32 again
    full = encoder.prepare(Weights(60, 0, 0.1, 0, weights.copy()))
    assert isinstance(full, Weights) and full.encoded is None
    assert np.array_equal(full.element, weights)


@pytest.mark.parametrize("form", ["none", "fp16", *(f"delta:{codec}" for codec in CODECS)])
def test_every_weights_form_a_worker_accepts_crosses_the_wire(form: str) -> None:
    """What the server's encoder makes of each form the worker's flag accepts is framed,
    decoded by the worker's frame decoder and applied to its copy. ``delta:none`` made
    frames of per-layer float32 parts that the decoder refused (a frame whose codec is
    "none" is one unencoded array): the worker reconnected and trained a bunch per
    connection until its retry window ran out; it is taken as ``none`` now."""
    form = WorkerConfig(weights_codec=form).weights_codec
    encoder = WeightsEncoder(form, SMALL)
    decoder = FrameDecoder()
    weights = gradient(14, SMALL)
    held, held_version = None, -1
    for version in range(3):
        weights = weights + np.float32(0.01) * gradient(15 + version, SMALL)
        sent = encoder.prepare(Weights(version, 0, 0.1, 0, weights.copy()))
        (got,) = decoder.feed(encode_bytes(sent))
        assert isinstance(got, Weights) and got.version == version
        out = SMALL.allocate()
        decode_weights(SMALL, got, held, held_version, out)
        held, held_version = out, version
    assert held is not None
    error = np.linalg.norm(held - weights) / np.linalg.norm(weights)
    assert error < 0.5, error
    if form in ("none", "delta:none"):
        assert np.array_equal(held, weights)


def test_a_delta_from_a_version_not_held_is_refused() -> None:
    encoder = WeightsEncoder("delta:int8", SMALL)
    encoder.prepare(Weights(0, 0, 0.1, 0, gradient(12, SMALL)))
    delta = encoder.prepare(Weights(1, 0, 0.1, 0, gradient(13, SMALL)))
    assert isinstance(delta, Weights) and delta.delta_from == 0
    out = np.full(SMALL.size, 3.0, np.float32)
    with pytest.raises(CodecError, match="delta from version 0"):
        decode_weights(SMALL, delta, SMALL.allocate(), 5, out)
    with pytest.raises(CodecError, match="holds none"):
        decode_weights(SMALL, delta, None, -1, out)


# ---------------------------------------------------------------- the handshake


def test_agreement() -> None:
    every = worker_capabilities("", "none")
    assert agree_codecs(every, "sign") == {"update": "sign", "weights": "none"}
    assert agree_codecs(worker_capabilities("int8", "fp16"), "sign") == {
        "update": "int8",
        "weights": "fp16",
    }
    # An old worker that lists only codec:none gets float32 whatever the job says.
    assert agree_codecs(("codec:none",), "topk:0.01")["update"] == "none"
    assert agree_codecs((), "none") == {"update": "none", "weights": "none"}
    with pytest.raises(UnknownCodec, match="known: none, fp16, int8, sign, topk:F, powersgd:R"):
        agree_codecs(("compress:zstd",), "none")
    with pytest.raises(UnknownCodec, match="weights"):
        agree_codecs(("weights:delta:zstd",), "none")


def test_a_reconnecting_worker_keeps_its_compressor_and_residual() -> None:
    first = UpdateCompressor.reuse(None, "sign", SMALL)
    assert first is not None
    first.compress(gradient(20, SMALL))
    assert UpdateCompressor.reuse(first, "sign", SMALL) is first  # the residual is kept
    assert UpdateCompressor.reuse(first, "int8", SMALL) is not first
    assert UpdateCompressor.reuse(first, "none", SMALL) is None


def test_a_worker_joining_another_job_starts_a_fresh_residual() -> None:
    """A worker that followed its port to another server's job brought its residual,
    made of the old job's gradients, into the new run's weights (25 times a fresh one's)."""
    from snet.client.joining import Handshake
    from snet.protocol.job import JobSpec

    job = JobSpec(compress="sign")
    _, first = Handshake._agree(job, {"update": "sign"}, None)
    assert first is not None
    first.compress(gradient(20, first.layout))
    assert Handshake._agree(job, {"update": "sign"}, first, job)[1] is first  # reconnected
    other = job.with_changes(seed=job.seed + 1)
    assert Handshake._agree(other, {"update": "sign"}, first, job)[1] is not first
