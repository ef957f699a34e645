"""Configuration mistakes are one line naming the key, the value and what is expected,
with exit status 2 and no traceback (issue 18). The flags themselves (one per config field,
each with help; TOML jobs read by train and demo): test_cli_flags.py."""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from snet.cli.main import main
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec

from helpers import DrivenProcess, run_snet
from user_errors import error, toml_file


def test_a_bad_learning_rate_flag_names_the_flag_and_the_value(
    capsys: pytest.CaptureFixture[str],
) -> None:
    err = error(["server", "--learning-rates", "0.1,x"], capsys)
    assert err == (
        "snet: --learning-rates: '0.1,x' is not a list of numbers "
        "(as a flag or variable: 0.2,0.1; in TOML: [0.2, 0.1])"
    )


@pytest.mark.parametrize("command", ["server", "worker", "status"])
def test_ctrl_c_before_a_command_takes_sigint_is_one_line_and_130(
    command: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C while a command still imports and loads (before its event loop takes SIGINT
    over) fell through as a traceback of whichever import it hit, and status 1."""
    import snet.cli.commands
    import snet.cli.status

    def interrupted(args: argparse.Namespace) -> int:
        raise KeyboardInterrupt

    module = snet.cli.status if command == "status" else snet.cli.commands
    monkeypatch.setattr(module, f"run_{command}", interrupted)
    assert main([command]) == 130
    captured = capsys.readouterr()
    assert captured.err == f"snet {command}: stopped by Ctrl-C\n" and not captured.out


@pytest.mark.parametrize(
    ("argv", "who"), [(["demo", "--epochs", "1"], "snet demo"), (["--bogus"], "snet")]
)
def test_ctrl_c_while_the_command_line_is_read_is_one_line_and_130(
    argv: list[str], who: str, capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    """A demo's first 0.1 s: the demo's workers' process started, its flags parsed."""
    import snet.cli.main

    def interrupted(words: list[str]) -> argparse.Namespace:
        raise KeyboardInterrupt

    monkeypatch.setattr(snet.cli.main, "_parse", interrupted)
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert captured.err == f"{who}: stopped by Ctrl-C\n" and not captured.out


def test_a_settings_own_check_names_it_as_the_user_gave_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A class's check names its field ("retry_seconds must be >= 0"): said as the flag,
    the variable or the file's key the value came from, which the user can find."""
    assert error(["worker", "--retry-seconds", "-1"], capsys) == (
        "snet: --retry-seconds must be >= 0"
    )
    assert error(["server", "--checkpoint-keep", "0"], capsys) == (
        "snet: --checkpoint-keep must be >= 1, got 0"
    )
    path = toml_file(tmp_path, "[job]\nepochs = 0\n")
    assert error(["train", "--config", path], capsys) == (
        f"snet: {path} [job] epochs must be >= 1, got 0"
    )
    # a setting left at its default is named by its flag too (it was "tls_ca")
    assert error(["worker", "--tls-key", "w.key"], capsys) == (  # ignored before (a probe)
        "snet: --tls-key needs --tls-ca: the CA that signed the server's certificate"
    )
    assert error(["worker", "--tls-ca", "ca.pem", "--tls-key", "w.key"], capsys) == (
        "snet: --tls-cert and --tls-key go together: this worker's certificate and its key"
    )
    # the server's pairs too, refused before anything starts (they were said once the
    # ports opened, by their keys: "TLS needs both tls_cert and tls_key")
    assert error(["server", "--tls-cert", "s.pem"], capsys) == (
        "snet: --tls-cert and --tls-key go together: the server's certificate and its key"
    )
    assert error(["server", "--tls-client-ca", "ca.pem"], capsys) == (
        "snet: --tls-client-ca needs --tls-cert and --tls-key: the server's own"
    )
    assert error(["server", "--worker-timeout-seconds", "1"], capsys).startswith(
        "snet: --worker-timeout-seconds must exceed --heartbeat-seconds ("
    )
    path = toml_file(tmp_path, "[job]\nepochs = true\n")  # TOML's true, not Python's True
    assert error(["train", "--config", path], capsys) == (
        f"snet: {path} [job] epochs: true is not a whole number"
    )
    assert error(["server", "--heartbeat-seconds", "0.001"], capsys) == (  # a review's find
        "snet: --heartbeat-seconds must be at least 0.05, got 0.001"
    )
    for heartbeat in ("0", "-1", "0.001"):  # 0 spun the worker and its server
        assert error(["worker", "--heartbeat-seconds", heartbeat], capsys) == (
            f"snet: --heartbeat-seconds must be at least 0.05 (and finite), "
            f"got {float(heartbeat):g}"
        )
    monkeypatch.setenv("SNET_WORKER_PROCESSES", "0")
    assert error(["worker"], capsys) == (
        "snet: SNET_WORKER_PROCESSES must be 1 to 256 (one per core is the rule), got 0"
    )
    monkeypatch.setenv("SNET_WORKER_PROCESSES", "100000")  # a typo forked until memory ran out
    assert error(["worker"], capsys) == (
        "snet: SNET_WORKER_PROCESSES must be 1 to 256 (one per core is the rule), got 100000"
    )


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--spert", "-1"], "snet: --spert must be 0 to 256, got -1"),
        (["--workers", "-2"], "snet: --workers must be 0 to 256, got -2"),
        (["--workers", "100000"], "snet: --workers must be 0 to 256, got 100000"),  # a typo
        (["--workers", "0"], "snet: the demo needs at least one worker (--workers, --spert)"),
    ],
)
def test_the_demo_names_a_negative_count_of_workers(
    argv: list[str], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert error(["demo", *argv], capsys) == expected


def test_toml_learning_rates_must_be_a_list(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = toml_file(tmp_path, "[job]\nlearning_rates = 0.1\n")
    err = error(["server", "--config", path], capsys)
    assert err.startswith(f"snet: {path} [job] learning_rates: 0.1 is not a list of numbers")


def test_an_empty_out_dir_or_url_is_refused(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """An empty --out-dir (or SNET_OUT_DIR) wrote the run into the current directory, and
    `snet status --url ''` asked the default server (found by a probe)."""
    said = "snet: --out-dir (or SNET_OUT_DIR) is empty: it would be the current directory; give one"
    assert error(["train", "--out-dir", ""], capsys) == said
    assert error(["demo", "--out-dir", ""], capsys) == said
    monkeypatch.setenv("SNET_OUT_DIR", "")
    assert error(["train"], capsys) == said
    assert error(["server"], capsys) == (
        "snet: SNET_OUT_DIR is empty: it would be the current directory; give one"
    )
    assert error(["status", "--url", ""], capsys).startswith("snet: --url : '' is not HOST:PORT")


@pytest.mark.parametrize("command", ["server", "worker", "train"])
def test_a_config_file_that_is_not_utf8_or_not_a_config_file_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """tomllib's own read raised UnicodeDecodeError (a traceback, exit 1), and /dev/zero
    was read until memory ran out (found by a probe)."""
    path = tmp_path / "snet.toml"
    path.write_bytes(b"\xff\xfe[server]\n")
    assert error([command, "--config", str(path)], capsys) == (
        f"snet: config file {path} is not valid TOML: not UTF-8 (invalid start byte at byte 0)"
    )
    assert error([command, "--config", "/dev/zero"], capsys) == (
        "snet: config file /dev/zero is over 1.0 MiB: not a config file?"
    )


def test_toml_port_must_be_a_whole_number(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = toml_file(tmp_path, '[server]\nport = "abc"\n')
    err = error(["server", "--config", path], capsys)
    assert err == f"snet: {path} [server] port: 'abc' is not a whole number"


def test_environment_values_are_decoded_the_same_way(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("SNET_JOB_LEARNING_RATES", "0.2,,0.1")
    err = error(["train"], capsys)
    assert err.startswith("snet: SNET_JOB_LEARNING_RATES: '0.2,,0.1' is not a list of numbers")
    monkeypatch.delenv("SNET_JOB_LEARNING_RATES")
    monkeypatch.setenv("SNET_WORKER_THREADS", "two")
    err = error(["worker"], capsys)
    assert err == "snet: SNET_WORKER_THREADS: 'two' is not a whole number"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("[sever]\nport = 7001\n", "unknown table [sever] (did you mean [server]?)"),
        ("[jobs]\nepochs = 2\n", "unknown table [jobs] (did you mean [job]?)"),
        ("[job]\nepohcs = 2\n", "[job]: unknown setting 'epohcs' (did you mean 'epochs'?)"),
        ("[job.data]\nsplit_sed = 2\n", "[job.data]: unknown setting 'split_sed' (did you mean"),
        ("[server]\nprot = 1\n", "[server]: unknown setting 'prot' (did you mean 'port'?)"),
        ("port = 7001\n", "port = 7001 is outside a table: settings go in [server], [job], "),
    ],
)
def test_unknown_tables_and_keys_are_refused_with_a_suggestion(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], text: str, message: str
) -> None:
    path = toml_file(tmp_path, text)
    command = "train" if "job" in text else "server"
    assert message in error([command, "--config", path], capsys)


def test_a_worker_refuses_a_misspelt_worker_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = toml_file(tmp_path, '[worker]\nserver = "127.0.0.1:7000"\nthread = 2\n')
    err = error(["worker", "--config", path], capsys)
    assert err == f"snet: {path} [worker]: unknown setting 'thread' (did you mean 'threads'?)"


def test_an_unknown_log_level_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    err = error(["server", "--log-level", "loud"], capsys)
    assert err == "snet: --log-level: 'loud' is not one of debug, info, warning, error, critical"
    assert "--log-level: 'lod'" in error(["worker", "--log-level", "lod"], capsys)


def test_the_event_interval_has_a_floor(capsys: pytest.CaptureFixture[str]) -> None:
    # every push builds the status document: a dashboard may not make the server spin
    assert "snet: --event-seconds must be between 0.05 and 60" in error(
        ["server", "--event-seconds", "0.001"], capsys
    )


def test_an_empty_network_is_an_error_not_the_default(capsys: pytest.CaptureFixture[str]) -> None:
    err = error(["server", "--network", ""], capsys)
    assert err == "snet: --network: '' is not layer sizes, input to output, such as 117:512:10"
    assert "--network: '117:x:10' is not layer sizes" in error(
        ["train", "--network", "117:x:10"], capsys
    )


@pytest.mark.system  # starts real processes
def test_a_network_without_its_output_layer_is_checked_against_the_labels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    err = error(["train", "--network", "117:512", "--out-dir", str(tmp_path)], capsys)
    assert err.endswith(
        "has 10 classes (labels 0..9), but the network has 512 outputs: end the network with :10"
    )
    # the daemon says the same, as a real process, before it trains anything
    server = run_snet(
        "server", "--network", "117:512", "--port", "0", "--http-port", "0",
        "--out-dir", str(tmp_path / "out"),
    )  # fmt: skip
    assert server.returncode == 2
    assert "but the network has 512 outputs: end the network with :10" in server.stderr
    assert "Traceback" not in server.stderr


def test_a_modes_own_setting_in_another_mode_is_one_line_naming_it_as_given(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's command trained plain sync without a word about --block-bunches; now
    each command that makes a job refuses it, naming the flag, the variable or the file's
    key the value came from, before anything is started or written."""
    out = tmp_path / "out"
    issue = ["demo", "--mode", "sync", "--workers", "1", "--block-bunches", "8", "--np-pipeline",
             "--epochs", "1", "--out-dir", str(out)]  # fmt: skip
    assert error(issue, capsys) == (
        "snet: --block-bunches 8 applies to bmuf mode only, and this job is in sync mode, "
        "which would ignore it (leave it at its default, 16; --np-pipeline true is ignored "
        "there too)"
    )
    monkeypatch.setenv("SNET_JOB_MAX_IN_FLIGHT", "4")
    assert error(["server", "--mode", "sync", "--out-dir", str(out)], capsys) == (
        "snet: SNET_JOB_MAX_IN_FLIGHT 4 applies to async mode only, and this job is in sync "
        "mode, which would ignore it (leave it at its default, 2)"
    )
    monkeypatch.delenv("SNET_JOB_MAX_IN_FLIGHT")
    path = toml_file(tmp_path, '[job]\nmode = "np"\ncompress = "fp16"\n')
    assert error(["server", "--config", path, "--out-dir", str(out)], capsys) == (
        f"snet: {path} [job] compress fp16 applies to sync mode, async mode and bmuf mode "
        "only, and this job is in np mode, which would ignore it (leave it at its default, none)"
    )
    flags = ["--mode", "bmuf", "--block-sync", "true", "--staleness", "gap", "--out-dir", str(out)]
    assert error(["server", *flags], capsys) == (
        "snet: --staleness gap applies to async mode and bmuf mode with asynchronous blocks "
        "(--block-sync false) only, and this job is in bmuf mode with synchronous blocks, "
        "which would ignore it (leave it at its default, none)"
    )
    # snet train reads the server's [job] table: the job a server would refuse, it refuses
    path = toml_file(tmp_path, '[job]\nmode = "async"\nblock_filter = "average"\n')
    assert error(["train", "--config", path, "--out-dir", str(out)], capsys) == (
        f"snet: {path} [job] block_filter average applies to bmuf mode only, and this job is "
        "in async mode, which would ignore it (leave it at its default, cbm)"
    )
    assert not out.exists()  # nothing was written


def test_the_demo_splits_the_bunch_only_where_a_step_sums_shares_of_it() -> None:
    from snet.cli.demo import divided_size

    bunch = JobSpec().bunch_size  # 128
    assert [divided_size(bunch, mode, 2) for mode in ("sync", "async", "bmuf", "np")] == [
        64, 64, 128, 128,
    ]  # fmt: skip
    assert divided_size(bunch, "async", 64) == 8  # at least 8


@pytest.mark.parametrize(
    ("name", "value"), [("SNET_KERNELS", "nunpy"), ("SNET_KERNELS", "NUMPY"), ("SNET_LOOP", "foo")]
)
def test_a_developer_switch_with_an_unknown_value_is_refused(
    name: str, value: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """They were ignored without a word: the default ran."""
    monkeypatch.setenv(name, value)
    assert main(["plan", "--workers", "1"]) == 2
    assert f"snet: {name}={value!r} is not one of" in capsys.readouterr().err
    monkeypatch.setenv(name, "asyncio" if name == "SNET_LOOP" else "numpy")
    assert main(["plan", "--workers", "1"]) == 0


@pytest.mark.parametrize("scale", ["nan", "0", "-1", "1e-9", "1e13"])
def test_the_demos_board_time_scale_must_be_positive(
    scale: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """nan passed the "<= 0" check; 1e-9 passed the demo's, then was refused by the
    boards' own bounds as "spert --time-scale", a flag the demo has not."""
    argv = ["demo", "--workers", "0", "--spert", "1", "--spert-time-scale", scale]
    assert main(argv) == 2
    said = f"--spert-time-scale must be 1e-06 to 1e+12, got {float(scale):g}"
    assert said in capsys.readouterr().err
    # without boards it did nothing, without a word (found by a probe)
    assert main(["demo", "--spert-time-scale", "5"]) == 2
    said = capsys.readouterr().err
    assert said == "snet: --spert-time-scale goes with --spert (the demo's boards)\n"
    from snet.client.modelled_backend import ModelledBackend

    if not float(scale) > 0:  # the modelled backend's bound: only above 0
        with pytest.raises(ConfigError, match="time scale must be > 0"):
            ModelledBackend(time_scale=float(scale))


def test_the_demos_server_settings_are_named_by_its_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    said = error(["demo", "--workers", "1", "--force", "--out-dir", out], capsys)
    assert said.startswith("snet: --force goes with --fresh")
    said = error(["demo", "--workers", "1", "--http-port", "99999", "--out-dir", out], capsys)
    assert said.startswith("snet: --http-port must be a TCP port (0-65535), got 99999")
    assert not (tmp_path / "out").exists()


def test_the_demos_job_is_checked_with_the_bunch_its_workers_train_on() -> None:
    from snet.cli.demo import _read_job
    from snet.cli.parser import command_parser

    def job(*flags: str) -> tuple[JobSpec, bool]:
        return _read_job(command_parser().parse_args(["demo", *flags]))

    divided, was = job("--chunk-frames", "100")  # 64 a worker: enough
    assert (divided.bunch_size, divided.chunk_frames, was) == (64, 100, True)
    bmuf, _ = job("--mode", "bmuf", "--chunk-frames", "128")  # bmuf: whole bunches of 128
    assert bmuf.bunch_size == 128
    with pytest.raises(ConfigError) as refused:  # named as the bunch the user never gave
        job("--chunk-frames", "50")
    assert str(refused.value) == (
        "--chunk-frames must be at least each worker's bunch of 64 (the job's 128 divided "
        "among 2 workers; --bunch-size sets it), got 50"
    )
    given = r"^--chunk-frames must be at least --bunch-size \(32\), got 20$"
    with pytest.raises(ConfigError, match=given):  # given
        job("--bunch-size", "32", "--chunk-frames", "20")
    chosen, was = job("--bunch-size", "32", "--chunk-frames", "40")
    assert (chosen.bunch_size, was) == (32, False)


@pytest.mark.system
def test_sigterm_before_a_command_takes_it_over_is_said_as_ctrl_c_is(tmp_path: Path) -> None:
    """SIGTERM in a server's first moments (its imports, 0.35 s) ended it silently with
    143, where Ctrl-C said "stopped by Ctrl-C" (found by a probe). Sent as soon as the
    process catches SIGTERM (/proc's SigCgt), long before the server takes it over."""
    argv = [sys.executable, "-m", "snet.cli", "server", "--port", "0", "--http-port", "0",
            "--out-dir", str(tmp_path / "out")]  # fmt: skip
    with DrivenProcess(argv, stderr=subprocess.PIPE, text=True) as starting:
        status = Path(f"/proc/{starting.pid}/status")
        for _ in range(2000):  # 10 s at most
            caught = [ln for ln in status.read_text().splitlines() if ln.startswith("SigCgt:")]
            if caught and int(caught[0].split()[1], 16) & (1 << (signal.SIGTERM - 1)):
                break
            time.sleep(0.005)
        starting.send_signal(signal.SIGTERM)
        _, stderr = starting.communicate(timeout=30)
    assert starting.returncode == 143, stderr
    assert stderr.strip().splitlines()[-1] == "snet server: stopped by SIGTERM"


def test_a_token_file_or_a_plan_file_that_is_no_such_file_is_refused_bounded(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """--token-file /dev/zero and --constants /dev/zero were read until memory ran out
    (found by a review, after --config's bound)."""
    assert error(["status", "--token-file", "/dev/zero"], capsys) == (
        "snet: token_file /dev/zero is over 4.0 KiB: not a token?"
    )
    assert error(["plan", "--constants", "/dev/zero"], capsys) == (
        "snet: /dev/zero is over 16.0 MiB: not a JSON file?"
    )


def test_the_demos_boards_read_their_time_scale_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The demo gave its boards --time-scale 1 whenever --spert-time-scale was not given:
    SNET_SPERT_TIME_SCALE was ignored (its banner said x1), and a bad one never read."""
    from snet.cli.demo_workers import board_time_scale, worker_commands
    from snet.cli.parser import parse_command

    args = parse_command(["demo", "--spert", "1"])
    monkeypatch.setenv("SNET_SPERT_TIME_SCALE", "50")
    assert board_time_scale(args) == 50.0
    (board,) = worker_commands(args, "127.0.0.1:1")[1:]
    assert "--time-scale" not in board  # the board reads the variable itself
    flagged = parse_command(["demo", "--spert", "1", "--spert-time-scale", "5"])
    assert board_time_scale(flagged) == 5.0  # the flag over the variable
    assert "--time-scale" in worker_commands(flagged, "127.0.0.1:1")[1]
    monkeypatch.setenv("SNET_SPERT_TIME_SCALE", "abc")
    assert main(["demo", "--workers", "0", "--spert", "1"]) == 2
    assert "SNET_SPERT_TIME_SCALE: 'abc' is not a number" in capsys.readouterr().err


def test_the_demos_last_line_says_a_worker_it_stopped_while_starting_as_such() -> None:
    """A demo stopped 0.3 s after its start printed "worker process exit codes [-15]"
    and exited 0: the code read as a failure the demo did not count as one."""
    from types import SimpleNamespace

    from snet.cli.demo_workers import DemoWorkers

    stopped, failed = SimpleNamespace(pid=7, returncode=-15), SimpleNamespace(pid=8, returncode=1)
    workers = DemoWorkers([stopped, failed], 2, terminated={7})  # type: ignore[list-item]
    assert workers.said_codes() == "[stopped while starting, 1]"
    assert not workers.stopped_cleanly()  # the one that failed still counts


def test_the_demos_worker_priority_is_taken_in_any_case(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from snet.cli.demo_workers import check_demo_flags
    from snet.cli.parser import parse_command

    args = parse_command(["demo", "--worker-priority", "LOW"])
    check_demo_flags(args)
    assert args.worker_priority == "low"
    monkeypatch.setenv("SNET_DEMO_WORKER_PRIORITY", "Idle")
    args = parse_command(["demo"])
    check_demo_flags(args)
    assert args.worker_priority == "idle"
