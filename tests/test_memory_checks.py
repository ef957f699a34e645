"""A network too large for all the memory a process could have is refused before it is
allocated: by the server at start-up (one line, exit 2: server/footprint.py) and by a
worker when it learns the job (a job it cannot run, exit 4: client/footprint.py), as
``snet train`` refuses it (test_train_errors.py). One larger than what is available now
is a warning, and the run goes on. The memory is simulated by replacing the one reading
of it (transport/host_memory.py's ``host_memory``) where each side imported it; a job
that fits is not refused, nor a large pool that a run never fills.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import snet.client.footprint as worker_side
import snet.server.app as server_app
import snet.server.footprint as server_side
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.memory import GIB, MemoryNeed
from snet.protocol.numbering import amount
from snet.transport.host_memory import HostMemory, _cgroup_limit, available_bytes, host_memory

from helpers import QUICK_JOB, run_snet
from inprocess import Lab, wait_until

HUGE = ["--network", "117:100000000:10", "--max-frame-mb", "100000"]  # 47.7 GiB of weights


def _no_loading(*args: Any) -> Any:
    raise AssertionError("the server went on to load the data and allocate the network")


@pytest.mark.parametrize(
    ("flags", "memory", "expected"),
    [
        (
            HUGE,
            HostMemory(8 * GIB, 8 * GIB),
            "network 117:100000000:10 needs about 619.9 GiB of memory on this server: 13 "
            "float32 copies of its 47.7 GiB of weights (6 pooled update elements in use (of "
            "--pool-size 32), 4 of the update rule, 3 while a checkpoint is written); this "
            "machine's memory is 8.0 GiB: give a smaller network",
        ),
        (  # a container's limit, lower than the host's memory that /proc/meminfo shows
            ["--network", "117:200000:10"],
            HostMemory(GIB // 2, GIB, "this container's memory limit"),
            "network 117:200000:10 needs about 1.2 GiB of memory on this server: 13 float32 "
            "copies of its 97.7 MiB of weights (6 pooled update elements in use (of "
            "--pool-size 32), 4 of the update rule, 3 while a checkpoint is written); this "
            "container's memory limit is 1.0 GiB: give a smaller network",
        ),
    ],
)
@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: nothing runs on it
async def test_a_server_refuses_a_job_larger_than_memory_before_allocating_it(
    lab: Lab,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    flags: list[str],
    memory: HostMemory,
    expected: str,
) -> None:
    monkeypatch.setattr(server_side, "host_memory", lambda: memory)
    monkeypatch.setattr(server_app, "plan_data", _no_loading)
    pid_file = tmp_path / "server.pid"
    with pytest.raises(ConfigError) as refused:  # `snet server` exits 2 with it
        await lab.server(*flags, "--pid-file", str(pid_file))
    assert str(refused.value) == expected
    assert not pid_file.exists() and not (tmp_path / "server-out").exists()  # nothing taken


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: nothing runs on it
async def test_less_available_than_needed_now_is_a_warning_and_the_run_starts(
    lab: Lab, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Other processes may free memory, the kernel reclaim it: refusing would make a brief
    squeeze at a restart final (the service units do not restart a configuration error).
    A large pool with DC-ASGD is counted by what a run writes, not refused either."""
    flags = ["--pool-size", "40000", "--staleness", "dcasgd", "--epochs", "1", *QUICK_JOB]
    said = (
        "network 117:64:10 needs about 865.1 KiB of memory on this server: 27 float32 "
        "copies of its 32.0 KiB of weights (6 pooled update elements in use (of --pool-size "
        "40,000), 4 of the update rule, 3 while a checkpoint is written, 8 of the dcasgd "
        "staleness history, 6 of dcasgd's adjusted gradients); "
    )
    for available, warned in ((1 << 20, False), (512 << 10, True)):
        caplog.clear()
        memory = HostMemory(available, 8 * GIB)
        monkeypatch.setattr(server_side, "host_memory", lambda memory=memory: memory)
        with caplog.at_level("WARNING", logger="snet.server"):
            server = await lab.server(*flags)
        assert (await server.status())["state"] == "waiting_for_workers"  # it started
        warnings = [r.getMessage() for r in caplog.records if r.name == "snet.server"]
        expected = f"{said}512.0 KiB is available now: going on, but the kernel may end a "
        assert any("is available now" in w for w in warnings) == warned, warnings
        assert any(w.startswith(expected) for w in warnings) == warned, warnings
        server.stop("test over")
        assert await server.wait(30) == "test over"


@pytest.mark.system  # starts a real process
def test_snet_server_says_so_in_one_line_and_exits_2(tmp_path: Path) -> None:
    done = run_snet(
        "server", *HUGE, "--port", "0", "--http-port", "0", "--out-dir", str(tmp_path / "o")
    )
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("snet: network 117:100000000:10 needs about 619.9 GiB of memory")
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    assert not (tmp_path / "o").exists()


