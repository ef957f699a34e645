"""Secure by default: no open ports beyond loopback without a token; HTTP needs it too."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import socket
import sys
import urllib.error
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from snet.client.config import WorkerConfig
from snet.protocol.errors import ConfigError
from snet.server.config import ServerConfig
from snet.server.security import is_loopback, resolve_token

from helpers import SMALL_JOB, Cluster, run_process
from inprocess import Lab, wait_until

NOT_HERE = "10.255.255.1"  # an address this machine does not have: never actually bound


def test_loopback_is_told_apart() -> None:
    assert is_loopback("127.0.0.1") and is_loopback("127.3.4.5") and is_loopback("::1")
    assert is_loopback("localhost") and is_loopback("::ffff:127.0.0.1")  # dual-stack IPv4
    assert not is_loopback("::ffff:10.0.0.1")
    assert not is_loopback("0.0.0.0") and not is_loopback("") and not is_loopback("::")
    assert not is_loopback("10.0.0.1") and not is_loopback("server.example")


def test_a_token_beside_a_token_file_is_said_not_to_be_used(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Both given: the file's was used without a word, and `snet status --token` with the
    other was refused (found by a probe)."""
    secret = tmp_path / "token"
    secret.write_text("from-the-file\n")
    secret.chmod(0o600)
    assert resolve_token(ServerConfig(token="abc", token_file=str(secret))) == "from-the-file"
    assert "both a token and token_file were given: the file's token is used" in caplog.text


def test_a_server_beyond_loopback_needs_a_token_or_insecure(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="beyond loopback"):
        resolve_token(ServerConfig(host="0.0.0.0"))
    with pytest.raises(ConfigError, match="beyond loopback"):
        resolve_token(ServerConfig(http_host="0.0.0.0"))  # the HTTP port counts too
    assert resolve_token(ServerConfig(host="0.0.0.0", insecure=True)) is None
    assert resolve_token(ServerConfig()) is None  # loopback: no token needed
    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    assert resolve_token(ServerConfig(host="0.0.0.0", token_file=str(secret))) == "s3cret"
    secret.write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        resolve_token(ServerConfig(token_file=str(secret)))
    with pytest.raises(ConfigError, match="cannot read token_file"):
        resolve_token(ServerConfig(token_file=str(tmp_path / "missing")))


@pytest.mark.system  # starts real processes
def test_a_worker_reads_its_token_from_a_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the server: ``--token-file`` keeps the secret out of ps and the environment (a
    worker had only ``--token`` and SNET_TOKEN, while the README told it to use a file)."""
    from snet.cli.commands import worker_config
    from snet.cli.parser import command_parser
    from snet.cli.settings import ConfigFile

    def config(path: Path) -> str:
        args = command_parser("worker").parse_args(["worker", "--token-file", str(path)])
        return worker_config(args, ConfigFile()).token

    secret = tmp_path / "token"
    secret.write_text("s3cret\n")
    monkeypatch.setenv("SNET_TOKEN", "from-the-environment")
    assert config(secret) == "s3cret"  # the file wins, as on the server
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(ConfigError, match="is empty"):
        config(tmp_path / "empty")
    with pytest.raises(ConfigError, match="cannot read token_file"):
        config(tmp_path / "missing")


def test_a_workers_own_token_variable_wins_over_the_shared_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Flags > SNET_WORKER_TOKEN > SNET_TOKEN > [worker] token: SNET_TOKEN was put among
    the flags, so a stale one in a shell won over the worker's own variable."""
    from snet.cli.commands import worker_config
    from snet.cli.parser import command_parser
    from snet.cli.settings import read_toml

    path = tmp_path / "snet.toml"
    path.write_text('[worker]\ntoken = "from-the-file"\n')

    def token(*flags: str) -> str:
        args = command_parser("worker").parse_args(["worker", *flags])
        return worker_config(args, read_toml(str(path))).token

    assert token() == "from-the-file"
    monkeypatch.setenv("SNET_TOKEN", "shared")
    assert token() == "shared"  # the environment over the file
    monkeypatch.setenv("SNET_WORKER_TOKEN", "the-workers")
    assert token() == "the-workers"  # the worker's own variable over the shared one
    assert token("--token", "flag") == "flag"


