"""A worker fails fast and says why (issue 18): pointed at the HTTP port, given a URL, or
given a token the server does not check."""

from __future__ import annotations

import asyncio
import contextlib
import re
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from snet.cli.main import main
from snet.client.port_probe import WrongPort, http_answer, worker_port_of

from helpers import QUICK_JOB, SMALL_JOB
from inprocess import Lab, wait_until
from short_data import short_job


def test_a_url_where_host_port_was_expected_is_one_line_exit_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`snet worker --server http://host:7000` (the issue's command)."""
    assert main(["worker", "--server", "http://host:7000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "snet: --server must be HOST:PORT of the server's worker port, not a URL: "
        "got 'http://host:7000' (did you mean --server host:7000?)"
    )


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
async def test_a_worker_pointed_at_the_http_port_is_told_the_worker_port(lab: Lab) -> None:
    """`snet worker --server HOST:HTTP_PORT`: one clear error, no retries (a long retry
    window would otherwise keep it trying), the worker port named."""
    server = await lab.server("--epochs", "1", *SMALL_JOB)
    http_port = server.server.http_port
    given = f"127.0.0.1:{http_port}"
    wrong = lab.worker(
        server, "lost", "--server", given, "--retry-seconds", "300", "--hello-seconds", "0.2"
    )
    with pytest.raises(WrongPort) as raised:
        await wrong.wait(20)
    assert str(raised.value) == (
        f"127.0.0.1:{http_port}: that port speaks HTTP: the worker port is {server.port} "
        f"(--server 127.0.0.1:{server.port})"
    )
    assert "reconnecting" not in lab.log("lost")
    assert (await server.status())["handshakes_refused"] == 0  # the server saw nothing odd


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
async def test_a_worker_at_a_silent_port_says_what_it_waits_for(lab: Lab) -> None:
    """A port that accepts and says nothing (and hangs up on what it does not know): the
    worker waited 30 s for a hello with nothing in its log, even at debug. It says so once
    the HTTP probe has found no HTTP."""
    server = await lab.server("--epochs", "1", *QUICK_JOB)  # for the lab's bookkeeping
    async with silent_port() as address:
        waiting = lab.worker(server, "waiting", "--server", address, "--hello-seconds", "0.2")
        said = f"no hello from {address} after 0.2 s and it does not speak HTTP"
        await wait_until(lambda: said in lab.log("waiting"), 20, "the worker to say so")
        assert "is it an snet server's worker port?" in lab.log("waiting")
        waiting.stop("test over")
        assert await waiting.wait(20) == 0
    server.stop("test over")
    assert await server.wait(30) == "test over"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
async def test_a_worker_at_a_silent_port_gives_up_within_its_retry_window(lab: Lab) -> None:
    """Each try at a port that accepts and stays silent waited 30 s for a hello: a worker
    with --retry-seconds 5 gave up after 72 s, saying "gave up after 5 s". Its window
    opens when it starts, and no wait for a hello outlasts it."""
    server = await lab.server("--epochs", "1", *QUICK_JOB)  # for the lab's bookkeeping
    async with silent_port() as address:
        started = time.monotonic()
        waiting = lab.worker(server, "waiting", "--server", address, "--hello-seconds", "0.2",
                             "--retry-seconds", "1")  # fmt: skip
        assert await waiting.wait(15) == 3  # the server unreachable (before: 30 s a try)
        took = time.monotonic() - started
        assert took < 15
        said = re.search(r"gave up after ([0-9.]+) s \(--retry-seconds 1\)", lab.log("waiting"))
        assert said is not None and 1 <= float(said.group(1)) <= took  # what it tried, said
    server.stop("test over")
    assert await server.wait(30) == "test over"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
@pytest.mark.parametrize("client_certificates", [False, True])
async def test_a_plain_worker_at_a_tls_server_is_told_to_give_tls_ca(
    lab: Lab, tmp_path: Path, client_certificates: bool
) -> None:
    """A TLS server closes a plain connection without a word; the worker said only
    "connection closed during the handshake", with no hint of TLS; then it retried for its
    whole window (300 s by default) and exited 3, "no server reachable", which a service
    manager restarts for ever. It now asks whether the port serves TLS: exit 2, saying
    so. Also when the server wants client certificates (``--tls-client-ca``): it resets
    the probe's handshake, which was taken for "no TLS" (found by a probe)."""
    pytest.importorskip("cryptography")
    from snet.transport.certificates import make_cluster_certificates

    pki = tmp_path / "pki"
    make_cluster_certificates(pki, ["127.0.0.1"], ["w1"])
    tls = ["--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key")]
    if client_certificates:
        tls += ["--tls-client-ca", str(pki / "ca.pem")]
    server = await lab.server("--epochs", "1", "--handshake-seconds", "0.25", *tls, *QUICK_JOB)
    plain = lab.worker(server, "plain", "--retry-seconds", "300", "--hello-seconds", "0.2")
    with pytest.raises(WrongPort) as raised:  # a ConfigError: `snet worker` exits 2
        await plain.wait(30)
    assert str(raised.value) == (
        f"127.0.0.1:{server.port}: the server serves TLS: give --tls-ca (the CA of its "
        "certificate, e.g. ca.pem of snet tls init)"
    )
    assert "reconnecting" not in lab.log("plain")
    https = lab.worker(server, "https", "--server", f"127.0.0.1:{server.server.http_port}",
                       "--retry-seconds", "300", "--hello-seconds", "0.2")  # fmt: skip
    with pytest.raises(
        WrongPort, match=f"that port speaks HTTPS: the worker port is {server.port}"
    ):
        await https.wait(30)
    server.stop("test over")
    assert await server.wait(30) == "test over"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop is enough
async def test_a_token_the_server_does_not_check_is_a_warning(lab: Lab) -> None:
    """`snet worker --token ...` for a server started without one: it joins, and says so."""
    server = await lab.server("--epochs", "1", *short_job())
    worker = lab.worker(server, "w1", "--token", "s3cret")
    assert await worker.wait(60) == 0
    assert "snet checks no token: the --token given is not used" in lab.log("w1")
    assert await server.wait(30) == "trained"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_bmuf_worker_asking_for_sliver_weights_is_refused_at_once(lab: Lab) -> None:
    """`--weights-codec delta:topk:0.01` in bmuf mode: the worker's copy, sent once per
    block and a sliver of each change at a time, stayed far from the weights, and the run
    collapsed without a word (CV 33 % after 3 epochs where float32 reached 84 %)."""
    server = await lab.server("--mode", "bmuf", "--epochs", "1", *short_job())
    worker = lab.worker(server, "w1", "--weights-codec", "delta:topk:0.01")
    assert await worker.wait(30) == 4  # refused: the systemd unit does not restart it
    assert "weights codec delta:topk:0.01 sends a sliver of each change" in lab.log("w1")
    assert (await server.status())["weight_version"] == 0


def test_the_probe_leaves_a_server_that_speaks_first_alone() -> None:
    """A slow snet server (it speaks first, just late) is not sent the probe's request;
    a silent server that answers in anything but HTTP is not taken for HTTP."""

    async def probe(greeting: bytes, answer: bytes) -> tuple[bytes | None, bytes]:
        heard = bytearray()

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(greeting)
            with contextlib.suppress(TimeoutError):
                heard.extend(await asyncio.wait_for(reader.read(100), 1.0))
            if heard:
                writer.write(answer)
            await writer.drain()
            writer.close()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        async with server:
            head = await http_answer("127.0.0.1", port, listen_seconds=0.1)
        return head, bytes(heard)

    head, heard = asyncio.run(probe(b"\x00\x00\x00\x10snet", b""))
    assert head is None and heard == b""
    head, heard = asyncio.run(probe(b"", b"SSH-2.0-OpenSSH\r\n"))
    assert head is None and heard.startswith(b"GET /healthz HTTP/1.1\r\n")
    head, _ = asyncio.run(probe(b"", b"HTTP/1.1 404 Not Found\r\nServer: x\r\n\r\n"))
    assert head is not None and worker_port_of(head) is None


@contextlib.asynccontextmanager
async def silent_port() -> AsyncIterator[str]:
    """The HOST:PORT of a port that accepts and says nothing, hanging up on whoever sends
    it anything (the worker's HTTP probe); closed, with what it accepted, at the end."""
    held: list[asyncio.StreamWriter] = []

    async def hold(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        held.append(writer)
        if await reader.read(1):
            writer.close()

    silent = await asyncio.start_server(hold, "127.0.0.1", 0)
    try:
        yield f"127.0.0.1:{silent.sockets[0].getsockname()[1]}"
    finally:
        for writer in held:
            writer.close()
        silent.close()
        await silent.wait_closed()
