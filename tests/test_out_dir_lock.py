"""The out-dir's lock (server/service.py): taken again when the out-dir is removed while
its server runs, and a full disk at start-up an error to retry, not a setting."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from snet.cli.main import main
from snet.protocol.errors import ConfigError, OutDirInUse, OutDirUnwritable
from snet.server.service import OutDirLock, PidFile, check_places

from helpers import DrivenProcess
from inprocess import Lab
from inprocess import wait_until as wait_in_lab
from short_data import short_job


def test_an_out_dir_removed_while_its_server_runs_is_locked_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The server held a descriptor of a lock file no longer there: a second server on the
    same --out-dir was let in, and both wrote its checkpoints and results."""
    out = tmp_path / "out"
    server = OutDirLock(str(out))
    server.acquire()
    assert server.keep() == ""  # its own: nothing to do
    shutil.rmtree(out)
    assert server.keep() == ""
    assert "was removed (or its lock replaced) while this snet server ran: made again" in (
        caplog.text
    )
    second = OutDirLock(str(out))
    with pytest.raises(OutDirInUse, match=f"in use by another snet server \\(pid {os.getpid()}"):
        second.acquire()  # refused again
    # removed, and taken by another before this one looked: it stops, writing nothing there
    shutil.rmtree(out)
    second.acquire()
    try:
        reason = server.keep()
        assert reason.startswith("out-dir taken by another process: out-dir ")
        assert server.lost and server.keep() == ""  # said once
    finally:
        second.release()
        server.release()


def test_an_out_dir_that_cannot_be_made_again_is_said_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "out"
    server = OutDirLock(str(out))
    server.acquire()
    shutil.rmtree(out)
    out.write_text("a file where the out-dir was")
    caplog.set_level(logging.ERROR)
    assert [server.keep() for _ in range(3)] == ["", "", ""]  # the checkpoints say it too
    assert caplog.text.count("was removed while this snet server ran") == 1
    server.release()


