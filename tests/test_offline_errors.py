"""The offline commands (``snet train``, ``eval``, ``data convert``, ``tls init``, ``plan``)
given a user's mistake: one line naming what to fix and exit 2, never a traceback, and
found before the training where it can be (run in this process: ``main([...])``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from snet.cli.main import main
from snet.protocol.network import NetworkSpec, initial_weights
from snet.server.export import weights_npz

TINY = ["--network", "39:8:3", "--context", "1", "--epochs", "1", "--bunch-size", "16"]


def tiny_set(path: Path, utterances: int = 12, seed: int = 0) -> Path:
    """A small learnable data set of 13 features in three classes, in sequences."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(5, 12, utterances)
    labels = rng.integers(0, 3, int(lengths.sum()))
    labels[:3] = [0, 1, 2]  # every class present
    frames = rng.normal(size=(len(labels), 13)) + labels[:, None]
    np.savez(path, X=frames.astype(np.float32), y=labels, lengths=lengths)
    return path


def _error(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    """Run ``snet ARGV`` in this process; its one-line error (its exit status asserted)."""
    assert main(argv) == status
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err


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
    assert _error(["eval", "--weights", str(bad)], capsys).startswith(expected)
    data = str(tiny_set(tmp_path / "d.npz"))
    train = ["train", *TINY, "--data", data, "--out-dir", str(tmp_path / "o")]
    assert _error([*train, "--init-weights", str(bad)], capsys).startswith(expected)
    assert not (tmp_path / "o" / "weights.npz").exists()


def test_a_damaged_member_is_one_line_too(
    tmp_path: Path, weights: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    payload = bytearray(weights.read_bytes())
    start = payload.index(b"W0.npy") + 200  # inside the first layer's weights
    payload[start : start + 64] = b"x" * 64
    bad = tmp_path / "bad.npz"
    bad.write_bytes(payload)
    err = _error(["eval", "--weights", str(bad)], capsys)
    assert err.startswith(f"snet: cannot read weights from {bad}: "), err


@pytest.mark.parametrize("flag", ["--data", "--cv-data"])
def test_a_text_file_as_data_is_no_archive_and_no_pickle_advice(
    tmp_path: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    text = tmp_path / "text.npz"
    text.write_text("hello\n")
    data = str(tiny_set(tmp_path / "d.npz"))
    argv = ["train", *TINY, "--data", data, flag, str(text), "--out-dir", str(tmp_path / "o")]
    err = _error(argv, capsys)
    assert err == f"snet: cannot read data {text}: {text} is not an .npz archive (or is " + (
        "truncated or corrupt)"
    )
    assert "pickle" not in err
