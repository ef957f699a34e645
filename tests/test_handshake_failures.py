"""Failed TLS handshakes are counted and said (transport/handshake_failures.py): the event
loop drops them without a word."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
from pathlib import Path

import pytest
import uvloop

from snet.transport.certificates import make_cluster_certificates
from snet.transport.handshake_failures import HTTP_PORT, WORKER_PORT, TlsFailures
from snet.transport.tls import client_context, server_contexts

from inprocess import Lab, wait_until
from short_data import short_job

pytest.importorskip("cryptography")


class Quiet(asyncio.Protocol):
    """The server's side once a handshake succeeded: says nothing."""


async def _peers(pki: Path, failures: TlsFailures) -> list[bytes]:
    """A server on each port's context; what four peers read from them: one without a
    certificate of its own, one with one (welcome), one speaking plain HTTP, one that
    connects and closes (a health check)."""
    workers, http = server_contexts(str(pki / "server.pem"), str(pki / "server.key"),
                                    str(pki / "ca.pem"))  # fmt: skip
    failures.watch(workers, WORKER_PORT)
    failures.watch(http, HTTP_PORT)
    loop = asyncio.get_running_loop()
    worker_port = await loop.create_server(Quiet, "127.0.0.1", 0, ssl=workers)
    http_port = await loop.create_server(Quiet, "127.0.0.1", 0, ssl=http)
    ports = [s.sockets[0].getsockname()[1] for s in (worker_port, http_port)]
    read = []
    anonymous = client_context(str(pki / "ca.pem"))
    known = client_context(str(pki / "ca.pem"), str(pki / "worker.pem"), str(pki / "worker.key"))
    for port, context, sent in [(ports[0], anonymous, b"hello"), (ports[0], known, b"hello"),
                                (ports[1], None, b"GET / HTTP/1.1\r\n\r\n")]:  # fmt: skip
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=context)
            writer.write(sent)
            read.append(await asyncio.wait_for(reader.read(100), 0.5))
            writer.close()
        except TimeoutError:
            read.append(b"(open)")
            writer.close()
        except (ConnectionError, ssl.SSLError):
            read.append(b"(reset)")
    _, writer = await asyncio.open_connection("127.0.0.1", ports[0])
    writer.close()
    await asyncio.sleep(0.1)  # the server's side of the last one
    for server in (worker_port, http_port):
        server.close()
    return read


@pytest.mark.parametrize("loop", ["asyncio", "uvloop"])
def test_failed_handshakes_are_counted_and_said(
    loop: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pki = tmp_path / "pki"
    make_cluster_certificates(pki, ["127.0.0.1"])
    failures = TlsFailures()
    caplog.set_level(logging.WARNING, "snet.server")
    run = uvloop.run if loop == "uvloop" else asyncio.run
    read = run(_peers(pki, failures))
    assert read[1] == b"(open)"  # the worker with a certificate is taken
    assert read[0] != b"(open)" and read[2] != b"(open)"  # the others are dropped
    # the health check that never began a handshake is not a failure
    assert failures.figures() == {"tls_handshakes_failed": 1, "http_tls_handshakes_failed": 1}
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0] == (
        "TLS handshake failed on the worker port: peer did not return a certificate (a worker "
        "without a certificate of its own: give it --tls-cert and --tls-key signed by this "
        "server's --tls-client-ca)"
    )
    # each port's lines are kept to one a second apart, so either port's is said
    assert lines[1] == ("TLS handshake failed on the HTTP port: http request (plain HTTP to a "
                        "TLS port: use https://)")  # fmt: skip
    assert len(lines) == 2


def test_a_flood_of_failures_is_logged_once_a_second_with_its_count(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    failures = TlsFailures()
    now = [100.0]
    monkeypatch.setattr("snet.transport.log_throttle.time.monotonic", lambda: now[0])
    caplog.set_level(logging.WARNING, "snet.server")
    error = ssl.SSLError(1, "[SSL: HTTP_REQUEST] http request")
    error.reason = "HTTP_REQUEST"
    for _ in range(40):
        failures.failed(HTTP_PORT, error)
        now[0] += 0.125
    assert failures.figures()["http_tls_handshakes_failed"] == 40
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 5  # at 100.0, 101.0, ... 104.0
    assert lines[0] == ("TLS handshake failed on the HTTP port: http request (plain HTTP to a "
                        "TLS port: use https://)")  # fmt: skip
    assert all(line.endswith("; 7 more since the last such line") for line in lines[1:])


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_tls_hello_on_the_plain_port_is_said_as_such_not_warned(
    lab: Lab, tmp_path: Path
) -> None:
    """Workers asking whether the port wants TLS (after a server froze a while) were
    logged as hostile: "WARNING closing connection: malformed_frame: bad magic
    b'\\x16\\x03': not an snet frame"."""
    server = await lab.server("--epochs", "1", *short_job())
    pki = tmp_path / "pki"
    make_cluster_certificates(pki, ["127.0.0.1"])
    with contextlib.suppress(ssl.SSLError, ConnectionError):
        _, writer = await asyncio.open_connection(
            "127.0.0.1", server.port, ssl=client_context(str(pki / "ca.pem"))
        )
        writer.close()
    await wait_until(lambda: "a TLS handshake: this port does not serve TLS" in lab.log(
        "server"), 10, "the refusal")  # fmt: skip
    line = next(s for s in lab.log("server").splitlines() if "a TLS handshake" in s)
    assert "WARNING" not in line and "INFO" in line, line
    assert (await server.status())["frames_refused"] == 1
    server.stop("test over")
    assert await server.wait(30) == "test over"
