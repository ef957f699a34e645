"""Data as users bring it: images without sequences, a separate CV file and a test file.

A small synthetic set of Fashion-MNIST's shape (28 x 28 images, ten classes, no
``lengths``) trains on a real server with real workers; ``snet eval`` then reports the
CV accuracy the server reported, because the split travels with the weights.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from snet.data.cache import shared_frames
from snet.data.corpus import job_norms
from snet.data.joined import JoinedSource, open_job_source, split_frames
from snet.data.norms import Norms
from snet.data.sources import open_source
from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec
from snet.server.export import read_weights

from helpers import Cluster, run_snet, system_ring_environment

IMAGE_JOB = ["--network", "784:24:10", "--context", "0", "--bunch-size", "50"]


def snet(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``snet ARGS`` on numpy's step, as the Cluster's workers here train
    (``helpers.system_ring_environment``): the subject is the data, not the step, and
    loading the compiled step cost each ``snet train`` and ``snet eval`` 0.8 s of CPU (the
    compiled step runs in real processes in test_cli_errors.py's, test_bmuf.py's and
    test_training.py's). An eval then scores with the step the server scored with."""
    return run_snet(*args, cwd=cwd, env=system_ring_environment())


def image_set(path: Path, count: int, seed: int) -> Path:
    """``count`` 28 x 28 uint8 images in ten classes, each class a blurred template plus
    noise (learnable in an epoch or two), stored as Fashion-MNIST users store it: X and
    y only."""
    templates = np.random.default_rng(0).integers(0, 256, (10, 28, 28)).astype(np.float64)
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, count)
    images = templates[labels] * 0.6 + rng.integers(0, 256, (count, 28, 28)) * 0.4
    np.savez(path, X=images.astype(np.uint8), y=labels.astype(np.int64))
    return path


def test_images_without_lengths_are_frames_of_their_own(tmp_path: Path) -> None:
    source = open_source(DataSpec(source=str(image_set(tmp_path / "i.npz", 30, 1)), context=0))
    assert source.features == 784 and len(source.lengths) == 30
    assert (source.lengths == 1).all()


