"""``snet train`` given a user's mistake: found before the first epoch (the out-dir, its
lock, the threads, the memory, the test file), one line and exit 2 (1 for a locked
out-dir, as the server); Ctrl-C one line and status 130 (run in this process)."""

from __future__ import annotations

import os
import signal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snet.cli.main import main
from snet.data.sources import open_source
from snet.protocol.errors import OutDirInUse
from snet.protocol.hooks import BunchEvent, Hook, HookSet
from snet.protocol.job import DataSpec
from snet.server.export import read_weights
from snet.server.service import OutDirLock
from snet.server.testset import describe_test_result, score_test_set

from user_errors import TINY, error, refused, tiny_set

# ---------------------------------------------------------------- snet train, up front


def _train(tmp_path: Path, *more: str) -> list[str]:
    data = str(tiny_set(tmp_path / "d.npz"))
    return ["train", *TINY, "--data", data, *more]


@pytest.mark.parametrize("kind", ["file", "unmakeable"])
def test_train_refuses_an_unusable_out_dir_before_training(
    tmp_path: Path, kind: str, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "text.npz"
    out.write_text("hello\n")
    if kind == "unmakeable":
        out = out / "below"  # a directory under a file cannot be made
    err, printed = refused(_train(tmp_path, "--out-dir", str(out)), capsys)
    reason = "File exists" if kind == "file" else "Not a directory"
    assert err == f"snet: cannot use out-dir {out}: {reason}"
    assert printed == ""  # refused before the first epoch


def test_train_respects_and_holds_the_out_dir_lock(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    server = OutDirLock(str(out))  # as a running server holds it
    server.acquire()
    try:
        err = error(_train(tmp_path, "--out-dir", str(out)), capsys, status=1)
    finally:
        server.release()
    pid = os.getpid()
    assert err == (
        f"snet: out-dir {out} is in use by another snet server (pid {pid}); "
        "stop it or choose another --out-dir"
    )
    assert not (out / "weights.npz").exists()

    import snet.cli.train as command

    refused: list[str] = []
    real = command.train_job

    def while_training(*args: Any, **kwargs: Any) -> Any:
        try:  # a server started now is refused, naming snet train
            OutDirLock(str(out)).acquire()
        except OutDirInUse as exc:
            refused.append(str(exc))
        return real(*args, **kwargs)

    monkeypatch.setattr(command, "train_job", while_training)
    assert main(_train(tmp_path, "--out-dir", str(out))) == 0
    assert refused == [f"out-dir {out} is in use by another snet train (pid {pid}); "
                       "stop it or choose another --out-dir"]  # fmt: skip
    assert (out / "weights.npz").exists()
    OutDirLock(str(out)).acquire()  # released at the end


def test_train_checks_the_test_file_up_front_and_scores_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    missing = tmp_path / "missing.npz"
    err = error(_train(tmp_path, "--out-dir", str(out), "--test-data", str(missing)), capsys)
    assert err == f"snet: data {missing} does not exist"
    test = tiny_set(tmp_path / "test.npz", utterances=4, seed=5)
    assert main(_train(tmp_path, "--out-dir", str(out), "--test-data", str(test))) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    # the server's scoring of the same weights gives the same line
    saved = read_weights(out / "weights.npz")
    assert saved.norms is not None
    source = open_source(DataSpec(source=str(test), context=1))
    scored = score_test_set(saved.spec, saved.flat, source, saved.norms, 1)
    assert last == describe_test_result(scored)
    assert last.startswith(f"test set {test}: frame accuracy ")


def test_train_writes_where_snet_out_dir_says_as_the_server_does(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("SNET_OUT_DIR", str(tmp_path / "from-env"))
    assert main(_train(tmp_path)) == 0
    assert (tmp_path / "from-env" / "weights.npz").exists()
    assert not (tmp_path / "snet-out").exists()  # it wrote ./snet-out whatever the variable said
    assert main(_train(tmp_path, "--out-dir", str(tmp_path / "flag"))) == 0  # the flag wins
    assert (tmp_path / "flag" / "weights.npz").exists()
    capsys.readouterr()


@pytest.mark.parametrize("left", ["status.json", "checkpoints"])
def test_train_refuses_an_out_dir_holding_a_servers_run(
    tmp_path: Path, left: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """It replaced a finished demo's weights.npz, which the demo went on showing as its
    own (its status and checkpoints describe the other network)."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "weights.npz").write_bytes(b"the server's")
    if left == "checkpoints":
        (out / left).mkdir()
    else:
        (out / left).write_text('{"state": "trained"}')
    err = error(_train(tmp_path, "--out-dir", str(out)), capsys)
    assert err == (
        f"snet: {out} holds a server's run ({left}): snet train would replace its "
        "weights.npz; give another --out-dir, or remove that run"
    )
    assert (out / "weights.npz").read_bytes() == b"the server's"
    OutDirLock(str(out)).acquire()  # not kept by the refused run


class CtrlC(Hook):
    """Ctrl-C where it lands: at the start of epoch ``epoch`` (0-based: before its first
    step), or after its first step (``mid``)."""

    def __init__(self, epoch: int, mid: bool) -> None:
        self.epoch, self.mid = epoch, mid

    def before_epoch(self, epoch: int, learning_rate: float) -> None:
        if epoch == self.epoch and not self.mid:
            raise KeyboardInterrupt

    def after_bunch(self, event: BunchEvent) -> None:
        if event.epoch == self.epoch and self.mid:
            raise KeyboardInterrupt


@pytest.mark.parametrize(("epoch", "mid"), [(0, False), (1, True)])
def test_ctrl_c_in_train_is_one_line_status_130_and_saves_what_was_trained(
    tmp_path: Path,
    epoch: int,
    mid: bool,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import snet.cli.train as command

    out = tmp_path / "out"
    out.mkdir()
    (out / "weights.npz").write_bytes(b"an earlier run's")
    monkeypatch.setattr(command, "standard_hooks", lambda: HookSet([CtrlC(epoch, mid)]))
    err = error(_train(tmp_path, "--out-dir", str(out), "--epochs", "3"), capsys, status=130)
    where = f"snet train: stopped by Ctrl-C in epoch {epoch + 1} of 3"
    if not mid:  # before the first step: nothing to save, the earlier file left alone
        assert err == f"{where}: nothing trained, no weights written"
        assert (out / "weights.npz").read_bytes() == b"an earlier run's"
    else:  # as a server stopped by SIGINT: the weights so far, to go on from
        assert err == f"{where}: the weights so far in {out / 'weights.npz'}"
        saved = read_weights(out / "weights.npz")
        assert saved.spec.describe() == "39:8:3"
        with np.load(out / "weights.npz") as data:
            assert int(data["epoch"]) == 1  # whole epochs in them
    OutDirLock(str(out)).acquire()  # the lock went with the run


class Sigterm(Hook):
    """A real SIGTERM to this process after the first step of epoch ``epoch``, as
    ``timeout``, ``docker stop`` or Slurm send one."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def after_bunch(self, event: BunchEvent) -> None:
        if event.epoch == self.epoch:
            os.kill(os.getpid(), signal.SIGTERM)


def test_sigterm_in_train_stops_as_ctrl_c_does_with_status_143(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import snet.cli.train as command

    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(command, "standard_hooks", lambda: HookSet([Sigterm(1)]))
    err = error(_train(tmp_path, "--out-dir", str(out), "--epochs", "3"), capsys, status=143)
    # it ended the process on the spot before: every trained epoch lost
    where = "snet train: stopped by SIGTERM in epoch 2 of 3"
    assert err == f"{where}: the weights so far in {out / 'weights.npz'}"
    with np.load(out / "weights.npz") as data:
        assert int(data["epoch"]) == 1
    assert signal.getsignal(signal.SIGTERM) == before  # the process's own handler is back
    assert signal.getsignal(signal.SIGINT) == signal.default_int_handler
    OutDirLock(str(out)).acquire()  # the lock went with the run


# ---------------------------------------------------------------- threads, memory


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        ("0", None, "snet: --threads must be >= 1, got 0"),
        ("-1", None, "snet: --threads must be >= 1, got -1"),
        (None, "0", "snet: SNET_TRAIN_THREADS must be >= 1, got 0"),
        (None, "x", "snet: SNET_TRAIN_THREADS: 'x' is not a whole number"),
    ],
)
def test_train_refuses_threads_as_a_worker_does(
    tmp_path: Path,
    flag: str | None,
    env: str | None,
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if env is not None:
        monkeypatch.setenv("SNET_TRAIN_THREADS", env)
    threads = [] if flag is None else ["--threads", flag]
    argv = _train(tmp_path, "--out-dir", str(tmp_path / "o"), *threads)
    assert error(argv, capsys) == expected
    assert not (tmp_path / "o").exists()  # refused before anything was made
    if flag is not None:  # the worker's own words
        worker = ["worker", "--server", "127.0.0.1:7000", "--threads", flag]
        assert error(worker, capsys) == expected


def test_train_refuses_a_network_too_large_for_memory_before_allocating(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import snet.cli.train as command

    def no_allocation(*args: Any) -> Any:
        raise AssertionError("allocated the network")

    assert (command.available_bytes() or 0) > 0  # this machine's is known
    monkeypatch.setattr(command, "available_bytes", lambda: 8 << 30)
    monkeypatch.setattr(command, "start_rule", no_allocation)
    argv = ["train", "--network", "117:100000000:10", "--out-dir", str(tmp_path / "o")]
    err = error(argv, capsys)
    assert err == (
        "snet: network 117:100000000:10 needs about 1382.8 GiB of memory to train: 5 float32 "
        "copies of its 47.7 GiB of weights (5 of the weights, momentum, gradient and step) and "
        "1144.4 GiB for a bunch's activations (1,024 rows); this machine's available memory "
        "is 8.0 GiB"
    )
    err = error([*argv, "--schedule", "newbob"], capsys)  # it keeps the best weights too
    assert err == (
        "snet: network 117:100000000:10 needs about 1430.5 GiB of memory to train: 6 float32 "
        "copies of its 47.7 GiB of weights (5 of the weights, momentum, gradient and step, 1 "
        "of newbob's best weights) and 1144.4 GiB for a bunch's activations (1,024 rows); this "
        "machine's available memory is 8.0 GiB"
    )
    assert not (tmp_path / "o").exists()


def test_ctrl_c_while_the_test_file_is_scored_keeps_the_final_weights(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import snet.cli.train as command

    def interrupted(*args: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(command, "score_test_set", interrupted)
    out = tmp_path / "out"
    test = str(tiny_set(tmp_path / "test.npz", utterances=4, seed=5))
    err = error(_train(tmp_path, "--out-dir", str(out), "--test-data", test), capsys, 130)
    assert err == (
        "snet train: stopped by Ctrl-C after training: weights in "
        f"{out / 'weights.npz'}, the test file not scored"
    )
    with np.load(out / "weights.npz") as data:
        assert int(data["epoch"]) == 1  # the finished run's


# ---------------------------------------------------------------- the data's values


def _altered(path: Path, source: Path, change: Any) -> str:
    """``source``'s arrays with ``change(X, y)`` applied, saved at ``path``."""
    with np.load(source) as data:
        arrays = {name: data[name].copy() for name in data.files}
    changed = change(arrays["X"], arrays["y"])
    if changed is not None:
        arrays["X"] = changed
    np.savez(path, **arrays)
    return str(path)


def test_nan_or_infinite_features_are_refused_naming_the_file_and_frame(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NaN trained nothing (0 % train and CV, NaN norms in weights.npz); in a CV or test
    file it was scored silently (loss nan); under a server every worker refused the job's
    NaN normalisation with a message about its shape."""
    good = tiny_set(tmp_path / "good.npz")

    def poke(value: float, row: int) -> Any:
        def change(x: np.ndarray, y: np.ndarray) -> None:
            x[row, 3] = value

        return change

    nan = _altered(tmp_path / "nan.npz", good, poke(np.nan, 17))
    argv = ["train", *TINY, "--data", nan, "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys) == (
        f"snet: {nan}: frame 17 has nan in feature 3: features must be finite numbers"
    )
    cv = _altered(tmp_path / "cv.npz", good, poke(np.inf, 5))
    argv = ["train", *TINY, "--data", str(good), "--cv-data", cv, "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys) == (
        f"snet: {cv}: frame 5 has inf in feature 3: features must be finite numbers"
    )
    argv = ["train", *TINY, "--data", str(good), "--test-data", nan]
    assert error([*argv, "--out-dir", str(tmp_path / "o")], capsys).startswith(
        f"snet: {nan}: frame 17 has nan"
    )
    assert not (tmp_path / "o" / "weights.npz").exists()


def test_a_bad_cv_label_names_the_cv_file_and_its_frame(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It named the training file, with the joined row's number."""
    good = tiny_set(tmp_path / "good.npz")

    def label(x: np.ndarray, y: np.ndarray) -> None:
        y[3] = 7

    cv = _altered(tmp_path / "cv.npz", good, label)
    argv = ["train", *TINY, "--data", str(good), "--cv-data", cv, "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys).startswith(f"snet: {cv}: labels run from 0 to 7 (frame 3 has ")


def test_features_that_are_not_real_numbers_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Text was a traceback (ValueError from the normalisation); complex numbers lost
    their imaginary halves with a warning."""
    good = tiny_set(tmp_path / "good.npz")
    for kind, convert in (("complex64", np.complex64), ("<U32", str)):
        path = _altered(tmp_path / f"{kind}.npz", good, lambda x, y, c=convert: x.astype(c))
        argv = ["train", *TINY, "--data", path, "--out-dir", str(tmp_path / "o")]
        assert error(argv, capsys) == (
            f"snet: {path}: features must be real numbers (integers or floats), not {kind}"
        )


def test_an_empty_cv_or_test_file_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An empty CV file fell back to the job's split, unsaid (and `snet eval` then named
    it beside frames it did not hold); an empty test file was scored, 0.00 % of 0."""
    good = str(tiny_set(tmp_path / "good.npz"))
    empty = tmp_path / "empty.npz"
    np.savez(empty, X=np.zeros((0, 13), np.float32), y=np.zeros(0, np.int64), lengths=[])
    out = ["--out-dir", str(tmp_path / "o")]
    argv = ["train", *TINY, "--data", good, "--cv-data", str(empty), *out]
    assert error(argv, capsys) == f"snet: the CV file {empty} has no frames"
    argv = ["train", *TINY, "--data", good, "--test-data", str(empty), *out]
    assert error(argv, capsys) == f"snet: the test file {empty} has no frames"
    argv = ["data", "convert", str(empty), str(tmp_path / "empty.pfile")]  # was a traceback
    assert error(argv, capsys) == f"snet: {empty} has no frames: nothing to convert"


def test_one_class_is_refused_with_a_fix_that_can_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "1 classes ...: end the network with :1", a network that learns nothing."""
    good = tiny_set(tmp_path / "good.npz")

    def one_class(x: np.ndarray, y: np.ndarray) -> None:
        y[:] = 0

    path = _altered(tmp_path / "one.npz", good, one_class)
    argv = ["train", *TINY, "--data", path, "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys) == (
        f"snet: {path} has 1 class (labels 0..0), but the network has 3 outputs: a "
        "classifier needs frames of at least two classes"
    )


def test_eval_scores_trained_weights_on_data_with_fewer_classes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It refused data without the top class ("end the network with :2"), which trained
    weights cannot do; a subset of the classes is a fair thing to score."""
    good = tiny_set(tmp_path / "good.npz")
    out = tmp_path / "o"
    assert main(["train", *TINY, "--data", str(good), "--out-dir", str(out)]) == 0

    def two_classes(x: np.ndarray, y: np.ndarray) -> None:
        y[y == 2] = 1

    subset = _altered(tmp_path / "two.npz", good, two_classes)
    capsys.readouterr()
    argv = ["eval", "--weights", str(out / "weights.npz"), "--data", subset, "--subset", "all"]
    assert main(argv) == 0
    assert "frame accuracy" in capsys.readouterr().out


def test_eval_elsewhere_names_the_flag_for_data_saved_by_a_relative_path(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The weights keep the path as the run was given it: read from another folder it
    "did not exist", with nothing said of how to point at it."""
    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    tiny_set(tmp_path / "run" / "d.npz")
    assert main(["train", *TINY, "--data", "d.npz", "--out-dir", "o"]) == 0
    monkeypatch.chdir(tmp_path)
    capsys.readouterr()
    weights = str(tmp_path / "run" / "o" / "weights.npz")
    assert error(["eval", "--weights", weights], capsys) == (
        f"snet: data d.npz does not exist (the data {weights} was trained on: --data names it)"
    )
    assert main(["eval", "--weights", weights, "--data", str(tmp_path / "run" / "d.npz")]) == 0
