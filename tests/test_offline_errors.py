"""The offline commands (``snet eval``, ``data convert``, ``tls init``, ``plan``) and the
weights and data files they share with ``snet train`` and the server, given a user's
mistake: one line naming what to fix and exit 2, never a traceback, found before the work
where it can be (run in this process: ``main([...])``). ``snet train``: test_train_errors.py."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
import pytest

from snet.cli import offline
from snet.cli.main import main
from snet.protocol.network import NetworkSpec, initial_weights
from snet.server.export import weights_npz
from snet.transport import certificates
from snet.transport.files import write_atomically

from user_errors import TINY, error, refused, tiny_set


@pytest.fixture
def weights(tmp_path: Path) -> Path:
    spec = NetworkSpec.parse("39:8:3")
    path = tmp_path / "weights.npz"
    path.write_bytes(weights_npz(spec, initial_weights(spec, 1), 0, 1))
    return path


# ---------------------------------------------------------------- not an .npz archive


@pytest.mark.parametrize("damage", ["truncated", "text"])
def test_weights_that_are_no_archive_are_one_line_naming_the_file(
    tmp_path: Path, weights: Path, damage: str, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / f"{damage}.npz"
    if damage == "truncated":
        bad.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        bad.write_text("hello\n")
    expected = f"snet: cannot read weights from {bad}: {bad} is not an .npz archive"
    assert error(["eval", "--weights", str(bad)], capsys).startswith(expected)
    data = str(tiny_set(tmp_path / "d.npz"))
    train = ["train", *TINY, "--data", data, "--out-dir", str(tmp_path / "o")]
    assert error([*train, "--init-weights", str(bad)], capsys).startswith(expected)
    assert not (tmp_path / "o" / "weights.npz").exists()


def test_a_data_set_given_as_weights_is_said_to_be_no_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "'sizes is not a file in the archive'", numpy's words for a missing key."""
    data = tiny_set(tmp_path / "d.npz")
    err = error(["eval", "--weights", str(data)], capsys)
    assert err == (
        f"snet: cannot read weights from {data}: not a file of snet weights (it holds X, y, "
        "lengths, not sizes, activations, W0, b0, ...)"
    )


