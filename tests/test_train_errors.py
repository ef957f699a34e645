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

from snet.cli import train as train_command
from snet.cli.main import main
from snet.data.sources import open_source
from snet.protocol.errors import OutDirInUse, OutDirUnwritable
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
    # (a file there: "File exists" was said, which it does, but is not why: a probe)
    reason = "not a directory" if kind == "file" else "Not a directory"
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
    # --force: the earlier weights are to be replaced (refused without: below)
    argv = _train(tmp_path, "--out-dir", str(out), "--epochs", "3", "--force")
    err = error(argv, capsys, status=130)
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
        self.signum = signal.SIGTERM

    def after_bunch(self, event: BunchEvent) -> None:
        if event.epoch == self.epoch:
            os.kill(os.getpid(), self.signum)


@pytest.mark.parametrize(("name", "status"), [("SIGTERM", 143), ("SIGHUP", 129)])
def test_sigterm_in_train_stops_as_ctrl_c_does_with_status_143(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch,
    name: str, status: int,
) -> None:  # fmt: skip
    """And SIGHUP (a closed terminal) likewise, status 129: it ended the run at once."""
    import snet.cli.train as command

    out = tmp_path / "out"
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    stop = Sigterm(1)
    stop.signum = signal.Signals[name]
    monkeypatch.setattr(command, "standard_hooks", lambda: HookSet([stop]))
    err = error(_train(tmp_path, "--out-dir", str(out), "--epochs", "3"), capsys, status=status)
    # it ended the process on the spot before: every trained epoch lost
    where = f"snet train: stopped by {name} in epoch 2 of 3"
    assert err == f"{where}: the weights so far in {out / 'weights.npz'}"
    with np.load(out / "weights.npz") as data:
        assert int(data["epoch"]) == 1
    # the process's own handlers are back (SIGINT's is SIG_IGN in a shell's background job)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before
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


def test_train_onto_a_full_disk_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The trained weights that could not be written (a full disk) were a traceback."""

    def full_disk(path: Path, payload: bytes) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(train_command, "write_atomically", full_disk)
    data = str(tiny_set(tmp_path / "d.npz"))
    out = tmp_path / "o"
    err = error(["train", *TINY, "--data", data, "--out-dir", str(out)], capsys, status=1)
    assert err == (
        f"snet: cannot write the trained weights to {out / 'weights.npz'}: No space left on device"
    )


def test_an_out_dir_on_a_full_disk_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The out-dir lock's pid text on a full disk raised an OSError out of the server's
    and snet train's start (a traceback); the lock is not kept either."""

    def full_disk(fd: int, data: bytes, offset: int) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full_disk)
    lock = OutDirLock(str(tmp_path / "o"))
    with pytest.raises(OutDirUnwritable) as refusal:  # exit 1, retried: not a setting (2)
        lock.acquire()
    assert str(refusal.value) == (
        f"cannot use out-dir {tmp_path / 'o'}: cannot write {tmp_path / 'o' / '.lock'}: "
        "No space left on device"
    )
    monkeypatch.undo()
    again = OutDirLock(str(tmp_path / "o"))
    again.acquire()  # nothing was left holding it
    again.release()


