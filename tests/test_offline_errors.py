"""The offline commands (``snet train``, ``eval``, ``data convert``, ``tls init``, ``plan``)
given a user's mistake: one line naming what to fix and exit 2, never a traceback, and
found before the training where it can be (run in this process: ``main([...])``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snet.cli.main import main
from snet.data.sources import open_source
from snet.protocol.errors import OutDirInUse
from snet.protocol.hooks import BunchEvent, Hook, HookSet
from snet.protocol.job import DataSpec
from snet.protocol.network import NetworkSpec, initial_weights
from snet.server.export import read_weights, weights_npz
from snet.server.service import OutDirLock
from snet.server.testset import describe_test_result, score_test_set

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


def _refused(
    argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2
) -> tuple[str, str]:
    """Run ``snet ARGV`` in this process: its one-line error (its exit status asserted)
    and what it printed on stdout."""
    assert main(argv) == status
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    return err, captured.out


def _error(argv: list[str], capsys: pytest.CaptureFixture[str], status: int = 2) -> str:
    """Run ``snet ARGV`` in this process; its one-line error (its exit status asserted)."""
    return _refused(argv, capsys, status)[0]


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


@pytest.mark.parametrize("flag", ["--data", "--cv-data", "--test-data"])
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
    err, printed = _refused(_train(tmp_path, "--out-dir", str(out)), capsys)
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
        err = _error(_train(tmp_path, "--out-dir", str(out)), capsys, status=1)
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
    err = _error(_train(tmp_path, "--out-dir", str(out), "--test-data", str(missing)), capsys)
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
    err = _error(_train(tmp_path, "--out-dir", str(out), "--epochs", "3"), capsys, status=130)
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


# ---------------------------------------------------------------- threads, memory


@pytest.mark.parametrize(
    ("flag", "env", "expected"),
    [
        ("0", None, "snet: threads must be >= 1, got 0"),
        ("-1", None, "snet: threads must be >= 1, got -1"),
        (None, "0", "snet: threads must be >= 1, got 0"),
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
    assert _error(argv, capsys) == expected
    assert not (tmp_path / "o").exists()  # refused before anything was made
    if flag is not None:  # the worker's own words
        worker = ["worker", "--server", "127.0.0.1:7000", "--threads", flag]
        assert _error(worker, capsys) == expected


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
    err = _error(argv, capsys)
    assert err == (
        "snet: network 117:100000000:10 needs about 1430.5 GiB of memory to train "
        "(12,800,000,010 weights, 6 float32 copies and a bunch's activations); "
        "this machine has 8.0 GiB available"
    )
    assert not (tmp_path / "o").exists()


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
    err = _error(["tls", "init", str(directory), "--workers", workers], capsys)
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
    err = _error(["tls", "init", str(tmp_path / "pki"), f"--hosts={hosts}"], capsys)
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
    err = _error(["tls", "init", str(target)], capsys)
    assert err == f"snet: cannot use directory {target}: {reason}"


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
    err = _error(["data", "convert", missing_input, str(out)], capsys)
    assert err == f"snet: cannot write output {out}: {expected.format(tmp=tmp_path)}"


def test_convert_into_a_directory_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "out.npz").mkdir()
    data = str(tiny_set(tmp_path / "d.npz"))
    err = _error(["data", "convert", data, str(tmp_path / "out.npz")], capsys)
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
    err = _error(argv, capsys)
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
    err, printed = _refused(["plan", "--png", str(tmp_path / png)], capsys)
    assert err == f"snet: cannot write --png {tmp_path / png}: {expected.format(tmp=tmp_path)}"
    assert printed == ""  # no table printed in vain
