"""Standard output whose failures are named: ``install()`` (the ``snet`` command's entry)
makes every write to ``sys.stdout`` that fails raise ``OutputNotWritten``.

A command's results go to standard output, and that can fail: ``> file`` on a full disk
(or ``> /dev/full``), a quota, a terminal hung up (EIO). The ``OSError`` it raised reached
the top as a traceback (``snet plan --json > /dev/full``), as any ``OSError`` does there:
a command translates the errors of the files it opens into its own one-line refusals, so
one that arrives at the top could not be told from a bug. Named where it happens (the
house rule: errors are translated where they cross a layer), ``cli/main.py`` ends any
command on it with one line on stderr and exit 1, and the commands that hold training
state (``snet train``, ``snet demo``) stop as when their reader goes, keeping what was
trained. A reader that went away (``| head``) is not a failure: that stays
``BrokenPipeError``, as Python raises it, for the handlers that end such commands quietly.
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator

from snet.protocol.errors import OutputNotWritten


@contextlib.contextmanager
def _named() -> Iterator[None]:
    """A failed write as ``OutputNotWritten``; the reader gone stays ``BrokenPipeError``."""
    try:
        yield
    except BrokenPipeError:
        raise
    except OSError as exc:
        raise OutputNotWritten(exc.strerror or str(exc)) from exc


class _NamedFailures(io.TextIOWrapper):
    """``sys.stdout`` as Python made it (the same buffer, encoding and buffering), but a
    write or flush that fails raises ``OutputNotWritten``."""

    def write(self, text: str) -> int:
        with _named():
            return super().write(text)

    def flush(self) -> None:
        with _named():
            super().flush()


def install() -> None:
    """Put ``_NamedFailures`` in place of ``sys.stdout`` (not when standard output is
    closed, ``>&-``, or already another's). Python's own wrapper, ``sys.__stdout__``, is
    left detached from the buffer: nothing snet runs writes to it."""
    stdout = sys.stdout
    if type(stdout) is not io.TextIOWrapper:
        return
    encoding, errors = stdout.encoding, stdout.errors
    line_buffering, write_through = stdout.line_buffering, stdout.write_through
    # one wrapper of the buffer: of two, the first one closed (at exit, or collected)
    # would close the buffer under the other
    sys.stdout = _NamedFailures(
        stdout.detach(),
        encoding=encoding,
        errors=errors,
        line_buffering=line_buffering,
        write_through=write_through,
    )


def output_not_written(program: str, failure: object) -> int:
    """Say in one line that ``program``'s output could not be written (``failure``: why),
    with standard output detached so that the exit's flush cannot fail again; exit 1."""
    from .progress_bar import detach_stdout, say

    detach_stdout()  # what is still buffered goes nowhere
    say(f"{program}: cannot write its output: {failure}")
    return 1