@pytest.mark.system  # starts real processes
def test_image_data_with_the_default_context_suggests_context_0(tmp_path: Path) -> None:
    data = image_set(tmp_path / "images.npz", 40, 1)
    result = snet("train", "--data", str(data), "--network", "784:24:10", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    said = "has no sequences (no lengths, or every utterance one frame long), so a window of 4"
    assert said in result.stderr
    assert "or --context 0 (context = 0 in [job.data]) for data without sequences" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_cv_file_is_joined_after_the_training_data(tmp_path: Path) -> None:
    train = image_set(tmp_path / "train.npz", 50, 1)
    cv = image_set(tmp_path / "cv.npz", 20, 2)
    spec = DataSpec(source=str(train), cv_source=str(cv), context=0)
    source = open_job_source(spec)
    assert source.cv_utterances == 20 and len(source.lengths) == 70
    train_frames, cv_frames = split_frames(spec, source.lengths, source.cv_utterances)
    assert train_frames.tolist() == list(range(50)) and cv_frames.tolist() == list(range(50, 70))
    with np.load(cv) as data:
        expected = data["X"].reshape(20, -1)[[3, 7]].astype(np.float32)
    rows = np.array([53, 10, 57])
    read = source.read(rows)
    assert np.array_equal(read[[0, 2]], expected)
    assert np.array_equal(source.labels[50:], np.load(cv)["y"])


def test_a_cv_file_of_other_features_is_refused(tmp_path: Path) -> None:
    train = open_source(DataSpec(source=str(image_set(tmp_path / "t.npz", 10, 1)), context=0))
    np.savez(tmp_path / "cv.npz", X=np.zeros((4, 5), "f4"), y=np.zeros(4, np.int64))
    cv = open_source(DataSpec(source=str(tmp_path / "cv.npz"), context=0))
    with pytest.raises(DataError, match=r"the CV file .* has 5 features per frame"):
        JoinedSource(train, cv)


def test_fashion_shaped_data_with_a_cv_file_trains_and_eval_agrees(
    cluster: Cluster, tmp_path: Path
) -> None:
    train = image_set(tmp_path / "train.npz", 3000, 1)
    cv = image_set(tmp_path / "cv.npz", 600, 2)
    test = image_set(tmp_path / "test.npz", 500, 3)
    server = cluster.server(
        "--data", str(train), "--cv-data", str(cv), "--test-data", str(test),
        *IMAGE_JOB, "--epochs", "2", "--learning-rates", "0.05", "--mode", "sync",
        "--min-workers", "2",
    )  # fmt: skip
    cache = tmp_path / "cache"
    workers = [
        cluster.worker(server, f"w{i}", "--backend", "numpy", "--data-cache", str(cache))
        for i in range(2)
    ]
    assert server.wait(120) == 0, server.log.read_text()[-3000:]
    for worker in workers:
        assert worker.wait(30) == 0
    status = server.final_status()
    last = status["epochs"][-1]
    assert last["cv_frames"] == 600  # the CV file, not a share of the training file
    assert status["epochs"][0]["ledger"]["frames"] == 3000  # all of train.npz trains
    assert last["cv_accuracy"] > 0.5  # learnt something: chance is 0.1
    assert status["test"]["frames"] == 500 and status["test"]["data"] == str(test)
    assert "test set" in server.log.read_text()
    # both workers mapped one normalised copy: the training file and the CV file joined
    (shared,) = cache.glob("frames-*.npy")
    assert np.load(shared, mmap_mode="r").shape == (3600, 784)

    weights = server.out_dir / "weights.npz"
    saved = read_weights(weights)
    assert saved.data is not None and saved.data.cv_source == str(cv)
    result = snet("eval", "--weights", str(weights), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    scored = json.loads(result.stdout)
    assert scored["frames"] == 600 and scored["data"] == str(cv)
    assert scored["accuracy"] == pytest.approx(last["cv_accuracy"], abs=1e-6)
    tested = json.loads(
        snet("eval", "--weights", str(weights), "--subset", "test", "--json", cwd=tmp_path).stdout
    )
    assert tested["frames"] == 500
    assert tested["accuracy"] == status["test"]["accuracy"]


@pytest.mark.system  # starts real processes
def test_eval_scores_the_jobs_split_not_the_default(tmp_path: Path) -> None:
    data = image_set(tmp_path / "images.npz", 400, 1)
    out = tmp_path / "out"
    trained = snet(
        "train", "--data", str(data), *IMAGE_JOB, "--epochs", "1", "--cv-fraction", "0.25",
        "--split-seed", "7", "--out-dir", str(out), cwd=tmp_path,
    )  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    cv_line = [line for line in trained.stdout.splitlines() if line.startswith("epoch")][-1]
    scored = json.loads(
        snet("eval", "--weights", str(out / "weights.npz"), "--json", cwd=tmp_path).stdout
    )
    assert scored["frames"] == 100  # a quarter of 400, as the job said; not 40
    assert f"CV {100 * scored['accuracy']:6.2f}%" in cv_line


@pytest.mark.system  # starts real processes
def test_eval_of_weights_without_a_saved_split_says_what_it_assumes(tmp_path: Path) -> None:
    data = image_set(tmp_path / "images.npz", 100, 1)
    out = tmp_path / "out"
    trained = snet("train", "--data", str(data), *IMAGE_JOB, "--epochs", "1",
                   "--out-dir", str(out), cwd=tmp_path)  # fmt: skip
    assert trained.returncode == 0, trained.stderr
    with np.load(out / "weights.npz") as saved:  # as written before the split was saved
        arrays = {k: saved[k] for k in saved.files if k != "data_spec"}
    np.savez(out / "old.npz", **arrays)
    result = snet("eval", "--weights", str(out / "old.npz"), "--data", str(data), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "assuming cv_fraction 0.1 and split_seed 0" in result.stderr
    missing = snet("eval", "--weights", str(out / "weights.npz"), "--subset", "test",
                   cwd=tmp_path)  # fmt: skip
    assert missing.returncode == 2
    assert "has no test file: name one with --test-data" in missing.stderr


def test_workers_of_one_machine_share_one_normalised_copy(tmp_path: Path) -> None:
    train = image_set(tmp_path / "train.npz", 300, 1)
    cv = image_set(tmp_path / "cv.npz", 50, 2)
    spec = DataSpec(source=str(train), cv_source=str(cv), context=0)
    source = open_job_source(spec)
    assert source.parts[0]._features._array is None  # type: ignore[attr-defined]
    norms = job_norms(spec, source, split_frames(spec, source.lengths, 50)[0])
    first = shared_frames(source, norms, tmp_path / "cache")
    again = shared_frames(open_job_source(spec), norms, tmp_path / "cache")
    assert isinstance(first, np.memmap) and isinstance(again, np.memmap)
    assert not first.flags.writeable and first.filename == again.filename
    assert np.array_equal(first, norms.apply(source.read(np.arange(350))))
    assert len(list((tmp_path / "cache").glob("frames-*.npy"))) == 1
    # another normalisation, or a rewritten data file, is another copy
    other = Norms(norms.mean + 1.0, norms.std)
    assert shared_frames(source, other, tmp_path / "cache").filename != first.filename
    image_set(train, 300, 9)
    changed = shared_frames(open_job_source(spec), norms, tmp_path / "cache")
    assert changed is not None and not np.array_equal(changed, first)


def test_the_copies_of_deleted_data_are_pruned(tmp_path: Path) -> None:
    gone = image_set(tmp_path / "gone.npz", 40, 1)
    source = open_job_source(DataSpec(source=str(gone), context=0))
    norms = Norms(np.zeros(784), np.ones(784))
    assert shared_frames(source, norms, tmp_path / "cache") is not None
    gone.unlink()
    kept = open_job_source(DataSpec(source=str(image_set(tmp_path / "kept.npz", 40, 2)), context=0))
    shared_frames(kept, norms, tmp_path / "cache")
    assert len(list((tmp_path / "cache").glob("frames-*.npy"))) == 1


def test_an_unusable_cache_directory_means_a_copy_of_its_own(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    source = open_job_source(DataSpec(source=str(image_set(tmp_path / "i.npz", 40, 1)), context=0))
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    norms = Norms(np.zeros(784), np.ones(784))
    assert shared_frames(source, norms, blocker / "cache") is None
    assert "cannot use the data cache" in caplog.text


def test_eval_flags_are_decoded_on_top_of_the_saved_data(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from snet.cli.offline import eval_spec
    from snet.cli.parser import command_parser
    from snet.protocol.errors import ConfigError
    from snet.protocol.network import NetworkSpec
    from snet.server.export import SavedWeights

    monkeypatch.delenv("SNET_JOB_DATA_SPLIT_SEED", raising=False)
    job = DataSpec(source="t.npz", cv_source="cv.npz", context=0, norm_file="job.norms")
    saved = SavedWeights(NetworkSpec((784, 10), ()), np.zeros(7850, "f4"), 1, None, 0, job)

    def spec(*flags: str) -> DataSpec:
        return eval_spec(command_parser().parse_args(["eval", "--weights", "w.npz", *flags]), saved)

    assert spec() == DataSpec(source="t.npz", cv_source="cv.npz", context=0)  # saved norms
    assert spec("--split-seed", "7", "--test-data", "x.npz").split_seed == 7
    assert spec("--test-data", "x.npz").test_source == "x.npz"
    monkeypatch.setenv("SNET_JOB_DATA_SPLIT_SEED", "3")
    assert spec().split_seed == 3
    with pytest.raises(ConfigError, match=r"--context: 'two' is not a whole number"):
        spec("--context", "two")


def test_bmuf_scores_the_test_file_with_the_weights_it_saves(
    cluster: Cluster, tmp_path: Path
) -> None:
    """With Nesterov block momentum the weights sent to workers (the look-ahead point) are
    not the model saved: the test file is scored with the saved model, as snet eval is."""
    server = cluster.server(
        "--data", str(image_set(tmp_path / "train.npz", 800, 1)),
        "--test-data", str(image_set(tmp_path / "test.npz", 300, 3)),
        *IMAGE_JOB, "--epochs", "2", "--learning-rates", "0.05", "--mode", "bmuf",
        "--block-filter", "nbm", "--block-bunches", "2", "--block-momentum", "0.5",
    )  # fmt: skip
    worker = cluster.worker(server, "alone", "--backend", "numpy")
    assert server.wait(120) == 0, server.log.read_text()[-3000:]
    assert worker.wait(30) == 0
    status = server.final_status()
    assert status["rule"]["blocks"] > 0 and status["test"]["frames"] == 300
    weights = str(server.out_dir / "weights.npz")
    tested = snet("eval", "--weights", weights, "--subset", "test", "--json", cwd=tmp_path)
    assert tested.returncode == 0, tested.stderr
    assert json.loads(tested.stdout)["loss"] == status["test"]["loss"]


def test_a_cache_on_a_full_disk_is_a_warning_not_a_sigbus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The cache's copy is written through a memory map of a sparse file: on a full file
    system the kernel answered a page written with SIGBUS, and the worker died (exit 135)
    saying nothing. Its blocks are reserved first, so a full disk is an OSError: the
    worker says so and holds its own copy, and no temporary is left."""
    train = image_set(tmp_path / "train.npz", 40, 1)
    source = open_job_source(DataSpec(source=str(train), context=0))
    norms = Norms(np.zeros(784), np.ones(784))
    reserved: list[int] = []

    def full_disk(fd: int, offset: int, length: int) -> None:
        reserved.append(length)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "posix_fallocate", full_disk)
    with caplog.at_level(logging.WARNING, "snet.data"):
        assert shared_frames(source, norms, tmp_path / "cache") is None
    assert reserved and reserved[0] >= 40 * 784 * 4  # the whole file, header and frames
    assert "No space left on device): this process holds its own copy" in caplog.text
    assert not list((tmp_path / "cache").glob("*.tmp"))