@pytest.mark.system  # starts a real process
def test_the_server_refuses_to_start_exposed_without_a_token(tmp_path: Path) -> None:
    result = run_process(
        [sys.executable, "-m", "snet.cli", "server", "--host", NOT_HERE, "--port", "0",
         "--http-port", "0", "--out-dir", str(tmp_path)],
        timeout=60, cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    last = result.stderr.strip().splitlines()[-1]  # one line, after the log's start line
    assert last.startswith("snet: listening on 10.255.255.1") and "without a token" in last
    assert "--insecure" in last
    assert "Traceback" not in result.stderr


def _get(url: str, token: str | None = None, scheme: str = "Bearer") -> int:
    headers = {"Authorization": f"{scheme} {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10):
            return 200
    except urllib.error.HTTPError as exc:
        return exc.code


def test_with_a_token_every_endpoint_but_healthz_needs_it(cluster: Cluster, tmp_path: Path) -> None:
    secret = tmp_path / "token"
    secret.write_text("s3cret-token\n")
    server = cluster.server("--token-file", str(secret), "--epochs", "1", *SMALL_JOB)
    for path in ("/", "/status", "/metrics", "/weights", "/events"):
        assert _get(server.url + path) == 401, path
        assert _get(server.url + path, "wrong") == 401, path
    for path in ("/", "/status", "/metrics", "/weights"):
        assert _get(server.url + path, "s3cret-token") == 200, path
    assert _get(server.url + "/status?token=s3cret-token") == 200  # the dashboard's way
    for scheme in ("bearer", "BEARER"):  # a scheme's name is case-insensitive (RFC 9110)
        assert _get(server.url + "/status", "s3cret-token", scheme) == 200, scheme
    assert _get(server.url + "/status", "s3cret-token", "Basic") == 401
    assert _get(server.url + "/healthz") == 200
    status = [sys.executable, "-m", "snet.cli", "status", "--url", server.url]
    refused = run_process(status, timeout=30, env={**os.environ, "SNET_TOKEN": ""})
    assert refused.returncode == 1 and "needs the server's token" in refused.stderr
    wrong = run_process(status, timeout=30, env={**os.environ, "SNET_TOKEN": "wrong"})
    assert wrong.returncode == 1 and "refused the token given" in wrong.stderr  # not "needs"
    unreadable = run_process([*status, "--token-file", str(tmp_path / "missing")], timeout=30)
    assert unreadable.returncode == 2 and "cannot read token_file" in unreadable.stderr
    shown = run_process([*status, "--token-file", str(secret)], timeout=30)
    assert shown.returncode == 0 and "server snet" in shown.stdout
    # --token as a worker's (it was taken for --token-file: "cannot read token_file SECRET")
    given = run_process([*status, "--token", "s3cret-token"], timeout=30)
    assert given.returncode == 0 and "server snet" in given.stdout
    wrong = run_process([*status, "--token", "wrong"], timeout=30)
    assert wrong.returncode == 1 and "refused the token given" in wrong.stderr
    assert "wrong" not in wrong.stderr.replace("refused the token", "")
    abbreviated = run_process([*status, "--token-f", str(secret)], timeout=30)  # no prefixes
    assert abbreviated.returncode == 2 and "unrecognized arguments: --token-f" in abbreviated.stderr
    # a worker given the same file trains the job (the README's way on real machines)
    worker = cluster.worker(server, "w", "--token-file", str(secret))
    assert worker.wait(60) == 0
    assert server.wait(30) == 0 and "final weights (version" in server.log.read_text()
    assert "s3cret-token" not in server.log.read_text()


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_token_that_is_not_utf8_is_a_wrong_token(lab: Lab) -> None:
    """An Authorization header with bytes that are not UTF-8 made the check raise: a 500
    and an ERROR traceback in the log for anyone, no token needed (found by a probe)."""
    server = await lab.server("--token", "s3cret", "--min-workers", "9", *SMALL_JOB)
    for header in (b"Bearer \xff\xfe", b"Bearer s3cret\xff", b"\xff s3cret"):
        reader, writer = await asyncio.open_connection("127.0.0.1", server.server.http_port)
        writer.write(b"GET /status HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: " + header
                     + b"\r\nConnection: close\r\n\r\n")  # fmt: skip
        answer = await asyncio.wait_for(reader.read(), 10)
        writer.close()
        assert answer.startswith(b"HTTP/1.1 401"), (header, answer[:100])
    # the lab's close finds any traceback in the server's log


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: see tests/README.md
async def test_without_a_token_web_pages_in_a_browser_here_are_refused(lab: Lab) -> None:
    """A server without a token (on loopback, as `snet server` and `snet demo` start)
    was open to any web page a browser on this machine opened: a form posting
    ``text/plain`` to /control changed the staleness policy (cross-site request forgery),
    and a site whose own name resolved to 127.0.0.1 (DNS rebinding) read /weights.
    Programs (curl, snet status) and the dashboard itself are served as before."""
    server = await lab.server("--min-workers", "9", *SMALL_JOB)
    session = await lab.http()
    port = server.server.http_port
    forged = {"Content-Type": "text/plain", "Origin": "http://site.example"}
    body = json.dumps({"staleness": "rate"})
    async with session.post(server.url + "/control", data=body, headers=forged) as response:
        assert response.status == 403, await response.text()
    fetch = {"Sec-Fetch-Site": "cross-site"}  # a browser that names no Origin still says so
    async with session.post(server.url + "/control", data=body, headers=fetch) as response:
        assert response.status == 403
    assert json.loads(await server.get("/control"))["policy"] == "none"
    rebound = {"Host": f"site.example:{port}"}
    for path in ("/weights", "/status", "/control", "/"):
        async with session.get(server.url + path, headers=rebound) as response:
            assert response.status == 403, path
    async with session.get(server.url + "/healthz", headers=rebound) as response:
        assert response.status == 200  # a worker given this port asks it by any name
    for host in (f"localhost:{port}", f"[::1]:{port}", f"{socket.gethostname()}:{port}"):
        async with session.get(server.url + "/status", headers={"Host": host}) as response:
            assert response.status == 200, host
    own_page = {"Origin": server.url, "Content-Type": "application/json"}
    async with session.post(server.url + "/control", data=body, headers=own_page) as response:
        assert response.status == 200, await response.text()
    async with session.post(server.url + "/control", json={"staleness": "none"}) as response:
        assert response.status == 200  # a program: no Origin
    assert json.loads(await server.get("/control"))["policy"] == "none"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_control_body_nested_too_deeply_is_a_400_not_a_traceback(lab: Lab) -> None:
    """json's decoder recurses per level: 2000 brackets raised a RecursionError that
    aiohttp logged as a traceback and answered 500 (the lab fails on tracebacks)."""
    server = await lab.server("--min-workers", "9", *SMALL_JOB)
    session = await lab.http()
    deep = "[" * 2000 + "]" * 2000
    async with session.post(server.url + "/control", data=deep) as response:
        assert response.status == 400 and "nested too deeply" in await response.text()


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_chunked_control_body_is_read_within_the_same_bound(lab: Lab) -> None:
    """A 20-byte body sent chunked (no Content-Length) was refused as "a JSON body of at
    most 4096 bytes"; one past the bound, chunked, still is."""
    server = await lab.server("--min-workers", "9", *SMALL_JOB)
    session = await lab.http()

    async def chunks(body: bytes) -> AsyncIterator[bytes]:
        for start in range(0, len(body), 7):
            yield body[start : start + 7]

    small = json.dumps({"staleness": "bounded:2"}).encode()
    async with session.post(server.url + "/control", data=chunks(small)) as response:
        assert response.status == 200, await response.text()
    assert json.loads(await server.get("/control"))["policy"] == "bounded:2"
    large = json.dumps({"staleness": "none", "pad": "x" * 5000}).encode()
    async with session.post(server.url + "/control", data=chunks(large)) as response:
        assert response.status == 400 and "at most 4096 bytes" in await response.text()
    assert json.loads(await server.get("/control"))["policy"] == "bounded:2"


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_control_body_sent_too_slowly_is_a_408_and_its_connection_closes(
    lab: Lab,
) -> None:
    """The body gets http_header_seconds after its headers; the 408 then kept the
    connection open as long again, waiting for a next request (found by a probe)."""
    bound = 1.0
    server = await lab.server("--http-header-seconds", str(bound), "--min-workers", "9",
                              *SMALL_JOB)  # fmt: skip
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", server.server.http_port)
    writer.write(b"POST /control HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 40\r\n"
                 b"Content-Type: application/json\r\n\r\n{")  # fmt: skip
    started = loop.time()
    answer = await asyncio.wait_for(reader.read(), 10 * bound)  # to its end: closed
    took = loop.time() - started
    writer.close()
    assert answer.startswith(b"HTTP/1.1 408") and b"the request body took too long" in answer
    # closed with the answer once the rest of the body has had a moment to come (its
    # linger, as long as the bound at most), where aiohttp lingered 10 s and then kept it
    # for the next request's wait
    assert bound <= took < 5 * bound, took


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_token_from_a_file_made_secret_is_the_files_token(
    lab: Lab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SNET_TOKEN with a trailing newline (a Kubernetes Secret made --from-file of
    `openssl rand -hex 16 > token`) was the server's token as it stood: every HTTP client
    was refused (a Bearer value is stripped), and so was a worker given the same file
    with --token-file (read stripped). Every way of giving it now reads the same token."""
    monkeypatch.setenv("SNET_TOKEN", "sesame\n")
    server = await lab.server("--min-workers", "9", *SMALL_JOB)
    monkeypatch.delenv("SNET_TOKEN")
    session = await lab.http()
    bearer = {"Authorization": "Bearer sesame"}
    async with session.get(server.url + "/status", headers=bearer) as response:
        assert response.status == 200
    async with session.get(server.url + "/status?token=sesame") as response:
        assert response.status == 200
    token_file = tmp_path / "token"
    token_file.write_text("sesame\n")
    token_file.chmod(0o600)
    worker = lab.worker(server, "w1", "--token-file", str(token_file))
    await wait_until(lambda: bool(server.server.coordinator.sessions), 10, "the worker joined")
    worker.stop("test over")
    assert await worker.wait(10) == 0
    assert WorkerConfig(token=" sesame\n").token == "sesame"


def test_client_certificates_alone_say_the_http_port_is_open(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """--tls-client-ca guards the worker port only: without a token the HTTP port serves
    /status and /weights to anyone, and the warning said "(--insecure): the ports are
    open", a flag not given (a probe)."""
    certified = ServerConfig(host="0.0.0.0", tls_cert="s.pem", tls_key="s.key",
                             tls_client_ca="ca.pem")  # fmt: skip
    caplog.set_level(logging.WARNING, "snet.server")
    assert resolve_token(certified) is None
    assert "the HTTP port asks for none: anyone who reaches it can read /status" in caplog.text
    assert "--insecure" not in caplog.text
    caplog.clear()
    assert resolve_token(ServerConfig(host="0.0.0.0", insecure=True)) is None
    assert "no token (--insecure): the ports are open" in caplog.text
    caplog.clear()
    assert resolve_token(dataclasses.replace(certified, token="abc")) == "abc"
    assert "HTTP port" not in caplog.text


def test_a_workers_token_in_its_config_file_is_said_as_the_servers_is(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose token sat in a file others could read joined without a word, where
    the server says it of its own (a probe)."""
    from snet.cli.commands import with_token

    monkeypatch.delenv("SNET_TOKEN", raising=False)
    monkeypatch.delenv("SNET_WORKER_TOKEN", raising=False)
    caplog.set_level(logging.WARNING)
    assert with_token(WorkerConfig(token="abc")).token == "abc"
    assert "the token was given as a flag or in the config file" in caplog.text
    caplog.clear()
    monkeypatch.setenv("SNET_WORKER_TOKEN", "abc")  # the advised way: nothing said
    assert with_token(WorkerConfig(token="abc")).token == "abc" and caplog.text == ""
    secret = tmp_path / "token"
    secret.write_text("from-the-file\n")
    secret.chmod(0o644)
    assert with_token(WorkerConfig(token_file=str(secret))).token == "from-the-file"
    assert "can be read by other users of this machine (mode 644)" in caplog.text
