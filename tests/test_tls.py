"""TLS on both ports and mutual TLS, end to end with real processes (issue 12 item 4)."""

from __future__ import annotations

import json
import ssl
import sys
import urllib.request
from pathlib import Path

import pytest

from snet.protocol.errors import ConfigError
from snet.transport.certificates import make_cluster_certificates
from snet.transport.tls import (
    client_context,
    read_token_file,
    refusal,
    server_context,
    server_contexts,
)

from full_disk import run_on_full_disk
from helpers import QUICK_JOB, Cluster, run_process

pytest.importorskip("cryptography")


def _pki(tmp_path: Path) -> tuple[Path, Path]:
    ours, theirs = tmp_path / "pki", tmp_path / "other-pki"
    make_cluster_certificates(ours, ["127.0.0.1"])
    make_cluster_certificates(theirs, ["127.0.0.1"])
    return ours, theirs


def test_certificates_and_contexts(tmp_path: Path) -> None:
    pki, _ = _pki(tmp_path)
    assert (pki / "ca.key").stat().st_mode & 0o777 == 0o600
    server_context(str(pki / "server.pem"), str(pki / "server.key"), str(pki / "ca.pem"))
    client_context(str(pki / "ca.pem"), str(pki / "worker.pem"), str(pki / "worker.key"))
    with pytest.raises(ConfigError, match="does not exist"):
        client_context(str(pki / "missing.pem"))
    with pytest.raises(ConfigError, match="both tls_cert and tls_key"):
        client_context(str(pki / "ca.pem"), str(pki / "worker.pem"))
    with pytest.raises(ConfigError, match=f"{pki} is a directory: give the CA's file"):
        client_context(str(pki))  # it said "does not exist"
    plain = ssl.SSLError(1, "[SSL: WRONG_VERSION_NUMBER] wrong version number (_ssl.c:1000)")
    assert refusal(plain).startswith("the server does not serve TLS (")
    assert refusal(plain).endswith("): drop --tls-ca")
    with pytest.raises(ConfigError) as refused:  # a second run into the same directory
        make_cluster_certificates(pki, [])
    assert str(refused.value) == (
        f"{pki} already holds ca.key, ca.pem, server.key, server.pem, worker.key, worker.pem: "
        "not overwritten (snet tls init replaces no file: move them away or choose another "
        "directory)"
    )


def test_secrets_other_users_can_read_are_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A token file or a TLS key of mode 644 was taken without a word (the docs ask 600)."""
    pki, _ = _pki(tmp_path)
    server_context(str(pki / "server.pem"), str(pki / "server.key"))
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    token.chmod(0o600)
    assert read_token_file(str(token)) == "s3cret"
    assert "other users" not in caplog.text  # 600, as snet tls init makes its keys
    token.chmod(0o644)
    (pki / "server.key").chmod(0o640)
    read_token_file(str(token))
    server_context(str(pki / "server.pem"), str(pki / "server.key"))
    assert (
        f"token_file {token} can be read by other users of this machine (mode 644): "
        "chmod 600 it" in caplog.text
    )
    assert (
        f"the server's TLS key {pki / 'server.key'} can be read by other users of this "
        "machine (mode 640)" in caplog.text
    )


def test_an_expired_certificate_is_said_at_start(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A server with an expired certificate started without a word, and every worker was
    then refused ("certificate has expired")."""
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "old")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(1)
        .not_valid_before(now - datetime.timedelta(days=30))
        .not_valid_after(now - datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (tmp_path / "old.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (tmp_path / "old.key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption()))  # fmt: skip
    (tmp_path / "old.key").chmod(0o600)
    server_contexts(str(tmp_path / "old.pem"), str(tmp_path / "old.key"))  # as a server
    said = (
        f"the server's TLS certificate {tmp_path / 'old.pem'} expired on "
        f"{(now - datetime.timedelta(days=1)).date()}: peers will refuse it"
    )
    assert caplog.text.count(said) == 1  # once (the worker port and HTTP both load it)
    # not valid yet: every worker was refused ("certificate is not yet valid"), unwarned
    young = (
        x509.CertificateBuilder().subject_name(name).issuer_name(name)
        .public_key(key.public_key()).serial_number(2)
        .not_valid_before(now + datetime.timedelta(days=10))
        .not_valid_after(now + datetime.timedelta(days=100))
        .sign(key, hashes.SHA256())
    )  # fmt: skip
    (tmp_path / "young.pem").write_bytes(young.public_bytes(serialization.Encoding.PEM))
    server_context(str(tmp_path / "young.pem"), str(tmp_path / "old.key"))
    assert f"the server's TLS certificate {tmp_path / 'young.pem'} is not valid before " in (
        caplog.text
    )
    pki, _ = _pki(tmp_path / "fresh")
    caplog.clear()
    server_context(str(pki / "server.pem"), str(pki / "server.key"))
    assert "expire" not in caplog.text


