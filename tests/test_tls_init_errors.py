"""``snet tls init`` given a user's mistake, or a file system that fails it: one line naming
what to fix and exit 2, never a traceback, and never a half-written or replaced file (run
in this process: ``main([...])``). The other offline commands: test_offline_errors.py."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from snet.cli.main import main
from snet.transport import certificates
from snet.transport.files import write_atomically

from user_errors import error


@pytest.mark.parametrize(
    ("workers", "expected"),
    [
        ("w1,w1,../evil,", "worker name 'w1' is given twice"),
        ("w1,../evil", "worker name '../evil': use 1-64 letters, digits, '.', '-' or '_', "
                       "not starting with '.' (it names the files NAME.pem and NAME.key)"),
        ("w1,", "an empty worker name (a stray comma in --workers?)"),
        ("a/b", "worker name 'a/b': use 1-64"),
        ("..", "worker name '..': use 1-64"),
        ("ca", "worker name 'ca' would overwrite ca.pem: choose another"),
        ("server", "worker name 'server' would overwrite server.pem: choose another"),
    ],
)  # fmt: skip
def test_tls_init_refuses_worker_names_that_are_no_safe_file_names(
    tmp_path: Path, workers: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("cryptography")
    directory = tmp_path / "pki" / "inner"
    err = error(["tls", "init", str(directory), "--workers", workers], capsys)
    assert err.startswith(f"snet: {expected}"), err
    assert not (tmp_path / "pki").exists()  # nothing written, inside or out


@pytest.mark.parametrize(
    ("hosts", "expected"),
    [
        ("a b", "host 'a b': not an IP address or a DNS name"),
        ("../x", "host '../x': not an IP address or a DNS name"),
        ("*.*", "host '*.*': a wildcard needs a name of at least two labels after it"),
        ("*.com", "host '*.com': a wildcard needs a name of at least two labels after it"),
        ("1.2.3.999", "host '1.2.3.999': not an IP address, and a DNS name's last label"),
        ("a.example,,b", "an empty host (a stray comma in --hosts?)"),
        ("b.example,-a.example", "host '-a.example': not an IP address or a DNS name"),
        ("x" * 64 + ".example", "host 'xxxx"),
    ],
)
def test_tls_init_refuses_hosts_that_are_no_address_or_dns_name(
    tmp_path: Path, hosts: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("cryptography")
    err = error(["tls", "init", str(tmp_path / "pki"), f"--hosts={hosts}"], capsys)
    assert err.startswith(f"snet: {expected}"), err
    assert not (tmp_path / "pki").exists()


def test_tls_init_takes_addresses_names_and_a_leading_wildcard(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("cryptography")
    from cryptography import x509

    hosts = "server.example,*.nodes.example,10.0.0.5,::1,host-1.local."
    pki = tmp_path / "pki"
    assert main(["tls", "init", str(pki), "--hosts", hosts, "--workers", "w-1,w_2,w.3"]) == 0
    certificate = x509.load_pem_x509_certificate((pki / "server.pem").read_bytes())
    names = certificate.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {*names.get_values_for_type(x509.DNSName)} >= {"*.nodes.example", "host-1.local."}
    assert {str(a) for a in names.get_values_for_type(x509.IPAddress)} >= {"10.0.0.5", "::1"}
    assert all((pki / f"{name}.pem").exists() for name in ("w-1", "w_2", "w.3"))


@pytest.mark.parametrize("kind", ["file", "unmakeable"])
def test_tls_init_into_a_file_is_one_line(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("cryptography")
    target = tmp_path / "text.npz"
    target.write_text("hello\n")
    if kind == "unmakeable":
        target = target / "pki"
    reason = "File exists" if kind == "file" else "Not a directory"
    err = error(["tls", "init", str(target)], capsys)
    assert err == f"snet: cannot use directory {target}: {reason}"


def test_tls_init_that_cannot_write_a_file_writes_none(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The third file on a full disk: the two written are removed, and the directories
    made for them (a real full file system: test_tls.py); the same command then works."""
    pytest.importorskip("cryptography")
    write, calls = certificates.write_atomically, []

    def full_disk(path: Path, data: bytes, mode: int = 0o644, replace: bool = True) -> None:
        calls.append(path.name)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        write(path, data, mode, replace)

    monkeypatch.setattr(certificates, "write_atomically", full_disk)
    pki = tmp_path / "pki" / "inner"
    err = error(["tls", "init", str(pki)], capsys, status=1)
    assert err == f"snet: cannot write {pki / calls[2]}: No space left on device (nothing written)"
    assert not (tmp_path / "pki").exists()
    monkeypatch.undo()
    assert main(["tls", "init", str(pki)]) == 0
    assert sorted(p.name for p in pki.iterdir()) == [
        "ca.key", "ca.pem", "server.key", "server.pem", "worker.key", "worker.pem",
    ]  # fmt: skip


