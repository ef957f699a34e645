"""The data's values as the commands meet them (snet train, snet eval, snet data, run in
this process): features that are not finite real numbers, empty CV and test files, labels
naming the file they are in, classes, data saved by a relative path."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from snet.cli.main import main
from snet.protocol.errors import DataError

from user_errors import TINY, error, tiny_set


def _altered(path: Path, source: Path, change: Any) -> str:
    """``source``'s arrays with ``change(X, y)`` applied, saved at ``path``."""
    with np.load(source) as data:
        arrays = {name: data[name].copy() for name in data.files}
    changed = change(arrays["X"], arrays["y"])
    if changed is not None:
        arrays["X"] = changed
    np.savez(path, **arrays)
    return str(path)


def _poked(value: float, row: int) -> Any:
    """A change that sets feature 3 of frame ``row`` to ``value``."""

    def change(x: np.ndarray, y: np.ndarray) -> None:
        x[row, 3] = value

    return change


def test_nan_or_infinite_features_are_refused_naming_the_file_and_frame(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NaN trained nothing (0 % train and CV, NaN norms in weights.npz); in a CV or test
    file it was scored silently (loss nan); under a server every worker refused the job's
    NaN normalisation with a message about its shape."""
    good = tiny_set(tmp_path / "good.npz")
    nan = _altered(tmp_path / "nan.npz", good, _poked(np.nan, 17))
    argv = ["train", *TINY, "--data", nan, "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys) == (
        f"snet: {nan}: frame 17 has nan in feature 3: features must be finite numbers"
    )
    cv = _altered(tmp_path / "cv.npz", good, _poked(np.inf, 5))
    argv = ["train", *TINY, "--data", str(good), "--cv-data", cv, "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys) == (
        f"snet: {cv}: frame 5 has inf (or a number beyond float32's range) in feature 3: "
        "features must be finite numbers"
    )
    argv = ["train", *TINY, "--data", str(good), "--test-data", nan]
    assert error([*argv, "--out-dir", str(tmp_path / "o")], capsys).startswith(
        f"snet: {nan}: frame 17 has nan"
    )
    wide = tmp_path / "wide.npz"  # float64, finite, beyond float32: no RuntimeWarning first
    with np.load(good) as data:
        features = data["X"].astype(np.float64)
        features[2, 0] = 1e39
        np.savez(wide, X=features, y=data["y"], lengths=data["lengths"])
    argv = ["train", *TINY, "--data", str(wide), "--out-dir", str(tmp_path / "o")]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert error(argv, capsys) == (
            f"snet: {wide}: frame 2 has inf (or a number beyond float32's range) in feature "
            "0: features must be finite numbers"
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


def test_a_bad_label_range_is_the_named_files_own(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The range was the training and CV files' joined: "cv.npz: labels run from 0" for a
    CV file whose labels start at 1."""
    good = tiny_set(tmp_path / "good.npz")

    def shifted(x: np.ndarray, y: np.ndarray) -> None:
        y += 1  # 1..3 in a network of 3 outputs

    cv = _altered(tmp_path / "cv.npz", good, shifted)
    argv = ["train", *TINY, "--data", str(good), "--cv-data", cv, "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys).startswith(f"snet: {cv}: labels run from 1 to 3 (frame ")


def test_a_missing_relative_path_names_the_directory_it_was_looked_for_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Given in a config file elsewhere, "data mine.npz does not exist" did not say that
    a relative path is read from the working directory."""
    monkeypatch.chdir(tmp_path)
    argv = ["train", *TINY, "--data", "mine.npz", "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys) == f"snet: data mine.npz does not exist in {tmp_path}"


def test_a_split_that_leaves_less_than_a_bunch_to_train_on_is_said(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """--cv-fraction 0.9999 trained on one utterance: "train 0.00 %", exit 0, unsaid."""
    data = tiny_set(tmp_path / "d.npz", utterances=40)
    argv = ["train", *TINY, "--data", str(data), "--out-dir", str(tmp_path / "o")]
    assert main([*argv, "--cv-fraction", "0.9999"]) == 0  # a smoke test may want it
    assert "the split leaves " in caplog.text and "fewer than one bunch (16)" in caplog.text
    assert "a lower --cv-fraction (now 0.9999) or more data trains on more" in caplog.text
    caplog.clear()
    # (--force: the first run's weights are there, and are to be replaced)
    assert main([*argv, "--cv-fraction", "0.5", "--force"]) == 0
    assert "the split leaves" not in caplog.text


def test_a_misspelt_job_variable_is_refused_as_a_toml_key_is(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SNET_JOB_EPOCHZ=2 was ignored without a word (a misspelt [job] key is refused)."""
    data = str(tiny_set(tmp_path / "d.npz"))
    argv = ["train", *TINY, "--data", data, "--out-dir", str(tmp_path / "o")]
    monkeypatch.setenv("SNET_JOB_EPOCHZ", "2")
    assert error(argv, capsys) == (
        "snet: SNET_JOB_EPOCHZ: no such job setting (did you mean 'SNET_JOB_EPOCHS'?)"
    )
    monkeypatch.delenv("SNET_JOB_EPOCHZ")
    monkeypatch.setenv("SNET_JOB_DATA_SPLIT_SEED", "3")  # a real one, of the job's data
    monkeypatch.setenv("SNET_JOB_ACTIVATION", "tanh")  # and the network's, not a field
    monkeypatch.setenv("SNET_JOB_SERVICE_HOST", "10.96.0.5")  # a Service named snet-job's
    assert main(argv) == 0


def test_a_label_beyond_int64_is_not_shown_negative(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = tiny_set(tmp_path / "good.npz")
    with np.load(good) as data:
        labels = data["y"].astype(np.uint64)
        labels[7] = 2**63 + 1
        np.savez(tmp_path / "huge.npz", X=data["X"], y=labels, lengths=data["lengths"])
    huge = tmp_path / "huge.npz"
    argv = ["train", *TINY, "--data", str(huge), "--out-dir", str(tmp_path / "o")]
    assert error(argv, capsys) == (
        f"snet: {huge}: frame 7 has label {2**63 + 1}, beyond any network's outputs"
    )


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


def test_eval_names_every_file_it_scores_and_says_where_cv_frames_come_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With a job whose CV frames are a file of their own, `--data X --subset all` scored
    X and that CV file but named X alone, and `--data X` (subset cv) scored the CV file
    without a word about X."""
    train, cv = tiny_set(tmp_path / "t.npz"), tiny_set(tmp_path / "cv.npz", seed=1)
    out = tmp_path / "o"
    assert main(["train", *TINY, "--data", str(train), "--cv-data", str(cv),
                 "--out-dir", str(out)]) == 0  # fmt: skip
    mine = tiny_set(tmp_path / "mine.npz", utterances=5, seed=2)
    weights = str(out / "weights.npz")
    capsys.readouterr()
    assert main(["eval", "--weights", weights, "--data", str(mine), "--subset", "all"]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"{weights} on {mine} and {cv} (all, ")
    assert main(["eval", "--weights", weights, "--data", str(mine)]) == 0
    said = capsys.readouterr()
    assert said.out.startswith(f"{weights} on {cv} (cv, ")
    assert said.err == (
        f"snet eval: the CV frames of {weights}'s job are its CV file's, {cv} (--cv-data "
        f"names another): --subset train scores {mine}\n"
    )
    assert main(["eval", "--weights", weights, "--data", str(mine), "--subset", "train"]) == 0
    assert capsys.readouterr().out.startswith(f"{weights} on {mine} (train, ")


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


def test_with_a_norm_file_the_values_are_still_checked_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With a norm file no pass computed the norms, and none checked the values: a NaN
    trained nothing. Now it is refused as without one, and with a data cache the check is
    made once for the same files (a marker there), then again when a file changes."""
    from snet.data import cache as data_cache
    from snet.data.cache import KINDS
    from snet.protocol.job import DataSpec, JobSpec
    from snet.protocol.network import NetworkSpec
    from snet.server.dataplan import plan_data

    good = tiny_set(tmp_path / "good.npz")
    norms = tmp_path / "norms"
    norms.write_text("vec 13\n" + " 0" * 13 + "\nvec 13\n" + " 1" * 13 + "\n")
    nan = _altered(tmp_path / "nan.npz", good, _poked(np.nan, 17))
    argv = ["train", *TINY, "--norm-file", str(norms), "--out-dir", str(tmp_path / "o")]
    assert error([*argv, "--data", nan], capsys) == (
        f"snet: {nan}: frame 17 has nan in feature 3: features must be finite numbers"
    )

    cache = tmp_path / "cache"
    network = NetworkSpec.parse("39:8:3")

    def plan(path: Path) -> None:
        spec = DataSpec(source=str(path), context=1, norm_file=str(norms))
        plan_data(JobSpec(network=network, data=spec), str(cache))

    check, checks = data_cache.check_finite, []

    def counted(source: Any, frames: np.ndarray) -> None:
        checks.append(len(frames))
        check(source, frames)

    monkeypatch.setattr(data_cache, "check_finite", counted)
    data = tmp_path / "data.npz"
    data.write_bytes(good.read_bytes())
    plan(data)
    assert len(checks) == 1 and checks[0] > 0
    assert [p.name.split("-")[0] for p in cache.glob("*.ok")] == ["checked"]
    plan(data)  # the same file: the marker says it was checked
    assert len(checks) == 1
    assert "checked" in KINDS  # pruned with the others once its data file is gone
    poked = Path(_altered(tmp_path / "poked.npz", data, _poked(np.inf, 4)))
    poked.replace(data)  # the same name, another file: checked again, and refused
    with pytest.raises(DataError, match=r"frame 4 has inf \(or a number beyond float32's "):
        plan(data)
    assert len(checks) == 2


def test_eval_on_data_of_another_width_names_both_widths(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """It said "weights.npz was trained on 13 features", and not what the data had."""
    tiny_set(tmp_path / "d.npz")
    out = tmp_path / "o"
    assert main(["train", *TINY, "--data", str(tmp_path / "d.npz"), "--out-dir", str(out)]) == 0
    wide = tmp_path / "wide.npz"
    np.savez(wide, X=np.zeros((20, 784), np.float32), y=np.arange(20) % 3)
    capsys.readouterr()
    weights = str(out / "weights.npz")
    argv = ["eval", "--weights", weights, "--data", str(wide), "--context", "0"]
    assert error(argv, capsys) == (
        f"snet: {weights} was trained on 13 features per frame, but {wide} has 784: give "
        "--data the job's kind of data"
    )


def test_a_misspelt_worker_variable_is_refused_and_a_real_one_taken(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """SNET_WORKER_PROGRES_SECONDS=3 was ignored without a word, as SNET_JOB_* were: every
    SNET_WORKER_* variable names a worker setting."""
    from snet.cli.commands import worker_config
    from snet.cli.parser import command_parser
    from snet.cli.settings import ConfigFile

    monkeypatch.setenv("SNET_WORKER_PROGRES_SECONDS", "3")
    assert error(["worker", "--server", "127.0.0.1:1"], capsys) == (
        "snet: SNET_WORKER_PROGRES_SECONDS: no such worker setting "
        "(did you mean 'SNET_WORKER_PROGRESS_SECONDS'?)"
    )
    monkeypatch.delenv("SNET_WORKER_PROGRES_SECONDS")
    monkeypatch.setenv("SNET_WORKER_PROGRESS_SECONDS", "3")
    # what Kubernetes gives every pod for Services named snet-worker and snet-job: not
    # settings, never refused (a review found them refused: every worker stopped)
    for service in ("SNET_WORKER", "SNET_JOB"):
        monkeypatch.setenv(f"{service}_PORT", "tcp://10.96.0.5:7000")
        monkeypatch.setenv(f"{service}_SERVICE_HOST", "10.96.0.5")
        monkeypatch.setenv(f"{service}_SERVICE_PORT", "7000")
        monkeypatch.setenv(f"{service}_SERVICE_PORT_HTTP", "7000")
        monkeypatch.setenv(f"{service}_PORT_7000_TCP", "tcp://10.96.0.5:7000")
        monkeypatch.setenv(f"{service}_PORT_7000_TCP_ADDR", "10.96.0.5")
    args = command_parser().parse_args(["worker", "--server", "127.0.0.1:1"])
    assert worker_config(args, ConfigFile()).progress_seconds == 3
    monkeypatch.setenv("SNET_WORKER_PORT", "7000")  # not a link: a setting that is not one
    assert error(["worker", "--server", "127.0.0.1:1"], capsys).startswith(
        "snet: SNET_WORKER_PORT: no such worker setting"
    )