def test_a_job_that_fits_is_not_refused() -> None:
    """The default job's server and worker need some tens of MiB: no machine that runs
    the tests has less, and neither side refuses it."""
    job = JobSpec()
    server, worker = server_side.server_need(job, 32), worker_side.worker_need(job, "int8")
    assert server.total < 128 << 20 and worker.total < 128 << 20
    assert (available_bytes() or 0) > server.total + worker.total
    server_side.check_fits_in_memory(job, 32)
    worker_side.check_fits_in_memory(job, "int8")


def test_the_estimate_and_its_words() -> None:
    need = MemoryNeed(1 << 20, ((2, "slots"), (0, "nothing"), (1, "scratch")), ((512, "rows"),))
    assert need.total == 3 * (1 << 20) + 512
    assert need.refusal("1:1:1", "here", None) == ""  # unknown memory: no refusal
    assert need.refusal("1:1:1", "here", need.total) == ""  # exactly fits
    said = (
        "network 1:1:1 needs about 3.0 MiB of memory here: 3 float32 copies of its 1.0 MiB "
        "of weights (2 slots, 1 scratch) and 0.5 KiB for rows"
    )
    assert need.refusal("1:1:1", "here", need.total - 1) == (
        f"{said}; this machine's memory is 3.0 MiB"
    )
    assert need.shortfall("1:1:1", "here", need.total) == ""
    assert need.shortfall("1:1:1", "here", 1 << 20) == (
        f"{said}; 1.0 MiB is available now: going on, but the kernel may end a process if "
        "that much is not freed"
    )
    assert [amount(n) for n in (1536, 3 << 20, 5 * GIB // 2)] == ["1.5 KiB", "3.0 MiB", "2.5 GiB"]


def test_a_rejoining_worker_counts_what_it_holds_for_its_last_job(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A worker whose server restarted still holds its buffers for the job: the same job
    must not be warned about for memory the worker itself took."""
    job = JobSpec()
    need = worker_side.worker_need(job).total
    monkeypatch.setattr(worker_side, "host_memory", lambda: HostMemory(need // 2, 8 * GIB))
    with caplog.at_level("WARNING", logger="snet.worker"):
        worker_side.check_fits_in_memory(job, "none")
        assert "is available now: going on" in caplog.text
        caplog.clear()
        worker_side.check_fits_in_memory(job, "none", earlier=job)
        assert caplog.text == ""


def test_a_container_s_limit_bounds_the_memory_and_no_limit_reads_as_none(
    tmp_path: Path,
) -> None:
    """cgroup v2 and v1 files as a container has them; "max" and v1's 2^63 are no limit."""
    assert _cgroup_limit(tmp_path) == (None, None)  # no cgroup files: no limit
    (tmp_path / "memory.max").write_text("max\n")
    assert _cgroup_limit(tmp_path) == (None, None)
    (tmp_path / "memory.max").write_text("4294967296\n")
    (tmp_path / "memory.current").write_text("1073741824\n")
    assert _cgroup_limit(tmp_path) == (4 * GIB, GIB)
    v1 = tmp_path / "v1"
    (v1 / "memory").mkdir(parents=True)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712\n")
    assert _cgroup_limit(v1) == (None, None)
    (v1 / "memory" / "memory.limit_in_bytes").write_text("2147483648\n")
    (v1 / "memory" / "memory.usage_in_bytes").write_text("536870912\n")
    assert _cgroup_limit(v1) == (2 * GIB, GIB // 2)
    here = host_memory()  # this machine: whatever it is, the two figures agree
    assert here.total is None or here.available is None or here.available <= here.total


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)  # one loop: tests/README.md
async def test_a_worker_refuses_a_job_larger_than_its_memory_and_the_server_goes_on(
    lab: Lab, monkeypatch: pytest.MonkeyPatch
) -> None:
    server = await lab.server("--mode", "async", "--epochs", "1", *QUICK_JOB)
    monkeypatch.setattr(worker_side, "host_memory", lambda: HostMemory(1 << 20, 1 << 20))
    small = lab.worker(server, "small", "--retry-seconds", "300")
    assert await small.wait(10) == 4  # refused here: a restart would not help
    log = lab.log("small")
    assert (
        "cannot run the server's job: bad_job: network 117:64:10 needs about 2.4 MiB of "
        "memory on this worker: 6 float32 copies of its 32.0 KiB of weights (3 weights slots, "
        "2 send buffers, 1 scratch) and 2.2 MiB for a bunch's activations (1,024 rows); "
        "this machine's memory is 1.0 MiB"
    ) in log
    assert "joined" not in log and "reconnecting" not in log
    assert "worker small reports bad_job: network 117:64:10 needs about" in lab.log("server")
    monkeypatch.setattr(worker_side, "host_memory", host_memory)  # memory back
    big = lab.worker(server, "big")

    async def trains() -> bool:  # the server was not disturbed: the next worker trains
        return int((await server.status())["updates_applied"]) >= 3

    await wait_until(trains, 60, "the next worker to train")
    big.stop("test over")
    assert await big.wait(30) == 0
    server.stop("test over")
    assert await server.wait(30) == "test over"