def test_tls_init_never_replaces_a_file_made_after_its_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process makes ``server.pem`` after tls init checked the directory and
    before it writes that file: a rename would replace it. The file stays the other's,
    the files written before it are removed, and it is one line, exit 2."""
    pytest.importorskip("cryptography")
    write, calls = certificates.write_atomically, []
    pki = tmp_path / "pki"

    def raced(path: Path, data: bytes, mode: int = 0o644, replace: bool = True) -> None:
        calls.append(path.name)
        if len(calls) == 3:
            path.write_bytes(b"made by another process\n")
        write(path, data, mode, replace)

    monkeypatch.setattr(certificates, "write_atomically", raced)
    err = error(["tls", "init", str(pki)], capsys)
    assert err == (
        f"snet: {pki / calls[2]} appeared while snet tls init was writing: not overwritten "
        "(nothing written)"
    )
    assert [p.name for p in pki.iterdir()] == [calls[2]]  # no temporary, nothing of ours
    assert (pki / calls[2]).read_bytes() == b"made by another process\n"


def test_a_write_that_may_not_replace_fails_on_a_file_present_and_leaves_it(
    tmp_path: Path,
) -> None:
    target = tmp_path / "ca.key"
    target.write_bytes(b"theirs\n")
    with pytest.raises(FileExistsError):
        write_atomically(target, b"ours\n", 0o600, replace=False)
    assert [p.name for p in tmp_path.iterdir()] == ["ca.key"]
    assert target.read_bytes() == b"theirs\n"
    fresh = tmp_path / "ca.pem"
    write_atomically(fresh, b"new\n", 0o600, replace=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ca.key", "ca.pem"]
    assert fresh.read_bytes() == b"new\n" and fresh.stat().st_mode & 0o777 == 0o600
    assert fresh.stat().st_nlink == 1  # the temporary name is gone


def test_a_link_nfs_made_before_answering_exists_is_taken_as_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """NFS may make the link, lose its reply and answer the retry with EEXIST: the name is
    then this very file's, and the write succeeded."""
    link = os.link

    def lost_reply(source: str, target: Path) -> None:
        link(source, target)
        raise FileExistsError(errno.EEXIST, "File exists", source, None, str(target))

    monkeypatch.setattr(os, "link", lost_reply)
    target = tmp_path / "server.pem"
    write_atomically(target, b"ours\n", 0o644, replace=False)
    assert [p.name for p in tmp_path.iterdir()] == ["server.pem"]
    assert target.read_bytes() == b"ours\n" and target.stat().st_nlink == 1


REFUSED_FILES = "(snet tls init replaces no file: move them away or choose another directory)"


def test_tls_init_refuses_a_directory_holding_a_file_it_would_write(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A ``server.pem`` the user made with another tool, a ``worker.key``: tls init
    overwrote them (only ``ca.key`` was refused), and on a full disk removed them with
    the files it had written. Now it is one line naming them, exit 2, and nothing in the
    directory changes; a dangling link of such a name counts too (a rename replaces it)."""
    pytest.importorskip("cryptography")
    pki = tmp_path / "pki"
    pki.mkdir()
    theirs = {"server.pem": b"the user's own certificate\n", "worker.key": b"a key\n"}
    for name, content in theirs.items():
        (pki / name).write_bytes(content)
    (pki / "notes.txt").write_text("not one of its files\n")
    (pki / "w1.pem").symlink_to(tmp_path / "nowhere")
    err = error(["tls", "init", str(pki), "--workers", "w1,worker"], capsys)
    expected = (
        f"snet: {pki} already holds server.pem, w1.pem, worker.key: not overwritten {REFUSED_FILES}"
    )
    assert err == expected
    untouched = ["notes.txt", "server.pem", "w1.pem", "worker.key"]
    assert sorted(p.name for p in pki.iterdir()) == untouched  # none written beside them
    assert {name: (pki / name).read_bytes() for name in theirs} == theirs


def test_tls_init_after_a_run_killed_between_two_files_names_what_it_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run SIGKILLed between two files leaves the first few of the set (``ca.key`` is
    written last, so never a CA key; made here by removing the rest of a whole set): the
    second run names them, and once they are moved away the same command makes them all."""
    pytest.importorskip("cryptography")
    pki = tmp_path / "pki"
    assert main(["tls", "init", str(pki)]) == 0
    capsys.readouterr()
    for name in ("ca.key", "worker.pem", "worker.key"):  # what the kill left unwritten
        (pki / name).unlink()
    err = error(["tls", "init", str(pki)], capsys)
    expected = (
        f"snet: {pki} already holds ca.pem, server.key, server.pem: not overwritten {REFUSED_FILES}"
    )
    assert err == expected
    for path in list(pki.iterdir()):
        path.unlink()
    assert main(["tls", "init", str(pki)]) == 0
    assert len(list(pki.iterdir())) == 6


def test_a_file_written_atomically_is_whole_or_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A write that fails after its bytes went out (ENOSPC at fsync, as NFS and ext4's
    delayed allocation answer) leaves the file as it was, and no temporary."""
    target = tmp_path / "ca.pem"
    target.write_bytes(b"the old one\n")

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full_disk)
    with pytest.raises(OSError, match="No space left"):
        write_atomically(target, b"-----BEGIN CERTIFICATE-----\n", 0o600)
    monkeypatch.undo()
    assert [p.name for p in tmp_path.iterdir()] == ["ca.pem"]
    assert target.read_bytes() == b"the old one\n"
    write_atomically(target, b"new\n", 0o600)
    assert target.read_bytes() == b"new\n" and target.stat().st_mode & 0o777 == 0o600
