"""What a service manager needs from the daemon: a pid file and readiness notices.

``PidFile``: the process id, written (atomically) at startup and removed at exit. A file
that names another process which is still running means a second server was started with
the same ``--pid-file``: that is refused, so two daemons never fight over one file. A file
left by a process that no longer exists (after a crash or SIGKILL) is simply replaced.
``ReadyFile``: the pid and both ports (JSON), written once the server serves and removed
at exit, as a stale one would name a dead process.

``OutDirLock``: an exclusive ``flock`` on ``OUT_DIR/.lock`` while the server (or ``snet
train``) runs, so two of them never write one out-dir's checkpoints and results. The
kernel drops the lock when the process ends, however it ends, so a crash never leaves a
stale lock behind. An out-dir removed while its server runs took the lock file with it
(the server held a descriptor of a file no longer there, and a second server was let in):
``keep()``, called every second, takes it again, or says that another process has.

``notify``: systemd's readiness protocol (``Type=notify``), a datagram such as
``READY=1`` sent to the socket named in ``$NOTIFY_SOCKET``; a no-op without it.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import socket
import tempfile
from pathlib import Path

from snet.protocol.errors import ConfigError, OutDirInUse, OutDirUnwritable, SnetError
from snet.protocol.numbering import is_plain_int
from snet.transport.files import write_atomically

log = logging.getLogger("snet.server")


def _running(pid: int) -> bool:
    """Whether process ``pid`` runs: a zombie (killed, not yet reaped by its parent) does
    not (a server restarted at once after a kill -9 was refused by its own corpse)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        pass
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:  # gone since; or no /proc here to look in: running, as said above
        return not Path("/proc/self").exists()
    return not any(line.split()[1:2] == ["Z"] for line in status.splitlines()
                   if line.startswith("State:"))  # fmt: skip


class ReadyFile:
    """``--ready-file``: ``write()`` once serving, ``remove()`` at exit (if written)."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.written = False

    def write(self, port: int, http_port: int) -> None:
        ready = {"pid": os.getpid(), "port": port, "http_port": http_port}
        write_atomically(self.path, json.dumps(ready).encode())
        self.written = True

    def remove(self) -> None:
        if self.written:  # "ready" no more: a stale file would name a dead pid
            self.path.unlink(missing_ok=True)
            self.written = False


class PidFile:
    """One pid file; ``claim()`` at startup, ``release()`` at exit."""

    def __init__(self, path: str) -> None:
        self.path = Path(path)
        self.pid = os.getpid()
        self.claimed = False

    def check(self) -> None:
        """Refuse to start when the file names another live process."""
        try:
            text = self.path.read_text().strip()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise ConfigError(f"cannot read pid file {self.path}: {exc.strerror}") from exc
        if is_plain_int(text) and int(text) != self.pid and _running(int(text)):
            raise OutDirInUse(
                f"pid file {self.path} names process {text}, which is still running "
                "(another snet server?); stop it or choose another --pid-file"
            )

    def claim(self) -> None:
        """Write this process's id (after ``check()``)."""
        self.check()
        try:
            write_atomically(self.path, f"{self.pid}\n".encode())
        except OSError as exc:
            raise ConfigError(f"cannot write pid file {self.path}: {exc.strerror}") from exc
        self.claimed = True

    def release(self) -> None:
        """Remove the file if it still names this process."""
        if not self.claimed:
            return
        self.claimed = False
        try:
            if self.path.read_text().strip() == str(self.pid):
                self.path.unlink()
        except OSError:
            pass  # already gone or unreadable: nothing of ours to remove