def test_a_full_disk_at_start_up_is_an_error_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 2, which systemd's units take for a setting to mend: a crash followed by a
    moment's full disk ended the run for good."""
    real = os.open

    def full(path: str, flags: int, mode: int = 0o777) -> int:
        if str(path).endswith(".lock"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(path, flags, mode)

    monkeypatch.setattr(os, "open", full)
    with pytest.raises(OutDirUnwritable, match="No space left on device"):
        OutDirLock(str(tmp_path / "out")).acquire()
    argv = ["server", "--port", "0", "--http-port", "0", "--out-dir", str(tmp_path / "o")]
    assert main(argv) == 1
    assert "cannot use out-dir" in capsys.readouterr().err


@pytest.mark.parametrize("lab", ["uvloop"], indirect=True)
async def test_a_server_whose_out_dir_was_removed_makes_it_again_and_writes_there(
    lab: Lab,
) -> None:
    server = await lab.server("--epochs", "1", *short_job())
    shutil.rmtree(server.out_dir)
    await wait_in_lab(lambda: (server.out_dir / ".lock").exists(), 10, "the lock taken again")
    assert "was removed (or its lock replaced)" in lab.log("server")
    worker = lab.worker(server, "w1")
    assert await server.wait(60) == "trained"
    assert await worker.wait(30) == 0
    assert (server.out_dir / "weights.npz").exists()
    assert server.final_status()["state"] == "trained"


def test_no_checkpoint_is_written_into_an_out_dir_another_process_took(tmp_path: Path) -> None:
    """Its higher checkpoint numbers went into the other server's directory: that one's
    next restart resumed this run, and this one's pruning deleted its checkpoints."""
    from snet.server.checkpoint import CheckpointStore

    out = tmp_path / "out"
    lock = OutDirLock(str(out))
    lock.acquire()
    store = CheckpointStore(out / "checkpoints", 2, lock.gone)
    store.write({"version": 1})
    shutil.rmtree(out)
    other = OutDirLock(str(out))
    other.acquire()
    try:
        assert lock.keep().startswith("out-dir taken by another process")
        with pytest.raises(OSError, match="taken by another process: nothing is written there"):
            store.write({"version": 2})
        assert not (out / "checkpoints").exists()
    finally:
        other.release()
        lock.release()


@pytest.mark.parametrize(
    ("command", "made", "said"),
    [
        ("server", "checkpoints", "cannot use out-dir {out}: {out}/checkpoints is not a directory"),
        ("server", "status.json/", "{out}/status.json is a directory, where the results go"),
        ("server", "weights.npz/", "{out}/weights.npz is a directory, where the results go"),
        ("server", "norms/", "{out}/norms is a directory, where the results go"),
        ("train", "weights.npz/", "{out}/weights.npz is a directory, where the results go"),
    ],
)
def test_an_out_dir_where_results_could_never_be_written_is_refused_at_start(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, made: str, said: str
) -> None:
    """A file named ``checkpoints`` in the out-dir: the whole run was trained, then failed
    at its end (the last checkpoint, and so the results, not written: exit 1), and a
    restart started over (a probe). A weights.npz that is a directory, the same."""
    out = tmp_path / "out"
    out.mkdir()
    if made.endswith("/"):
        (out / made).mkdir()
    else:
        (out / made).write_text("not a directory")
    flags = ["--port", "0", "--http-port", "0"] if command == "server" else []
    assert main([command, *flags, "--out-dir", str(out), *short_job()]) == 2
    err = capsys.readouterr().err
    assert said.format(out=out) in err and "Traceback" not in err
    assert not (out / "weights.npz").is_file()  # nothing trained, nothing written


def test_a_checkpoints_directory_on_a_full_disk_is_an_error_to_retry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each place is written into once at start: a full disk there is said then (exit 1,
    retried), not after the whole run; and what the check made it removes (an empty
    checkpoints/ left by a server that then failed on its data made the out-dir a
    server's run to snet train: a review)."""
    real = tempfile.NamedTemporaryFile

    def full_in_checkpoints(*args: Any, **kwargs: Any) -> Any:
        if Path(kwargs["dir"]).name == "checkpoints":
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(*args, **kwargs)

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", full_in_checkpoints)
    said = "checkpoints cannot be written: No space left on device"
    with pytest.raises(OutDirUnwritable, match=said):
        check_places(str(tmp_path), (), ("checkpoints",))
    assert list(tmp_path.iterdir()) == []  # made for the check, and removed
    monkeypatch.undo()
    check_places(str(tmp_path), (), ("checkpoints",))
    assert list(tmp_path.iterdir()) == []  # a check leaves nothing behind
    (tmp_path / "checkpoints").mkdir()
    check_places(str(tmp_path), (), ("checkpoints",))
    assert (tmp_path / "checkpoints").is_dir()  # one that was there stays


def test_an_out_dir_that_takes_no_new_file_is_refused_at_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The results are written through a temporary file in the out-dir itself: one that
    takes none (its lock file kept from an earlier run) trained to the end before (a
    review)."""

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refused)
    with pytest.raises(ConfigError, match=f"{tmp_path} cannot be written: Permission denied"):
        check_places(str(tmp_path), ("weights.npz",), ("checkpoints",))


@pytest.mark.system
def test_a_pid_file_naming_a_zombie_is_taken_over(tmp_path: Path) -> None:
    """A server restarted within half a second of a kill -9 was refused by its own corpse
    (pid file names process N, "which is still running": N was a zombie its parent had
    not reaped yet; a probe)."""
    with DrivenProcess(["true"]) as corpse:  # exits at once; reaped when the block ends
        status = Path(f"/proc/{corpse.pid}/status")
        deadline = time.monotonic() + 10
        while "State:\tZ" not in status.read_text() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert "State:\tZ" in status.read_text()
        path = tmp_path / "server.pid"
        path.write_text(f"{corpse.pid}\n")
        PidFile(str(path)).claim()  # not refused
        assert path.read_text().strip() == str(os.getpid())
        path.write_text(f"{os.getppid()}\n")  # a live one (this one's parent) still refuses
        with pytest.raises(OutDirInUse, match="which is still running"):
            PidFile(str(path)).claim()


def test_an_out_dir_made_for_a_start_that_was_refused_is_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every refused start (data not found, a port in use) left the out-dir it made,
    empty but for its lock (a probe). One this process made and left with its lock alone
    goes at release; one that holds anything else, or was there before, stays."""
    made = OutDirLock(str(tmp_path / "made"))
    made.acquire()
    made.release()
    assert not (tmp_path / "made").exists()
    kept = OutDirLock(str(tmp_path / "kept"))
    kept.acquire()
    (tmp_path / "kept" / "weights.npz").write_bytes(b"results")
    kept.release()
    assert (tmp_path / "kept" / "weights.npz").exists()
    (tmp_path / "there").mkdir()
    there = OutDirLock(str(tmp_path / "there"))
    there.acquire()
    there.release()
    assert (tmp_path / "there").is_dir()
    argv = ["server", "--port", "0", "--http-port", "0", "--out-dir", str(tmp_path / "new")]
    assert main([*argv, "--data", str(tmp_path / "nonexistent.npz")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert not (tmp_path / "new").exists()
