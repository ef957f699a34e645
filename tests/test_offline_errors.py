"""The offline commands (``snet eval``, ``data convert``, ``plan``) and the weights and data
files they share with ``snet train`` and the server, given a user's mistake: one line
naming what to fix and exit 2, never a traceback, found before the work where it can be
(run in this process: ``main([...])``). ``snet train``: test_train_errors.py; ``snet tls
init``: test_tls_init_errors.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from snet.cli import offline
from snet.cli.main import main
from snet.protocol.network import NetworkSpec, initial_weights
from snet.server.export import weights_npz

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
    err = error(["data", "convert", data, str(out)], capsys, status=1)  # not bad input: 1
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