def test_a_damaged_member_is_one_line_too(
    tmp_path: Path, weights: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = bytearray(weights.read_bytes())
    start = payload.index(b"W0.npy") + 200  # inside the first layer's weights
    payload[start : start + 64] = b"x" * 64
    bad = tmp_path / "bad.npz"
    bad.write_bytes(payload)
    err = error(["eval", "--weights", str(bad)], capsys)
    assert err.startswith(f"snet: cannot read weights from {bad}: "), err


@pytest.mark.parametrize("flag", ["--data", "--cv-data", "--test-data"])
def test_a_text_file_as_data_is_no_archive_and_no_pickle_advice(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "text.npz"
    text.write_text("hello\n")
    data = str(tiny_set(tmp_path / "d.npz"))
    argv = ["train", *TINY, "--data", data, flag, str(text), "--out-dir", str(tmp_path / "o")]
    err = error(argv, capsys)
    assert err == f"snet: cannot read data {text}: {text} is not an .npz archive (or is " + (
        "truncated or corrupt)"
    )
    assert "pickle" not in err


# ---------------------------------------------------------------- snet tls init


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


# ---------------------------------------------------------------- data convert, plan


@pytest.mark.parametrize(
    ("output", "expected"),
    [
        ("nodir/x/d.npz", "{tmp}/nodir/x does not exist"),
        ("text.npz/d.npz", "{tmp}/text.npz is not a directory"),
        ("d.txt", "use .pfile, .pf, .npz, .ark"),
    ],
)
def test_convert_checks_its_output_before_reading_the_input(
    tmp_path: Path, output: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "text.npz").write_text("hello\n")
    out = tmp_path / output
    missing_input = str(tmp_path / "not-read.npz")  # checked after the output: not reached
    err = error(["data", "convert", missing_input, str(out)], capsys)
    assert err == f"snet: cannot write output {out}: {expected.format(tmp=tmp_path)}"


def test_convert_into_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "out.npz").mkdir()
    data = str(tiny_set(tmp_path / "d.npz"))
    err = error(["data", "convert", data, str(tmp_path / "out.npz")], capsys)
    assert err == f"snet: cannot write {tmp_path / 'out.npz'}: Is a directory"


@pytest.mark.parametrize("text_file", ["features", "labels"])
def test_kaldi_text_that_is_no_archive_is_one_line(
    tmp_path: Path, text_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("kaldiio")
    good = tmp_path / "good.ark"
    assert main(["data", "convert", str(tiny_set(tmp_path / "d.npz")), str(good)]) == 0
    capsys.readouterr()
    text = tmp_path / "text.ark"
    text.write_text("a b c\n")
    features, labels = (text, tmp_path / "good-ali.ark")
    if text_file == "labels":
        features, labels = good, text
    argv = ["data", "convert", str(features), str(tmp_path / "o.npz"), "--labels", str(labels)]
    err = error(argv, capsys)
    assert err == (
        f"snet: cannot read Kaldi {text_file} {text}: b is not a digit; File format is wrong?"
    )


@pytest.mark.parametrize(
    ("png", "expected"),
    [("p.txt", "use .png"), ("nodir/p.png", "{tmp}/nodir does not exist")],
)
def test_plan_checks_its_png_before_any_work(
    tmp_path: Path, png: str, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    err, printed = refused(["plan", "--png", str(tmp_path / png)], capsys)
    assert err == f"snet: cannot write --png {tmp_path / png}: {expected.format(tmp=tmp_path)}"
    assert printed == ""  # no table printed in vain


def test_a_converted_scp_reads_from_any_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The scp named its ark as given (relative): trained from another folder, kaldiio
    could not find it."""
    pytest.importorskip("kaldiio")
    made = tmp_path / "made"
    made.mkdir()
    monkeypatch.chdir(made)
    assert main(["data", "convert", str(tiny_set(tmp_path / "d.npz")), "d.ark"]) == 0
    first = (made / "d.scp").read_text().splitlines()[0]
    assert first.split()[1].startswith(f"{made / 'd.ark'}:")
    monkeypatch.chdir(tmp_path)  # elsewhere: the same scp still reads
    back = str(tmp_path / "back.npz")
    argv = ["data", "convert", str(made / "d.scp"), back, "--labels", str(made / "d-ali.ark")]
    assert main(argv) == 0
    capsys.readouterr()


def test_convert_onto_a_full_disk_leaves_no_truncated_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`snet data convert` onto a full disk said "cannot write" and left a truncated
    pfile (and empty .ark, .npz files) under the output's name. What it wrote goes; a
    file it could not open at all (another user's, say) stays."""
    data = str(tiny_set(tmp_path / "d.npz"))
    out = tmp_path / "o.pfile"

    def full_disk(path: Path, *args: object) -> None:
        Path(path).write_bytes(b"-pfile_header version 0 size 32768\n")  # the first block
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(offline, "write_pfile", full_disk)
    err = error(["data", "convert", data, str(out)], capsys)
    assert err == f"snet: cannot write {out}: No space left on device"
    assert not out.exists()
    out.write_text("someone else's\n")

    def not_allowed(path: Path, *args: object) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(offline, "write_pfile", not_allowed)
    argv = ["data", "convert", data, str(out), "--force"]  # replace it, if it could
    assert error(argv, capsys).endswith("Permission denied")
    assert out.read_text() == "someone else's\n"


def test_convert_never_writes_onto_its_input_nor_replaces_a_file_unasked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Converted onto itself, an .npz was rewritten in place (4.7 MB of uint8 became
    18.9 MB of float32; a failed write would have lost it), and an existing output was
    replaced without a word. Now: onto itself, refused even with --force; another file
    that exists, refused unless --force; nothing read or written either way."""
    data = tiny_set(tmp_path / "d.npz")
    original = data.read_bytes()
    for argv in (["--force"], []):
        err = error(["data", "convert", str(data), str(data), *argv], capsys)
        assert err == (
            f"snet: the output {data} is the input {data} itself: give the output another "
            "name (nothing written)"
        )
    link = tmp_path / "link.npz"
    link.symlink_to(data)  # the same file by another name
    assert "is the input" in error(["data", "convert", str(data), str(link), "--force"], capsys)
    other = tmp_path / "other.npz"
    other.write_bytes(b"kept")
    err = error(["data", "convert", str(data), str(other)], capsys)
    assert err == f"snet: {other} exists: --force replaces it (nothing written)"
    assert other.read_bytes() == b"kept" and data.read_bytes() == original
    assert main(["data", "convert", str(data), str(other), "--force"]) == 0
    with np.load(other) as converted, np.load(data) as source:
        assert np.array_equal(converted["y"], source["y"])
