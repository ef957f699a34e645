"""What the tests of the commands' refusals share: a tiny data set, a TOML file, and running
``snet ARGV`` in this process for its one-line error (test_offline_errors.py,
test_train_errors.py, test_tls_init_errors.py, test_cli_errors.py, test_cli_flags.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from snet.cli.main import main

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


def refused(
    argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2
) -> tuple[str, str]:
    """Run ``snet ARGV`` in this process: its one-line error (its exit status asserted)
    and what it printed on stdout."""
    assert main(argv) == status
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err, captured.out


def error(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    """Run ``snet ARGV`` in this process; its one-line error (its exit status asserted)."""
    return refused(argv, capsys, status)[0]


def toml_file(tmp_path: Path, text: str) -> str:
    """``text`` written as ``tmp_path/snet.toml``; its path, for ``--config``."""
    path = tmp_path / "snet.toml"
    path.write_text(text)
    return str(path)
