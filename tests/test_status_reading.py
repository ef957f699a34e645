"""``snet status`` against what is not an snet server: one line and exit 1, never a
traceback (a JSON document of another shape, a port that does not speak HTTP, a TLS port
asked in plain HTTP), and a watch interval that is not a positive number of seconds."""

from __future__ import annotations

import contextlib
import email.message
import http.server
import io
import json
import socket
import threading
import time
import urllib.error
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from snet.cli.main import main
from snet.cli.status import _cannot_read
from snet.protocol import PROTOCOL_VERSION
from snet.protocol.framing import encode_bytes
from snet.protocol.messages import ServerHello


@contextmanager
def _serving(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` serving on 127.0.0.1 in a thread of its own; its URL."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@contextmanager
def _http_answering(body: bytes) -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering every GET with ``body`` (JSON); its URL."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib names it so
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Handler) as url:
        yield url


@contextmanager
def _raw_answering(first_bytes: bytes) -> Iterator[str]:
    """A TCP port that sends ``first_bytes`` to whoever connects, then closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.02)  # the thread looks at ``stop`` this often
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                connection, _ = listener.accept()
            except TimeoutError:
                continue
            with connection:
                connection.sendall(first_bytes)
                connection.settimeout(1.0)  # then reads what comes, as a server would,
                with contextlib.suppress(OSError):  # before it closes (not a reset)
                    connection.recv(4096)

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(10)
        listener.close()


def test_another_web_service_without_a_status_is_said_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A 404 was "HTTP Error 404: File not found", not that this is no snet server."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib names it so
            self.send_error(404, "File not found")

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Handler) as url:
        assert main(["status", "--url", url]) == 1
    said = capsys.readouterr().err.strip()
    assert said == (f"snet: cannot read {url}/status: 404 File not found: not an snet "
                    "server's HTTP port (--http-port, default 7080)")  # fmt: skip


def test_a_page_that_is_not_json_is_said_to_be_no_status(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It printed the JSON decoder's "Expecting value: line 1 column 1 (char 0)"."""
    with _http_answering(b"<html>hi</html>") as url:
        assert main(["status", "--url", url]) == 1
    assert capsys.readouterr().err.strip() == (
        f"snet: {url}/status is not an snet server's status (not JSON: Expecting value)"
    )


@pytest.mark.parametrize("body", [b"{}", b"[]", b'{"state": "training"}', b"42"])
def test_json_that_is_not_a_status_is_said_so(
    body: bytes, capsys: pytest.CaptureFixture[str]
) -> None:
    with _http_answering(body) as url:
        assert main(["status", "--url", url]) == 1
        assert main(["status", "--url", url, "--watch", "--interval", "0.1"]) == 1
    errors = capsys.readouterr().err.splitlines()
    assert (
        errors
        == [f"snet: {url}/status is not an snet server's status (no server and state in it)"] * 2
    )


def test_a_status_missing_a_field_the_table_reads_is_said_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _http_answering(b'{"server": "x", "state": "training"}') as url:
        assert main(["status", "--url", url]) == 1
        assert main(["status", "--url", url, "--json"]) == 0  # JSON shows it as it came
    captured = capsys.readouterr()
    assert captured.err.startswith(f"snet: cannot show {url}/status: a field is missing")
    assert '"state": "training"' in captured.out


def test_bmufs_block_line_says_its_blocks_and_reads_an_older_servers() -> None:
    """bmuf's line of ``snet status``; a server from before its blocks' length and overlap
    were in /status gets the line without them, not an error."""
    from snet.cli.status import _block_line

    rule = {"filter": "cbm", "sync": True, "blocks": 12, "block_momentum": 0.0, "block_lr": 1.0,
            "delta_norm": 0.25, "block_bunches": 4, "block_seconds": 0.0, "overlap": 1}  # fmt: skip
    figures = "12 filtered, eta 0, zeta 1, |delta| 0.25"
    assert _block_line(rule) == [
        f"blocks: cbm, sync blocks of 4 bunches, overlapping the exchange, {figures}"
    ]
    by_clock = {**rule, "sync": False, "overlap": 0, "block_seconds": 0.05}
    assert _block_line(by_clock) == [f"blocks: cbm, async blocks of 0.05 s, {figures}"]
    older = {key: value for key, value in rule.items()
             if key not in ("overlap", "block_bunches", "block_seconds")}  # fmt: skip
    assert _block_line(older) == [f"blocks: cbm, sync blocks, {figures}"]
    assert _block_line("2 slices") == [] and _block_line(None) == []  # np's, other modes'


def test_a_port_that_does_not_speak_http_is_said_so(capsys: pytest.CaptureFixture[str]) -> None:
    with _raw_answering(b"SSH-2.0-OpenSSH_9.2\r\n") as address:
        assert main(["status", "--url", address]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"snet: cannot read http://{address}/status: no HTTP answer")
    assert "https:// and --tls-ca" in line  # a TLS port asked in plain HTTP looks so too


def test_a_tls_ca_that_is_no_file_is_named(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """It said "[Errno 2] No such file or directory", naming no file; a directory is
    said to be one, as a worker's --tls-ca is (transport/tls.py)."""
    assert main(["status", "--url", "127.0.0.1:1", "--tls-ca", "/no/such/ca.pem"]) == 2
    assert capsys.readouterr().err == "snet: --tls-ca /no/such/ca.pem does not exist\n"
    assert main(["status", "--url", "127.0.0.1:1", "--tls-ca", str(tmp_path)]) == 2
    assert capsys.readouterr().err == (
        f"snet: --tls-ca {tmp_path} is a directory: give the CA's file (e.g. {tmp_path}/ca.pem)\n"
    )


def test_the_worker_port_asked_for_status_is_named_so(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """It printed the server_hello frame's bytes inside the message."""
    hello = encode_bytes(ServerHello(PROTOCOL_VERSION, "snet", bytes(32), False))
    with _raw_answering(hello) as address:
        assert main(["status", "--url", address]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == (
        f"snet: cannot read http://{address}/status: that is an snet server's worker port, "
        "not its HTTP port (--http-port, default 7080)"
    )


@pytest.mark.parametrize("interval", ["nan", "inf", "0", "-1"])
def test_the_watch_interval_must_be_a_positive_number_of_seconds(
    interval: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status", "--url", "127.0.0.1:9", "--watch", "--interval", interval]) == 2
    assert "--interval must be > 0" in capsys.readouterr().err


STATUS = {"server": "fake", "state": "training"}


@contextmanager
def _snet_like(
    events: list[str], hold: float = 0.0, states: list[str] | None = None
) -> Iterator[tuple[str, list[str]]]:
    """An HTTP server on 127.0.0.1 with snet's paths only: /status (``STATUS``, or in turn
    the ``states``, the last repeated) and, the first time it is asked, /events: a
    ``status`` event for each of ``events`` (states), ``hold`` seconds of silence, then the
    end of the stream (later: 404, as a server that is gone). Its URL and the paths asked."""
    asked: list[str] = []
    answers = list(states or [STATUS["state"]])

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # the stdlib names it so
            asked.append(self.path)
            if self.path == "/events" and asked.count("/events") == 1:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()  # HTTP/1.0: the stream ends when the connection does
                self.wfile.write(b"retry: 2000\n\n:\n\n")
                for state in events:
                    data = json.dumps({**STATUS, "state": state})
                    self.wfile.write(f"event: status\ndata: {data}\n\n".encode())
                self.wfile.flush()
                time.sleep(hold)  # an earlier server's stream: no keep-alive between
                return
            if self.path != "/status":
                self.send_error(404)
                return
            state = answers.pop(0) if len(answers) > 1 else answers[0]
            body = json.dumps({**STATUS, "state": state}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with _serving(Handler) as url:
        yield url, asked


@pytest.mark.parametrize("page", ["", "/", "/status", "/status/", "/events", "//status//"])
def test_a_url_of_the_servers_pages_names_the_server(
    page: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # `snet demo` prints the dashboard's URL (with /) and the status page's (with /status)
    with _snet_like([]) as (url, asked):
        for given in (url + page, url.removeprefix("http://") + page):  # bare HOST:PORT too
            assert main(["status", "--json", "--url", given]) == 0
            assert json.loads(capsys.readouterr().out) == STATUS
    assert asked == ["/status"] * 2


def test_an_address_no_server_has_is_one_line_exit_2_and_ipv6_as_logged_is_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """ftp:// waited 5 s for a reply, port 99999 was "connection refused", and ::1:PORT
    (as the server logs its address, and a worker's --server takes it) was refused; a
    bare IPv6 address without a port ended in a traceback, port 0 was tried."""

    def ipv6(given: str) -> str:
        return f"{given!r} is not HOST:PORT (IPv6: ::1:7080 or [::1]:7080)"

    for given, said in (
        ("ftp://127.0.0.1:80", "a server's address is http:// or https://"),
        ("127.0.0.1:99999", "'127.0.0.1:99999' is not HOST:PORT with a port from 1 to 65535"),
        ("http://127.0.0.1:99999", "Port out of range 0-65535"),
        ("127.0.0.1:0", "'127.0.0.1:0' is not HOST:PORT with a port from 1 to 65535"),
        ("http://127.0.0.1:0", "no server listens without a host or on port 0"),
        ("::1", ipv6("::1")),
        ("fe80::1", ipv6("fe80::1")),
        ("[::1", ipv6("[::1")),
        ("http://[::1", "Invalid IPv6 URL"),
    ):
        assert main(["status", "--url", given]) == 2
        assert capsys.readouterr().err == f"snet: --url {given}: {said}\n"
    from snet.cli.status import server_url

    assert server_url("::1:7080") == "http://[::1]:7080"
    assert server_url("[::1]:7080/status", tls=True) == "https://[::1]:7080"
    assert server_url("127.0.0.1:7080/status/") == "http://127.0.0.1:7080"
    # any of its pages names the server (/metrics was read as /metrics/status: "404, not
    # an snet server's HTTP port", a probe)
    for page in ("metrics", "healthz", "weights", "events"):
        assert server_url(f"http://127.0.0.1:7080/{page}") == "http://127.0.0.1:7080"


def test_a_watch_ends_with_0_on_the_streams_last_state(
    capsys: pytest.CaptureFixture[str],
) -> None:
    ended = ["waiting_for_workers", "training", "training", "stopping"]
    with _snet_like(ended) as (url, asked):
        assert main(["status", "--json", "--watch", "--interval", "60", "--url", url]) == 0
    assert asked == ["/events"]
    captured = capsys.readouterr()
    # a reading at most every --interval seconds, and the last, however soon it comes
    shown = [json.loads(line)["state"] for line in captured.out.splitlines()]
    assert shown == ["waiting_for_workers", "stopping"]
    assert captured.err == ""


def test_a_watch_ends_with_1_when_the_stream_ends_mid_run(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _snet_like(["training"]) as (url, asked):
        assert main(["status", "--json", "--watch", "--interval", "60", "--url", url]) == 1
    assert asked == ["/events", "/events"]  # once more: then it was gone
    captured = capsys.readouterr()
    assert [json.loads(line)["state"] for line in captured.out.splitlines()] == ["training"]
    assert captured.err == (
        f"snet: the server stopped answering ({url}/events ended); last state training\n"
    )


def test_a_watch_polls_a_live_server_whose_stream_falls_silent(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server of an earlier version sends no keep-alive: its stream is silent between
    documents as long as --event-seconds (up to 60 s), past the watch's read timeout. It
    still answers /status: the watch follows it so, where it said it stopped answering."""
    import snet.cli.event_stream

    monkeypatch.setattr(snet.cli.event_stream, "READ_SECONDS", 0.3)
    with _snet_like(["training"], hold=2.0, states=["training", "stopping"]) as (url, asked):
        argv = ["status", "--json", "--watch", "--interval", "0.05", "--url", url]
        assert main(argv) == 0
    assert asked[0] == "/events" and asked[-1] == "/status"
    shown = [json.loads(line)["state"] for line in capsys.readouterr().out.splitlines()]
    assert shown[0] == "training" and shown[-1] == "stopping"


def test_a_refusal_says_the_servers_reason() -> None:
    """A server without a token asked by a name it does not answer (403) was shown as
    "HTTP Error 403: Forbidden", its reason left unread."""
    reason = b"this server has no token, so it answers only requests addressed to ...\n"
    refused = urllib.error.HTTPError(
        "http://alias:7080/status", 403, "Forbidden", email.message.Message(), io.BytesIO(reason)
    )
    assert _cannot_read("http://alias:7080", "/status", refused) == (
        "cannot read http://alias:7080/status: refused: this server has no token, so it "
        "answers only requests addressed to ..."
    )
