"""The live dashboard at GET /: served self-contained, fed by /events (in process), and
seen working in a real headless Chromium while a server trains with two worker processes."""

from __future__ import annotations

import asyncio
import json
import re
import socket
import struct
from typing import Any

import pytest

from bench.browser import Browser, find_chromium

from helpers import SMALL_JOB, Cluster, ServerProcess, wait_until
from inprocess import Lab
from inprocess import wait_until as wait_in_lab
from slow_backend import Slow

TRICKY_NAME = "<i>w1</i>"  # a worker name is the worker's to choose: shown as text, never HTML


def _train(cluster: Cluster) -> ServerProcess:
    server = cluster.server(
        "--mode", "async", "--epochs", "200", "--linger-seconds", "30", *SMALL_JOB
    )
    cluster.worker(server, "w0", "--backend", "numpy")  # auto would pick torch if installed
    cluster._spawn(
        ["worker", "--server", server.address, "--name", TRICKY_NAME, "--backend", "numpy"],
        cluster.tmp_path / "w1.log",
    )
    wait_until(lambda: server.status()["workers_live"] == 2, 60, "two workers")
    return server


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # slow: one loop (tests/README.md)
async def test_page_is_self_contained_and_events_stream_status(lab: Lab) -> None:
    server = await lab.server(
        "--mode", "async", "--epochs", "200", "--linger-seconds", "30", "--event-seconds",
        "0.1", *SMALL_JOB,
    )  # fmt: skip
    # the page and its events are the test, not the bunches: 5 ms each, slept
    lab.worker(server, "w0", backend=Slow(0.005))
    lab.worker(server, TRICKY_NAME, backend=Slow(0.005))

    async def both_training() -> bool:
        # live from their welcome; training once they have opened the data and made their
        # step (the compiled one is loaded then, for a job this long)
        status = await server.status()
        return bool(status["workers_live"] == 2 and status["updates_applied"] > 0)

    await wait_in_lab(both_training, 60, "two workers training")
    session = await lab.http()
    async with session.get(server.url + "/") as response:
        assert response.headers["Content-Type"] == "text/html; charset=utf-8"
        page = await response.text()
    # the relative events path, with the token the page was opened with (if any)
    assert 'new EventSource(token ? "events?token=" + encodeURIComponent(token) : "events")' in page
    # Nothing is loaded from elsewhere: no external scripts, styles, fonts or images.
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page)
    assert not re.search(r"""@import|url\(\s*["']?(https?:)?//""", page)

    documents: list[dict[str, Any]] = []
    async with session.get(server.url + "/events") as stream:
        assert stream.headers["Content-Type"] == "text/event-stream"
        async for raw in stream.content:
            line = raw.decode().rstrip("\n")
            if line.startswith("data: "):
                documents.append(json.loads(line[len("data: ") :]))
            if len(documents) == 3:
                break
    assert [d["server"] for d in documents] == ["snet"] * 3
    assert documents[2]["updates_applied"] > documents[0]["updates_applied"]  # live, not cached


@pytest.mark.skipif(
    find_chromium() is None,
    reason="chromium is not installed (Debian: apt-get install chromium; make test tries it)",
)
@pytest.mark.system
def test_dashboard_in_headless_chromium_shows_workers_and_moving_numbers(
    cluster: Cluster,
) -> None:
    server = _train(cluster)
    result = asyncio.run(_look_at_dashboard(server.url))
    assert result["state"] == "training"
    assert sorted(result["workers"]) == sorted(["w0", TRICKY_NAME])
    assert result["html_in_names"] == 0
    assert all(b == "numpy" for b in result["backends"])
    assert all(a.startswith("127.0.0.1:") for a in result["addresses"])
    assert result["version_later"] > result["version_first"] > 0
    assert result["events_later"] > result["events_first"]
    assert result["rate"] > 0
    assert result["cv_points"] >= 1 and result["train_points"] >= 1
    assert re.fullmatch(r"\d+ / 32", result["free"]), result["free"]
    assert re.fullmatch(r"\d+\.\d%", result["progress"]), result["progress"]
    eta = r"ETA \d+:\d\d(:\d\d)? \u00b7 [\d,]+ frames/s"
    assert re.fullmatch(eta, result["eta"]), result["eta"]
    assert re.fullmatch(r"[1-9]\d* / 200", result["epoch"]), result["epoch"]  # from 1
    assert all(url.startswith(server.url) for url in result["requested"]), result["requested"]
    shown = "nbm async blocks 12 \u00b7 \u03c4 16 \u00b7 \u03b7 0.5 \u00b7 \u03b6 1 \u00b7 "
    assert result["blocks"] == [shown + "|\u0394| 0.0123 \u00b7 overlap \u00b7 ", "", ""]