def test_snet_train_says_which_settings_of_a_servers_job_it_does_not_use(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A [job] table or SNET_JOB_* shared with a server may set its mode, codecs or
    staleness: snet train (which has no such flags) trained without them and said nothing."""
    data = str(tiny_set(tmp_path / "d.npz"))
    monkeypatch.setenv("SNET_JOB_MODE", "bmuf")
    monkeypatch.setenv("SNET_JOB_COMPRESS", "sign")
    assert main(["train", *TINY, "--data", data, "--out-dir", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().err.splitlines() == [
        "snet train: trains in one process: mode=bmuf, compress=sign (a server's) not used"
    ]
    monkeypatch.delenv("SNET_JOB_MODE")
    monkeypatch.delenv("SNET_JOB_COMPRESS")
    assert main(["train", *TINY, "--data", data, "--out-dir", str(tmp_path / "p")]) == 0
    assert capsys.readouterr().err == ""  # nothing to say


def test_misspelt_data_and_board_variables_are_refused_by_eval_and_the_boards(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """snet eval read SNET_JOB_DATA_* without refusing a misspelt one, as train, server and
    demo do; snet spert (and the demo's boards) ignored a misspelt SNET_SPERT_*."""
    data = str(tiny_set(tmp_path / "d.npz"))
    out = tmp_path / "o"
    assert main(["train", *TINY, "--data", data, "--out-dir", str(out)]) == 0
    capsys.readouterr()
    monkeypatch.setenv("SNET_JOB_DATA_SOURCEE", "x")
    assert error(["eval", "--weights", str(out / "weights.npz")], capsys) == (
        "snet: SNET_JOB_DATA_SOURCEE: no such job data setting (did you mean "
        "'SNET_JOB_DATA_SOURCE'?)"
    )
    monkeypatch.delenv("SNET_JOB_DATA_SOURCEE")
    monkeypatch.setenv("SNET_SPERT_TRAIN_MCUP", "5")
    assert error(["spert", "--server", "127.0.0.1:9"], capsys) == (
        "snet: SNET_SPERT_TRAIN_MCUP: no such board setting (did you mean "
        "'SNET_SPERT_TRAIN_MCUPS'?)"
    )


def test_snet_train_names_the_tables_of_its_config_it_does_not_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A [server] out_dir (the weights went to snet-out) and a [worker] table were read by
    nobody without a word; the demo named them already."""
    data = str(tiny_set(tmp_path / "d.npz"))
    config = tmp_path / "all.toml"
    config.write_text(f'[server]\nout_dir = "o7"\n[job]\ndata = {{ source = "{data}" }}\n'
                      '[worker]\nname = "x"\n')  # fmt: skip
    argv = ["train", *TINY, "--config", str(config), "--out-dir", str(tmp_path / "o")]
    assert main(argv) == 0
    assert capsys.readouterr().err.splitlines() == [
        f"snet train: reads the [job] table of {config} only: [server], [worker] not used"
    ]


def test_an_earlier_runs_weights_are_not_replaced_without_a_word(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rerun started again at epoch 1 and, stopped, replaced a stopped run's 7 epochs of
    weights with its 1 (a probe): refused, unless --force, or continued from them."""
    out = tmp_path / "out"
    assert main(_train(tmp_path, "--out-dir", str(out), "--epochs", "1")) == 0
    first = (out / "weights.npz").read_bytes()
    err = error(_train(tmp_path, "--out-dir", str(out), "--epochs", "1"), capsys)
    weights = out / "weights.npz"
    assert err == (
        f"snet: {weights} holds the weights of an earlier run, which this one would replace: "
        f"add --force to replace them, --init-weights {weights} to continue from them, or "
        "give another --out-dir"
    )
    assert weights.read_bytes() == first
    continued = ["--out-dir", str(out), "--epochs", "1", "--init-weights", str(weights)]
    assert main(_train(tmp_path, *continued)) == 0  # continued from them: replaced by it
    assert weights.read_bytes() != first
    # its epoch counts the epochs trained into the weights (it said this run's: 1, a
    # probe), and the normalisation is beside them as a server leaves it (for Quicknet)
    assert read_weights(weights).epoch == 2
    assert (out / "norms").read_text().startswith("vec ")
    monkeypatch.chdir(tmp_path)  # the same file named from elsewhere: continued too
    relative = ["--out-dir", str(out), "--epochs", "1", "--init-weights", "out/weights.npz"]
    assert main(_train(tmp_path, *relative)) == 0
    assert main(_train(tmp_path, "--out-dir", str(out), "--epochs", "1", "--force")) == 0
    lock = OutDirLock(str(out))
    lock.acquire()  # each refusal let the lock go
    lock.release()


def test_a_file_named_checkpoints_is_no_servers_run_to_snet_train(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It was said to hold "a server's run (checkpoints)" (a probe): a server's run keeps
    a directory of checkpoints and a status.json file; snet train writes neither."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "checkpoints").write_text("not a directory")
    (out / "status.json").mkdir()
    assert main(_train(tmp_path, "--out-dir", str(out), "--epochs", "1")) == 0
    assert (out / "weights.npz").is_file()
    (out / "weights.npz").unlink()
    (out / "status.json").rmdir()
    (out / "status.json").write_text("{}")  # a server's record: refused
    err = error(_train(tmp_path, "--out-dir", str(out), "--epochs", "1"), capsys)
    assert "holds a server's run (status.json)" in err
