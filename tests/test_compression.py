"""Compressed updates and weights with a real server: malformed payloads are refused and
never applied, codecs are agreed or refused at the handshake, a worker can always get a
full float32 copy, and compressed training reports its ledger in /status and /metrics."""

from __future__ import annotations

import re
import signal

import numpy as np
import pytest

from snet.cli.status import render
from snet.protocol.codecs import parse_codec
from snet.protocol.codecs.sparse import TopKCodec
from snet.protocol.codecs.varint import decode_gaps, encode_gaps
from snet.protocol.messages import (
    Encoded,
    ErrorMessage,
    Heartbeat,
    Hello,
    Lease,
    Resync,
    ServerHello,
    Update,
    Weights,
    WorkerReport,
)
from snet.protocol.network import ElementLayout, NetworkSpec

from async_raw import AsyncRawClient
from helpers import SMALL_JOB, Cluster, wait_until
from inprocess import Lab, LabServer
from inprocess import wait_until as wait_in_lab
from sequential_replay import load_weights

LAYOUT = ElementLayout.for_network(NetworkSpec.parse("117:64:10"))
TOPK = "topk:0.01"


def _update(lease: Lease, offset: int, encoded: Encoded, base: int = 0) -> Update:
    return Update(base, lease.lease_id, offset, 128, 1.0, 0, 0.01, encoded=encoded)


def _replaced(encoded: Encoded, index: int, part: np.ndarray) -> Encoded:
    parts = list(encoded.parts)
    parts[index] = part
    return Encoded(encoded.codec, tuple(parts))


async def test_malformed_compressed_updates_are_refused_and_never_applied(lab: Lab) -> None:
    server = await lab.server(
        "--mode", "async", "--epochs", "1", "--linger-seconds", "30", *SMALL_JOB
    )
    weights_before = await server.get("/weights")

    unknown = await AsyncRawClient.connect(server.port, "unknown-codec")
    await unknown.receive(ServerHello)
    await unknown.send(Hello(1, "unknown-codec", "raw", ("compress:zstd",), b""))
    refusal = await unknown.receive(ErrorMessage)
    assert refusal.fatal and refusal.code == "unknown_codec" and "topk:F" in refusal.text
    assert await unknown.closed_by_peer()

    client = await AsyncRawClient.connect(server.port, "bad-encodings")
    welcome = await client.handshake(("codec:topk", f"compress:{TOPK}", "weights:delta:int8"))
    assert welcome.codecs == {"update": TOPK, "weights": "delta:int8"}
    first = await client.receive(Weights)
    assert first.encoded is None and first.delta_from == -1  # a whole float32 copy first
    lease = await client.receive(Lease)
    gradient = np.ones(LAYOUT.size, np.float32)
    gradient[: 117 * 64] = 10.0  # top-k takes all its values from W0 (7488 values)
    good = parse_codec(TOPK).encode(LAYOUT, gradient)
    assert good.parts[1].size == 83 and all(p.size == 0 for p in good.parts[2:])
    w0 = decode_gaps(good.parts[0], 83, TOPK)
    indices = encode_gaps(np.append(w0[:-1], 117 * 64))  # one past the end of W0
    unfinished = np.append(good.parts[0], np.uint8(0x81))  # ends inside a varint
    nan_values = good.parts[1].copy()
    nan_values[3] = np.nan
    bad = [
        (_replaced(good, 0, indices), "out of range"),
        (_replaced(good, 0, unfinished), "inside a varint"),
        (_replaced(good, 1, nan_values), "NaN"),
        (_replaced(good, 1, good.parts[1][:-1].copy()), "expected"),  # wrong length
        (Encoded(TOPK, good.parts[:-1]), "part"),
        (parse_codec("sign").encode(LAYOUT, np.ones(LAYOUT.size, np.float32)), "agreed"),
    ]
    offset = 0
    for encoded, why in bad:
        await client.send(_update(lease, offset, encoded))
        refusal = await client.receive(ErrorMessage)
        assert not refusal.fatal and refusal.code == "update_rejected", refusal
        assert why in refusal.text, (why, refusal.text)
        # The refusal names the update, so that the worker can undo its error feedback.
        assert (refusal.lease_id, refusal.offset) == (lease.lease_id, offset)
        offset += 128
    await client.send(
        Update(0, lease.lease_id, offset, 128, 1.0, 0, 0.01, np.ones(LAYOUT.size, "f4"))
    )
    refusal = await client.receive(ErrorMessage)
    assert "float32, agreed codec is topk:0.01" in refusal.text
    assert (refusal.lease_id, refusal.offset) == (lease.lease_id, offset)
    offset += 128

    status = await server.status()
    assert status["updates_rejected"] == len(bad) + 1 and status["weight_version"] == 0
    assert await server.get("/weights") == weights_before  # bit for bit
    row = next(r for r in status["workers"] if r["name"] == "bad-encodings")
    assert row["compression"]["undecodable"] == len(bad)
    assert row["compression"]["update_codec"] == TOPK

    # A well-formed update after all that is applied, and the weights come as a delta.
    await client.send(_update(lease, offset, good))
    await wait_in_lab(lambda: _version_is(server, 1), 10, "the good update")
    delta = await client.receive(Weights)
    while delta.version < 1:
        delta = await client.receive(Weights)
    assert delta.encoded is not None and delta.encoded.codec == "delta:int8"[6:]
    assert delta.delta_from == 0
    await client.send(Resync("testing"))  # a worker can always ask for a whole float32 copy
    full = await client.receive(Weights)
    assert full.encoded is None and full.delta_from == -1 and full.version == 1
    served = np.concatenate([a.ravel() for a in _npz(await server.get("/weights"))])
    assert np.array_equal(full.element, served)
    await client.send(Heartbeat(0.0))  # the connection survived everything
    await client.send(
        WorkerReport(0.0, {"compression": {"residual_norm": 2.5, "cosine_last": 0.9}})
    )

    async def figures_in() -> bool:
        rows = (await server.status())["workers"]
        row = next(r for r in rows if r["name"] == "bad-encodings")
        return bool(row["compression"]["residual_norm"] == 2.5)

    await wait_in_lab(figures_in, 10, "the worker's compression figures")
    await client.close()


