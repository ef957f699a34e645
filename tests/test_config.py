"""Configuration: flags over environment over the TOML file, with clear errors."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from snet.cli.commands import server_config
from snet.cli.main import main
from snet.cli.parser import command_parser
from snet.protocol.errors import ConfigError
from snet.server.config import ServerConfig

from helpers import run_process

TOML = """
[server]
port = 7100
http_port = 7180
name = "from-file"

[job]
mode = "sync"
network = "117:256:256:10"
activation = "tanh"
epochs = 4
learning_rates = [0.5, 0.25]

[job.data]
context = 4
"""


def _config(argv: list[str]):  # type: ignore[no-untyped-def]
    return server_config(command_parser().parse_args(["server", *argv]))


def test_toml_then_environment_then_flags(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "snet.toml"
    path.write_text(TOML)
    config = _config(["--config", str(path)])
    assert (config.port, config.http_port, config.name) == (7100, 7180, "from-file")
    assert config.job.mode == "sync" and config.job.epochs == 4
    assert config.job.network.sizes == (117, 256, 256, 10)
    assert config.job.network.activations == ("tanh", "tanh")
    assert config.job.learning_rates == (0.5, 0.25)

    monkeypatch.setenv("SNET_PORT", "7200")
    monkeypatch.setenv("SNET_JOB_EPOCHS", "6")
    config = _config(["--config", str(path)])
    assert config.port == 7200 and config.job.epochs == 6

    config = _config(
        [
            "--config",
            str(path),
            "--port",
            "7300",
            "--epochs",
            "8",
            "--learning-rates",
            "0.1,0.05",
            "--mode",
            "async",
        ]
    )
    assert config.port == 7300 and config.job.epochs == 8
    assert config.job.learning_rates == (0.1, 0.05) and config.job.mode == "async"


def test_choices_are_taken_in_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    """--staleness NONE was taken while --compress FP16 was refused, and --mode Async was
    taken for a typo of "sync" ("did you mean 'sync'?")."""
    monkeypatch.setenv("SNET_JOB_ACTIVATION", "Tanh")
    config = _config(["--mode", "ASYNC", "--compress", "FP16", "--schedule", "NewBob"])
    job = config.job
    assert (job.mode, job.compress, job.schedule) == ("async", "fp16", "newbob")
    assert job.network.activations == ("tanh",) * len(job.network.activations)
    with pytest.raises(ConfigError, match=r"'asink' is not one of .* \(did you mean 'async'\?\)"):
        _config(["--mode", "asink"])


def test_a_bad_value_is_refused_where_a_flag_overrides_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """[job] epochs = 3.0 beside --epochs 1 started, and was refused without the flag."""
    path = tmp_path / "snet.toml"
    path.write_text("[job]\nepochs = 3.0\n")
    with pytest.raises(ConfigError, match=r"\[job\] epochs: 3.0 is not a whole number"):
        _config(["--config", str(path), "--epochs", "1"])
    monkeypatch.setenv("SNET_JOB_MODE", "asink")
    with pytest.raises(ConfigError, match="SNET_JOB_MODE: 'asink' is not one of"):
        _config(["--mode", "async"])
    monkeypatch.setenv("SNET_JOB_MODE", "sync")  # a good one overridden stays overridden
    assert _config(["--mode", "async"]).job.mode == "async"
    # and its own checks too, not only its type (a stranger's [worker] threads = -1,
    # [job] learning_rates = [-1] and [server] max_connections = -5 beside good flags)
    path.write_text("[job]\nlearning_rates = [-1]\n[server]\nmax_connections = -5\n")
    with pytest.raises(ConfigError, match=r"\[job\] learning_rates must be positive"):
        _config(["--config", str(path), "--learning-rates", "0.1"])
    path.write_text("[server]\nmax_connections = -5\n")
    with pytest.raises(ConfigError, match=r"\[server\] max_connections must be >= 1"):
        _config(["--config", str(path), "--max-connections", "5"])
    # a pair of a file's values, both overridden by flags, is not refused for the pair an
    # old value makes with a new one (a review's: 30 s beside --heartbeat-seconds 40)
    path.write_text("[server]\nworker_timeout_seconds = 30\nheartbeat_seconds = 10\n"
                    "port = 8000\nhttp_port = 8001\n")  # fmt: skip
    flags = ["--heartbeat-seconds", "40", "--worker-timeout-seconds", "120", "--port", "9000"]
    config = _config(["--config", str(path), *flags, "--http-port", "8000"])
    assert (config.heartbeat_seconds, config.port, config.http_port) == (40, 9000, 8000)
    # a file of one mode with its staleness, both overridden by flags: not refused for
    # the pair it makes with the flags' mode
    monkeypatch.delenv("SNET_JOB_MODE")
    path.write_text('[job]\nmode = "sync"\n')
    job = _config(["--config", str(path), "--mode", "async", "--staleness", "bounded:2"]).job
    assert (job.mode, job.staleness) == ("async", "bounded:2")


def test_defaults_are_the_default_job() -> None:
    config = _config([])
    assert config.host == "127.0.0.1" and config.port == 7000 and config.http_port == 7080
    assert config.job.network.describe() == "117:512:10"
    assert config.job.data.source == "fsdd" and config.job.mode == "async"


def test_bad_settings_fail_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(ConfigError, match="fsdd data with context 4 gives 117 inputs"):
        _config(["--network", "100:10"])
    bad = tmp_path / "bad.toml"
    bad.write_text("[server]\nprot = 1\n")
    with pytest.raises(ConfigError, match="unknown setting"):
        _config(["--config", str(bad)])
    monkeypatch.setenv("SNET_PORT", "seventy")
    with pytest.raises(ConfigError, match="SNET_PORT"):
        _config([])
    monkeypatch.delenv("SNET_PORT")
    with pytest.raises(ConfigError, match="cannot hold an update of network 117:2048:10"):
        _config(["--max-frame-mb", "1", "--network", "117:2048:10"])
    assert _config(["--max-frame-mb", "2", "--network", "117:2048:10"]).max_frame_mb == 2
    with pytest.raises(ConfigError, match="np mode writes no trace yet"):  # it wrote none
        _config(["--mode", "np", "--network", "117:32:10", "--trace-file", "t.jsonl"])
    with pytest.raises(ConfigError, match=r"^--min-workers must be at least 1, got 0"):
        _config(["--min-workers", "0"])
    with pytest.raises(ConfigError) as alone:  # it overwrote nothing, without a word
        _config(["--force"])
    assert str(alone.value) == (
        "--force goes with --fresh: it overwrites a finished run's results only when starting over"
    )
    with pytest.raises(ConfigError, match=r"^--port and --http-port are both 7300"):
        _config(["--port", "7300", "--http-port", "7300"])
    other_host = ["--port", "7300", "--http-port", "7300", "--http-host", "127.0.0.2"]
    assert _config(other_host).http_bind_host == "127.0.0.2"  # two addresses: no clash
    with pytest.raises(ConfigError, match="inline_step_seconds must be >= 0, got nan"):
        ServerConfig(inline_step_seconds=math.nan)  # built in code: no flag or TOML check
    with pytest.raises(ConfigError, match=r"^--inline-step-seconds must be >= 0, got -1"):
        _config(["--inline-step-seconds", "-1"])
    assert main(["server", "--config", str(tmp_path / "missing.toml")]) == 2
    assert "cannot read config file" in capsys.readouterr().err


@pytest.mark.system
def test_the_command_line_imports_no_numpy_before_the_blas_limit() -> None:
    # BLAS reads its thread count once, when numpy is imported: a worker must set it first
    # (two BLAS threads per worker on two cores made the demo ten times slower).
    import sys

    probe = "import sys, snet.cli.main; print('numpy' in sys.modules)"
    output = run_process([sys.executable, "-c", probe], check=True).stdout
    assert output.strip() == "False"
    probe = (
        "import os, sys; from snet.cli.blas import early_blas_limit;"
        "early_blas_limit(['worker', '--server', 'h:1', '--threads', '2']);"
        "print(os.environ['OPENBLAS_NUM_THREADS'], 'numpy' in sys.modules)"
    )
    env = {k: v for k, v in __import__("os").environ.items() if "NUM_THREADS" not in k}
    output = run_process([sys.executable, "-c", probe], check=True, env=env).stdout
    assert output.split() == ["2", "False"]


@pytest.mark.system
def test_snet_train_pins_its_blas_threads_as_a_worker_does() -> None:
    # Issue 18: under load, snet train with idle BLAS threads ran 5-10x slower than with one.
    import os
    import sys

    def pinned(argv: list[str], **extra: str) -> str:
        probe = (
            "import os; from snet.cli.blas import early_blas_limit;"
            f"early_blas_limit({argv!r}); print(os.environ['OPENBLAS_NUM_THREADS'])"
        )
        env = {k: v for k, v in os.environ.items() if "NUM_THREADS" not in k} | extra
        return str(run_process([sys.executable, "-c", probe], check=True, env=env).stdout.strip())

    assert pinned(["train", "--epochs", "1"]) == "1"
    assert pinned(["train", "--threads", "2"]) == "2"
    assert pinned(["train"], SNET_TRAIN_THREADS="3") == "3"


def test_a_trace_or_ready_file_that_cannot_be_written_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Checked before the data is loaded: a trace file's folder missing or a file in its
    path was a traceback, a ready file's a traceback after start-up."""
    blocker = tmp_path / "file"
    blocker.write_text("not a folder\n")
    out = ["--port", "0", "--http-port", "0", "--out-dir", str(tmp_path / "out")]
    for flag, what in (("--trace-file", "trace file"), ("--ready-file", "ready file")):
        assert main(["server", *out, flag, str(blocker / "x")]) == 2
        assert capsys.readouterr().err.strip() == (
            f"snet: cannot write the {what} {blocker / 'x'}: a file is in its path"
        )
    assert main(["server", *out, "--trace-file", str(tmp_path)]) == 2
    assert f"cannot write the trace file {tmp_path}: it is a directory" in capsys.readouterr().err
    if Path("/proc/self").is_dir():  # a folder access() calls writable (for root) that is not
        for flag, what in (("--trace-file", "trace file"), ("--ready-file", "ready file")):
            assert main(["server", *out, flag, "/proc/snet-test"]) == 2
            assert (
                capsys.readouterr()
                .err.strip()
                .startswith(f"snet: cannot write the {what} /proc/snet-test: ")
            )
    assert not (tmp_path / "out" / "status.json").exists()  # refused before anything ran
