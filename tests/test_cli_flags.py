"""The command line's shape: every flag comes from a config field and has help, every
command runs a function that exists, and ``snet train`` and ``snet demo`` read the
server's TOML job (its other tables said to be unused). Mistakes in what is given:
test_cli_errors.py."""

from __future__ import annotations

import argparse
import os
import time
from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest

from snet import __version__
from snet.cli.parser import command_parser, parse_command
from snet.client.config import WorkerConfig
from snet.client.spert.config import BoardConfig
from snet.protocol.job import DataSpec, JobSpec
from snet.server.config import RESUMED_LINGER_SECONDS, ServerConfig

from helpers import run_snet
from user_errors import toml_file


@pytest.mark.system  # starts real processes
def test_version() -> None:
    done = run_snet("--version")
    assert (done.returncode, done.stdout.strip()) == (0, f"snet {__version__}")


def test_train_offers_only_what_sequential_training_uses(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for flag in ("--mode", "--compress", "--updates-per-step", "--max-in-flight"):
        with pytest.raises(SystemExit) as stopped:
            command_parser().parse_args(["train", flag, "1"])
        assert stopped.value.code == 2
        assert f"unrecognized arguments: {flag} 1" in capsys.readouterr().err
    # as a user meets it: said by snet train's parser, with its usage, not every
    # command's list (the top-level usage, for a typo in one flag)
    with pytest.raises(SystemExit) as stopped:
        parse_command(["train", "--mode", "sync"])
    said = capsys.readouterr().err
    assert stopped.value.code == 2 and said.startswith("usage: snet train ")
    assert said.endswith("snet train: error: unrecognized arguments: --mode sync\n")


@pytest.mark.system  # starts real processes
def test_train_reads_the_servers_toml_job(tmp_path: Path) -> None:
    path = toml_file(
        tmp_path,
        '[server]\nport = 7001\n\n[job]\nmode = "sync"\nnetwork = "117:16:10"\nepochs = 1\n'
        "learning_rates = [0.1]\n\n[job.data]\ncv_fraction = 0.2\nsplit_seed = 3\n",
    )
    done = run_snet("train", "--config", path, "--out-dir", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    assert "epoch  1  lr 0.1 " in done.stdout
    with np.load(tmp_path / "out" / "weights.npz") as saved:
        assert [int(n) for n in saved["sizes"]] == [117, 16, 10]


@pytest.mark.system  # starts real processes
def test_demo_reads_the_servers_toml_job(tmp_path: Path) -> None:
    path = toml_file(tmp_path, '[job]\nmode = "sync"\nnetwork = "117:16:10"\nepochs = 1\n'
                           "[server]\nmin_workers = 5\n[worker]\nthreads = 2\n")  # fmt: skip
    cache = tmp_path / "cache"  # the demo's server and workers follow SNET_DATA_CACHE
    done = run_snet("demo", "--workers", "1", "--config", path, "--out-dir", str(tmp_path / "o"),
                    env={**os.environ, "SNET_DATA_CACHE": str(cache)})  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert list(cache.glob("norms-*.npy")), "the server kept its normalisation elsewhere"
    assert list(cache.glob("frames-*.npy")), "the workers shared their frames elsewhere"
    assert done.stdout.startswith("snet demo: sync mode, 1 worker, network 117:16:10, 1 epoch,")
    assert "Traceback" not in done.stderr
    # the other tables were read by nobody, without a word (its 5 workers, say)
    said = f"snet demo: reads the [job] table of {path} only: [server], [worker] not used"
    assert said in done.stderr.splitlines()
    assert "\x1b" not in done.stdout and "\r" not in done.stdout  # a pipe: no progress bar
    assert "\nepoch  1/1  lr " in done.stdout  # counted from 1
    # again on the same out-dir: the finished run is shown, not trained again, and the
    # workers (which had nothing to join) are stopped at once rather than left retrying
    record = (tmp_path / "o" / "status.json").read_bytes()
    began = time.monotonic()
    again = run_snet("demo", "--workers", "1", "--config", path, "--out-dir", str(tmp_path / "o"))
    assert again.returncode == 0, again.stderr
    # not served for workers coming back, as a server's completed run is (its workers
    # are its own: it waited 11 s for nobody, a review), whatever the machine's pace
    assert time.monotonic() - began < RESUMED_LINGER_SECONDS
    # the run's own record stays (it was rewritten: its workers "left (server restarted)")
    assert (tmp_path / "o" / "status.json").read_bytes() == record
    assert "holds this job's finished run" in again.stdout
    banner = again.stdout.splitlines()[1]  # its workers stopped at once: no priority said
    assert banner.startswith("snet demo: sync mode") and banner.endswith(" loop"), banner
    assert "\nepoch  1/1  lr " in again.stdout and "done (trained)" in again.stdout
    assert "workers stopped: nothing to train" in again.stdout
    # nothing is trained, and the run's own times are gone: neither is made up
    assert "done (trained) in an earlier run:" in again.stdout and " s)" not in again.stdout
    assert "dashboard:" not in again.stdout
    assert "not reachable" not in again.stderr and "Traceback" not in again.stderr
    # more workers divide the bunch otherwise: another job, and the refusal says why
    more = run_snet("demo", "--workers", "2", "--config", path, "--out-dir", str(tmp_path / "o"))
    assert more.returncode == 2 and "(bunch_size 128 there, 64 here)" in more.stderr
    assert "--workers and --spert change bunch_size" in more.stderr
    # another job on that out-dir is refused with the demo's own flags named, which work
    other = ("demo", "--workers", "1", "--config", path, "--out-dir", str(tmp_path / "o"),
             "--network", "117:8:10")  # fmt: skip
    refused = run_snet(*other)
    # a finished run: --fresh alone would be refused in turn (it was the advice)
    assert refused.returncode == 2 and "use --fresh --force to start over" in refused.stderr
    assert "Traceback" not in refused.stderr
    anew = run_snet(*other, "--fresh", "--force")
    assert anew.returncode == 0, anew.stderr
    assert "network 117:8:10" in anew.stdout and "done (trained)" in anew.stdout
    with np.load(tmp_path / "o" / "weights.npz") as saved:
        assert [int(n) for n in saved["sizes"]] == [117, 8, 10]


def test_cv_fraction_and_split_seed_are_flags(tmp_path: Path) -> None:
    from snet.cli.commands import server_config

    args = command_parser().parse_args(["server", "--cv-fraction", "0.25", "--split-seed", "7"])
    data = server_config(args).job.data
    assert (data.cv_fraction, data.split_seed) == (0.25, 7)


def _commands() -> dict[str, argparse.ArgumentParser]:
    parser = command_parser()
    (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(sub.choices)


def test_every_flag_has_help_and_field_flags_show_default_and_variable() -> None:
    for name, command in _commands().items():
        for action in command._actions:
            if action.option_strings and name != "bench":
                assert action.help, f"snet {name} {action.option_strings[0]} has no help"
    server = " ".join(_commands()["server"].format_help().split())
    assert "(default 7000; env SNET_PORT)" in server
    assert "(default 0.1; env SNET_JOB_DATA_CV_FRACTION)" in server
    assert "(default 117:512:10; env SNET_JOB_NETWORK)" in server


@pytest.mark.parametrize(
    ("command", "classes"),
    [
        ("server", (ServerConfig, JobSpec, DataSpec)),
        ("worker", (WorkerConfig,)),
        ("spert", (BoardConfig,)),
        ("demo", (JobSpec, DataSpec)),
        ("eval", (DataSpec,)),
    ],
)
def test_one_flag_per_field(command: str, classes: tuple[type, ...]) -> None:
    """Every field of the classes a command configures is one of its flags."""
    dests = {a.dest for a in _commands()[command]._actions if a.option_strings}
    for cls in classes:
        for field in fields(cls):
            if field.type not in ("JobSpec", "DataSpec"):
                assert field.name in dests, f"snet {command} has no flag for {field.name}"


def test_every_command_has_a_runner_that_exists() -> None:
    """cli/main.py's table: each command the parser knows runs a function of its module
    (bench is passed through before parsing)."""
    import importlib

    from snet.cli.main import RUNNERS
    from snet.cli.parser import COMMANDS

    assert set(RUNNERS) | {"bench"} == set(COMMANDS)
    for module, name in RUNNERS.values():
        assert callable(getattr(importlib.import_module(f"snet.cli.{module}"), name))