async def _version_is(server: LabServer, version: int) -> bool:
    return bool((await server.status())["weight_version"] == version)


def _npz(payload: bytes) -> list[np.ndarray]:
    import io

    with np.load(io.BytesIO(payload)) as data:
        layers = len([k for k in data.files if k.startswith("W")])
        return [data[f"{kind}{i}"] for i in range(layers) for kind in ("W", "b")]


@pytest.mark.system
def test_compressed_training_reports_its_ledger(cluster: Cluster) -> None:
    server = cluster.server(
        "--mode",
        "async",
        "--epochs",
        "1",
        "--compress",
        "sign",
        "--linger-seconds",
        "60",  # read after training: under load 5 s ran out before the reads (refused)
        *SMALL_JOB,
    )
    workers = [
        cluster.worker(server, "by-job"),  # takes the job's codec
        cluster.worker(server, "own-codec", "--compress", TOPK, "--weights-codec", "delta:int8"),
    ]
    wait_until(lambda: server.status()["state"] == "trained", 90, "training to finish")

    def reported() -> dict | None:
        document = server.status()
        rows = [r["compression"] for r in document["workers"]]
        return document if all(r["residual_norm"] is not None for r in rows) else None

    status = wait_until(reported, 10, "both workers' residual norms")
    assert status["cv_accuracy"] > 0.5, status["epochs"]
    ledger = status["epochs"][0]["ledger"]
    assert ledger["used_once"] == ledger["frames"]
    rows = {r["name"]: r["compression"] for r in status["workers"]}
    # its weights through the board (the default, on the server's machine): no bytes to count
    assert rows["by-job"]["update_codec"] == "sign" and rows["by-job"]["weights_codec"] == "shared"
    assert rows["own-codec"]["update_codec"] == TOPK
    assert rows["own-codec"]["weights_codec"] == "delta:int8"
    assert rows["by-job"]["received_ratio"] > 15  # frames included; 117:64:10 is small
    # topk's warm-up (about 4 elements' worth per worker, once) weighs on a 1-epoch job, the
    # more the fewer updates this worker got: hold it to what its schedule allows. A kept
    # value costs 4 bytes and an index gap of at most 3, an update's frame well under
    # 400 bytes more, and the worker's other frames (hello, reports) under 20 kB.
    updates, size = rows["own-codec"]["updates"], NetworkSpec.parse(SMALL_JOB[1]).connections
    codec = parse_codec(TOPK)
    assert isinstance(codec, TopKCodec)
    kept = sum(codec.warmup_kept(size, n) for n in range(1, updates + 1))
    most = kept * 7 + updates * 400 + 20_000
    assert rows["own-codec"]["received_ratio"] > updates * size * 4 / most
    assert rows["own-codec"]["sent_ratio"] > 2.5
    for row in rows.values():
        assert row["updates"] > 10 and row["undecodable"] == 0
        assert row["residual_norm"] > 0 and 0.0 < row["cosine_mean"] <= 1.0
    total = status["compression"]
    assert total["updates"] == sum(r["updates"] for r in rows.values())
    assert total["update_codecs"] == {"sign": 1, TOPK: 1}
    assert total["received_raw_bytes"] > 15 * total["received_bytes"]
    line = next(x for x in render(status).splitlines() if x.startswith("compression:"))
    assert "sign x1" in line and "topk:0.01 x1" in line  # snet status
    metrics = server.get("/metrics").decode()
    assert 'snet_compression_ratio{direction="received"}' in metrics
    assert re.search(
        r'snet_worker_residual_norm\{worker_id="\d+",worker="own-codec",backend="\w+",'
        r'codec="topk:0.01"\}',
        metrics,
    )
    assert "snet_worker_update_cosine" in metrics
    for worker in workers:
        assert worker.wait(60) == 0
    server.process.send_signal(signal.SIGTERM)  # read: it need not linger on
    assert server.wait(60) == 0
    assert load_weights(server.out_dir / "weights.npz")