def test_workers_train_over_mutual_tls_and_strangers_are_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    pki, other = _pki(tmp_path)
    # QUICK_JOB: the subject is who may connect, not learning
    server = cluster.server(
        "--tls-cert", str(pki / "server.pem"), "--tls-key", str(pki / "server.key"),
        "--tls-client-ca", str(pki / "ca.pem"), "--epochs", "1", "--linger-seconds", "30",
        *QUICK_JOB,
    )  # fmt: skip
    stranger = cluster.worker(server, "stranger", "--tls-ca", str(other / "ca.pem"))
    assert stranger.wait(60) == 4
    assert "the server's certificate is not trusted" in cluster.log("stranger")
    # without a certificate of its own: refused at its third handshake reset, one line,
    # not retried for its window (it exited 3 after it, as if the server were down)
    anonymous = cluster.worker(server, "anonymous", "--tls-ca", str(pki / "ca.pem"),
                               "--retry-seconds", "300")  # fmt: skip
    assert anonymous.wait(30) == 4
    assert "wants a client certificate, and this worker has none" in cluster.log("anonymous")
    # and the server says why (the event loop dropped these handshakes without a word)
    assert ("TLS handshake failed on the worker port: peer did not return a certificate (a "
            "worker without a certificate of its own") in cluster.log("server")  # fmt: skip
    honest = cluster.worker(
        server, "honest", "--tls-ca", str(pki / "ca.pem"),
        "--tls-cert", str(pki / "worker.pem"), "--tls-key", str(pki / "worker.key"),
    )  # fmt: skip
    assert honest.wait(120) == 0
    https = server.url.replace("http://", "https://")
    shown = run_process(
        [sys.executable, "-m", "snet.cli", "status", "--url", https, "--tls-ca",
         str(pki / "ca.pem")],
        timeout=30,
    )  # fmt: skip
    assert shown.returncode == 0 and "(trained)" in shown.stdout, shown.stderr
    bare = run_process(  # a bare HOST:PORT with --tls-ca is https:// (it was http://)
        [sys.executable, "-m", "snet.cli", "status", "--url", https.removeprefix("https://"),
         "--tls-ca", str(pki / "ca.pem")],
        timeout=30,
    )  # fmt: skip
    assert bare.returncode == 0 and "(trained)" in bare.stdout, bare.stderr
    plain = run_process([sys.executable, "-m", "snet.cli", "status", "--url", https], timeout=30)
    assert plain.returncode == 1 and "the server's certificate is not trusted: " in plain.stderr
    assert "(--tls-ca: the CA that signed it)" in plain.stderr  # it gave no hint (a probe)
    http = run_process([sys.executable, "-m", "snet.cli", "status", "--url", server.url],
                       timeout=30)  # fmt: skip
    assert http.returncode == 1
    trusting = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    with urllib.request.urlopen(https + "/status", timeout=10, context=trusting) as response:
        figures = json.loads(response.read())
    # the anonymous worker's three tries (then it stopped); plain HTTP to the HTTPS port
    assert figures["tls_handshakes_failed"] == 3
    assert figures["http_tls_handshakes_failed"] >= 1


# On a full disk; then, with the space back, the same command into the same directory.
TLS_INIT_ON_A_FULL_DISK = """
"$PYTHON" -m snet.cli tls init "$FULL/pki/inner"; echo "exit $?"
ls -A "$FULL"
rm "$FULL/.fill"
"$PYTHON" -m snet.cli tls init "$FULL/pki/inner" >/dev/null; echo "exit $?"
"$PYTHON" -c "import ssl, sys; ssl.create_default_context(cafile=sys.argv[1] + '/ca.pem')\
.load_cert_chain(sys.argv[1] + '/server.pem', sys.argv[1] + '/server.key')" "$FULL/pki/inner"
echo "loaded $?"
"""


@pytest.mark.system  # starts real processes
@pytest.mark.parametrize(("free_pages", "first_unwritten"), [(0, "ca.pem"), (2, "server.key")])
def test_tls_init_on_a_full_disk_writes_nothing(
    tmp_path: Path, free_pages: int, first_unwritten: str
) -> None:
    """A full file system (no room at all, or for two files): the files were written in
    place, and an empty ca.pem stayed (or a CA with an empty server.pem), which later
    commands read as a broken CA, and which a second ``snet tls init`` refused to replace
    ("already holds a CA"). Now it is one line, exit 1, and nothing is left, not even the
    directories it made; with space again the same command makes a CA that loads."""
    full = tmp_path / "full"
    done = run_on_full_disk(full, TLS_INIT_ON_A_FULL_DISK, free_pages)
    unwritten = full / "pki" / "inner" / first_unwritten
    assert done.stderr == (
        f"snet: cannot write {unwritten}: No space left on device (nothing written)\n"
    )
    assert done.stdout.splitlines() == ["exit 1", ".fill", "exit 0", "loaded 0"]


# The user's own server.pem in the directory, then tls init on the disk it fills.
TLS_INIT_BESIDE_A_USERS_FILE = """
mkdir "$FULL/pki" && echo "made with openssl" > "$FULL/pki/server.pem"
"$PYTHON" -m snet.cli tls init "$FULL/pki"; echo "exit $?"
ls -A "$FULL/pki"; cat "$FULL/pki/server.pem"
"""


@pytest.mark.system  # starts real processes
def test_tls_init_on_a_full_disk_keeps_a_file_it_would_have_replaced(tmp_path: Path) -> None:
    """Room for three of its files: tls init replaced the user's server.pem, failed on
    worker.pem, and removed what it had written, the user's file with them. Now a
    directory holding a file it would write is refused before anything is written."""
    full = tmp_path / "full"
    done = run_on_full_disk(full, TLS_INIT_BESIDE_A_USERS_FILE, free_pages=3)
    pki = full / "pki"
    assert done.stderr == (
        f"snet: {pki} already holds server.pem: not overwritten (snet tls init replaces no "
        "file: move them away or choose another directory)\n"
    )
    assert done.stdout.splitlines() == ["exit 2", "server.pem", "made with openssl"]