class OutDirLock:
    """The out-dir's lock; ``acquire()`` at startup, released at exit (or by the kernel)."""

    def __init__(self, out_dir: str, holder: str = "snet server") -> None:
        self.path = Path(out_dir) / ".lock"
        self.holder = holder  # what a refused process is told holds it (snet train, too)
        self._handle: int | None = None
        self._made = False  # the out-dir did not exist before this process locked it
        self.lost = False  # another process took the out-dir from this one (``keep``)
        self._unusable_said = False

    def acquire(self) -> None:
        """Take the lock, or raise ``OutDirInUse`` naming the server that holds it."""
        try:
            self._made = self._made or not self.path.parent.exists()
            self.path.parent.mkdir(parents=True, exist_ok=True)
            handle = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:  # (a file there: "File exists", said plainly)
            why = "not a directory" if exc.errno == errno.EEXIST else ""
            said = f"cannot use out-dir {self.path.parent}: {why or exc.strerror}"
            raise _unusable(said, exc) from exc
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            # "PID HOLDER"; a lock written before the holder was named holds the pid only
            words = os.pread(handle, 64, 0).decode(errors="replace").split(maxsplit=1)
            os.close(handle)
            pid = words[0] if words else "unknown"
            holder = words[1].strip() if len(words) > 1 else "snet server"
            raise OutDirInUse(
                f"out-dir {self.path.parent} is in use by another {holder} (pid {pid}); "
                "stop it or choose another --out-dir"
            ) from None
        try:  # the holder's pid, for a refused one to name (a full disk: a traceback)
            os.ftruncate(handle, 0)
            os.pwrite(handle, f"{os.getpid()} {self.holder}\n".encode(), 0)
        except OSError as exc:
            os.close(handle)
            said = f"cannot use out-dir {self.path.parent}: cannot write {self.path}"
            raise _unusable(f"{said}: {exc.strerror}", exc) from exc
        self._handle = handle

    def keep(self) -> str:
        """ "" while the lock this process holds is the out-dir's; else (the out-dir removed,
        or its lock file replaced) the lock is taken again, said in the log, and "" again;
        why to stop when another process has taken it meanwhile (``lost``: nothing is to be
        written there any more)."""
        if self._handle is None or self.lost or self._still_ours(self._handle):
            return ""
        gone, self._handle = self._handle, None
        try:
            self.acquire()
        except OutDirInUse as exc:
            self.lost = True
            os.close(gone)
            log.error("out-dir %s was removed while this %s ran, and %s", self.path.parent,
                      self.holder, exc)  # fmt: skip
            return f"out-dir taken by another process: {exc}"
        except (ConfigError, OutDirUnwritable) as exc:  # tried again at the next call
            self._handle = gone
            if not self._unusable_said:
                log.error("out-dir %s was removed while this %s ran: %s", self.path.parent,
                          self.holder, exc)  # fmt: skip
            self._unusable_said = True
            return ""
        os.close(gone)
        self._unusable_said = False
        log.warning("out-dir %s was removed (or its lock replaced) while this %s ran: made "
                    "again and locked; checkpoints and results go on there", self.path.parent,
                    self.holder)  # fmt: skip
        return ""

    def gone(self) -> bool:
        """Whether another process took the out-dir from this one (``keep``)."""
        return self.lost

    def _still_ours(self, handle: int) -> bool:
        try:
            held, there = os.fstat(handle), os.stat(self.path)
        except OSError:
            return False  # the file, or the whole out-dir, is gone
        return (held.st_dev, held.st_ino) == (there.st_dev, there.st_ino)

    def release(self) -> None:
        """Drop the lock; an out-dir this process made and left with nothing but its lock
        (a start refused after the lock: data not found, a port in use) is removed, as if
        never made (a probe found such empty out-dirs left by every refused start)."""
        if self._handle is not None:
            os.close(self._handle)  # closing the descriptor drops the lock
            self._handle = None
            if self._made and not self.lost:
                with contextlib.suppress(OSError):  # (anything else there: it stays)
                    if [p.name for p in self.path.parent.iterdir()] == [self.path.name]:
                        self.path.unlink()
                        self.path.parent.rmdir()


def check_places(out_dir: str, files: tuple[str, ...], directories: tuple[str, ...] = ()) -> None:
    """Refuse, at start, an out-dir where the checkpoints or the results could never be
    written: with a file named ``checkpoints`` there a run trained to its end, then
    failed (the last checkpoint, and so the results, not written) and started over when
    restarted (a probe). ``files`` must not be directories; the out-dir (where each is
    written, through a temporary file) and its ``directories`` must take a new file. A
    directory made for the check is removed again: the run makes it when it writes
    there (an empty ``checkpoints`` left by a server that then failed on its data made
    the out-dir a server's run to ``snet train``: a review)."""
    where = Path(out_dir)
    for name in files:
        if (where / name).is_dir():
            raise ConfigError(f"cannot use out-dir {where}: {where / name} is a directory, "
                              "where the results go")  # fmt: skip
    for folder in (where, *(where / name for name in directories)):
        made = not folder.exists() and not folder.is_symlink()
        try:
            folder.mkdir(exist_ok=True)
            _probe(folder)
        except OSError as exc:
            why = "is not a directory" if folder.exists() and not folder.is_dir() else ""
            said = f"cannot use out-dir {where}: {folder} {why or 'cannot be written: '}"
            raise _unusable(said + ("" if why else str(exc.strerror)), exc) from exc
        finally:
            if made:
                with contextlib.suppress(OSError):
                    folder.rmdir()


def _probe(folder: Path) -> None:
    """Make a new file in ``folder`` and remove it (OSError if it cannot be made):
    ``os.access`` says yes to root, even in /proc."""
    with tempfile.NamedTemporaryFile(dir=folder, prefix=".snet-check-"):
        pass


def _unusable(text: str, exc: OSError) -> SnetError:
    """A full disk or an I/O error: ``OutDirUnwritable`` (exit 1, retried: a crash followed
    by a moment's full disk ended a systemd unit's run for good); else ``ConfigError``."""
    transient = exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO)
    return OutDirUnwritable(text) if transient else ConfigError(text)


def check_output_files(paths: dict[str, str]) -> None:
    """ConfigError unless each named file (``what``: path; "" for none) can be written
    where it is to go: its folder is made as the writes would make it, and must take a
    new file. Checked before the data is loaded, so that a typo costs nothing, where a
    trace file's was a traceback and a ready file's one only after start-up."""
    for what, path in paths.items():
        if not path:
            continue
        folder = Path(path).parent
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):  # a file on the way
            raise ConfigError(f"cannot write the {what} {path}: a file is in its path") from None
        except OSError as exc:
            raise ConfigError(f"cannot write the {what} {path}: {exc.strerror}") from exc
        if Path(path).is_dir() or not os.access(folder, os.W_OK | os.X_OK):
            problem = "it is a directory" if Path(path).is_dir() else "its folder is not writable"
            raise ConfigError(f"cannot write the {what} {path}: {problem}")
        try:
            _probe(folder)
        except OSError as exc:
            raise ConfigError(f"cannot write the {what} {path}: {exc.strerror}") from None


def notify(state: str) -> bool:
    """Tell systemd ``state`` (e.g. ``"READY=1"``); True when there was someone to tell."""
    address = os.environ.get("NOTIFY_SOCKET", "")
    if not address:
        return False
    if address.startswith("@"):  # an abstract socket
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as channel:
            channel.sendto(state.encode(), address)
    except OSError as exc:  # never fatal: the service manager may be gone
        logging.getLogger("snet.server").warning("cannot notify %s: %s", address, exc)
        return False
    return True