async def _look_at_dashboard(url: str) -> dict[str, Any]:
    async with Browser() as page:
        await page.open(url + "/")
        await page.wait_for("document.querySelectorAll('#workers tbody tr').length === 2", 30)
        await page.wait_for("document.querySelectorAll('.point-cv_accuracy').length >= 1", 60)
        first = await _read(page)
        await asyncio.sleep(2.0)
        later = await _read(page)
        # how a bmuf run's block filter is shown beside its mode (its /status "rule")
        rule = ("{filter: 'nbm', sync: 0, blocks: 12, block_bunches: 16, block_seconds: 0, "
                "block_momentum: 0.5, block_lr: 1, delta_norm: 0.012345, overlap: 1}")  # fmt: skip
        blocks = await page.evaluate(f"[blocks({rule}), blocks(null), blocks('np slices')]")
        return {
            "blocks": blocks,
            "state": later["state"],
            "workers": later["workers"],
            "html_in_names": later["html_in_names"],
            "backends": later["backends"],
            "addresses": later["addresses"],
            "version_first": int(first["version"]),
            "version_later": int(later["version"]),
            "events_first": int(first["events"]),
            "events_later": int(later["events"]),
            "rate": float(later["rate"]),
            "cv_points": later["cv_points"],
            "train_points": later["train_points"],
            "free": later["free"],
            "progress": later["progress"],
            "eta": later["eta"],
            "epoch": later["epoch"],
            "requested": page.requested,
        }


async def _read(page: Browser) -> dict[str, Any]:
    value: dict[str, Any] = await page.evaluate(
        """(() => {
          const rows = [...document.querySelectorAll('#workers tbody tr')];
          const text = (id) => document.getElementById(id).textContent;
          return {
            state: text('state'), version: text('version'), rate: text('rate'),
            progress: text('progress'), eta: text('eta'), epoch: text('epoch'),
            events: document.body.dataset.events,
            workers: rows.map((r) => r.cells[0].textContent),
            html_in_names: document.querySelectorAll('#workers tbody i').length,
            addresses: rows.map((r) => r.cells[1].textContent),
            backends: rows.map((r) => r.cells[2].textContent),
            cv_points: document.querySelectorAll('.point-cv_accuracy').length,
            train_points: document.querySelectorAll('.point-train_accuracy').length,
            free: document.querySelector('[data-queue="free elements"] .num').textContent,
          };
        })()"""
    )
    return value


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_an_events_reader_that_stalls_then_resets_leaves_no_traceback(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client of /events that reads nothing until the server's writes wait on it, then
    resets the connection: the waiting write raised ``ConnectionError`` (not the
    ``ConnectionResetError`` suppressed), an ERROR traceback each time (found by a probe,
    with a long run's large documents; here documents are made large)."""
    import snet.server.status as status

    documents = status.status_document
    monkeypatch.setattr(status, "status_document", lambda s: {**documents(s), "x": "x" * 200_000})
    server = await lab.server("--event-seconds", "0.05", "--min-workers", "9", *SMALL_JOB)
    peer = socket.socket()
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1024)
    peer.setblocking(False)
    await asyncio.get_running_loop().sock_connect(peer, ("127.0.0.1", server.server.http_port))
    peer.send(b"GET /events HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
    await asyncio.sleep(2)  # the documents pile up until the server's writes wait
    peer.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    peer.close()  # a reset
    await asyncio.sleep(0.5)
    assert "Error handling request" not in lab.capture.text()


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_head_request_for_events_gets_the_headers_only(lab: Lab) -> None:
    """HEAD /events was answered with the stream itself (9 kB in 1.5 s, never ending):
    a keep-alive client's next response was lost in it, and it held an HTTP slot."""
    server = await lab.server("--mode", "async", "--epochs", "1", "--event-seconds", "0.1",
                              *SMALL_JOB)  # fmt: skip
    reader, writer = await asyncio.open_connection("127.0.0.1", server.server.http_port)
    try:
        host = f"Host: 127.0.0.1:{server.server.http_port}\r\n"
        writer.write(f"HEAD /events HTTP/1.1\r\n{host}\r\nGET /healthz HTTP/1.1\r\n{host}"
                     "Connection: close\r\n\r\n".encode())  # fmt: skip
        answer = await asyncio.wait_for(reader.read(), 10)  # the server closes after both
    finally:
        writer.close()
    head, _, rest = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200") and b"text/event-stream" in head, head
    assert rest.startswith(b"HTTP/1.1 200"), rest[:200]  # the next response, straight after
    assert b"event: status" not in answer
    server.stop("test over")
    assert await server.wait(30) == "test over"


def test_the_status_document_is_built_once_for_every_reader_of_a_moment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each /status request and each /events reader built its own: 254 peers' reports in a
    15 MB document, read by 14 event streams, took the server to 640 MB and its steps to
    a thirtieth (a probe). Within ``reuse`` seconds, and while the state holds, one build
    serves all; a change of state (the last, ``stopping``, document) is built at once."""
    import types

    import snet.server.status as status

    built: list[str] = []

    def document(server: object) -> dict[str, object]:
        built.append(server.state)  # type: ignore[attr-defined]
        return {"state": server.state, "n": len(built)}  # type: ignore[attr-defined]

    monkeypatch.setattr(status, "status_document", document)
    server = types.SimpleNamespace(state="training")
    shared = status.StatusText(server, reuse=60.0)  # type: ignore[arg-type]
    texts = {shared.text() for _ in range(14)}
    assert texts == {'{"state":"training","n":1}'} and built == ["training"]
    server.state = "stopping"
    assert shared.text() == '{"state":"stopping","n":2}'
    fresh = status.StatusText(server, reuse=-1.0)  # type: ignore[arg-type]
    assert fresh.text() != fresh.text()  # no reuse: built each time
