"""``snet``: reads the command line (cli/parser.py) and runs the command it names (server,
worker, spert, status, plan, eval, train, data, bench, demo, tls), each from its module."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
from typing import TYPE_CHECKING, NoReturn

# Nothing imported here may import numpy: a worker's BLAS thread count is fixed by
# limit_blas_threads() in main(), and BLAS reads it once, when numpy is first imported
# (with two BLAS threads per worker on two cores, the demo ran ten times slower).
from snet.protocol.heap import settle

from .blas import early_blas_limit
from .parser import COMMANDS, parse_command

if TYPE_CHECKING:
    import argparse

    from .preloaded_worker import PreloadedWorker

SWITCHES = {"SNET_LOOP": ("asyncio", "uvloop"), "SNET_KERNELS": ("auto", "numba", "numpy")}
CASE_FREE = {"SNET_LOOP"}  # read in any case (cli/runtime.py); SNET_KERNELS as it is


def _check_switches() -> None:
    """The environment's developer switches take known values only (a typo such as
    SNET_KERNELS=nunpy was ignored without a word: the default ran)."""
    from snet.protocol.errors import ConfigError

    for name, known in SWITCHES.items():
        value = os.environ.get(name, "")
        compared = value.lower() if name in CASE_FREE else value
        if value and compared not in known:
            raise ConfigError(f"{name}={value!r} is not one of {', '.join(known)}")


def main(argv: list[str] | None = None, preload_workers: bool = False) -> int:
    """Run the command ``argv`` (default: this process's arguments); its exit status.
    ``preload_workers``: the ``snet`` executable's (``entry``), where the demo starts its
    workers' process first thing (``_preloaded_worker``); a caller in its own process
    (the tests' fast ring) starts it, as every worker process, only when it is needed."""
    words = sys.argv[1:] if argv is None else argv
    early_blas_limit(words)
    if words[:1] == ["bench"]:  # every argument, --help too, is the suite's own
        from snet.protocol.errors import ConfigError

        from .checkout import run_bench

        try:
            return run_bench(words[1:])
        except ConfigError as exc:
            print(f"snet: {exc}", file=sys.stderr)
            return 2
    preloaded = None
    try:
        preloaded = _preloaded_worker(words) if preload_workers else None
        return _dispatch(words, preloaded)
    except KeyboardInterrupt as exc:  # before the command was parsed (the demo's first 0.1 s)
        from .stop_signals import stopped_unhandled

        return stopped_unhandled(words[0] if words and words[0] in RUNNERS else "", exc)
    finally:
        if preloaded is not None:  # one the demo did not give a command (it stopped first)
            preloaded.discard()


def _preloaded_worker(words: list[str]) -> PreloadedWorker | None:
    """For ``snet demo``: its numpy workers' process, started now to load their code
    while the demo loads its own (cli/preloaded_worker.py); None for other commands."""
    if words[:1] != ["demo"] or {"-h", "--help"} & set(words):
        return None
    from .preloaded_worker import PreloadedWorker, worker_environment

    return PreloadedWorker.start(worker_environment())


def _dispatch(words: list[str], preloaded: PreloadedWorker | None) -> int:
    """Parse ``words`` and run the command they name; its exit status. The errors every
    command may end on are said here, in one line."""
    from snet.protocol import errors
    from snet.protocol.errors import ConfigError, DataError, ListenError, OutDirInUse

    args = _parse(words)
    if isinstance(args, int):  # --help or --version, which could not be written
        return args
    try:
        _check_switches()
        out_dir = getattr(args, "out_dir", None)  # train, demo (the server's says so)
        if out_dir is not None and not out_dir.strip():
            raise ConfigError("--out-dir (or SNET_OUT_DIR) is empty: it would be the current "
                              "directory; give one")  # fmt: skip
        status = _run(args, preloaded)
        if sys.stdout is not None:  # what is buffered, written while a failure can be said
            sys.stdout.flush()
        return status
    except (ListenError, OutDirInUse, errors.OutDirUnwritable, errors.ResultsNotWritten,
            errors.TrainingDiverged) as exc:  # fmt: skip
        print(f"snet: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # the reader of the output left (| head): stop, as SIGPIPE would
        from .progress_bar import EXIT_READER_GONE, detach_stdout, say

        detach_stdout()
        say(f"snet {args.command}: stopped: its output's reader has gone")
        return EXIT_READER_GONE
    except errors.OutputNotWritten as exc:  # > a full disk (cli/output.py): the results lost
        return _output_not_written(args.command, exc)
    except (ConfigError, DataError) as exc:
        print(f"snet: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # before the command took the signal over
        from .stop_signals import stopped_unhandled

        return stopped_unhandled(args.command, exc)


def _parse(words: list[str]) -> argparse.Namespace | int:
    """``words`` parsed; or the exit status when the help or version they ask for could
    not be written (cli/parser.py's ``Parser``): one line and 1 as for any command's
    output, or 141 and no line for a reader gone (nothing was started to stop)."""
    from snet.protocol.errors import OutputNotWritten

    try:
        return parse_command(words)
    except OutputNotWritten as exc:
        return _output_not_written(words[0] if words[:1] and words[0] in COMMANDS else "", exc)
    except BrokenPipeError:
        from .progress_bar import EXIT_READER_GONE, detach_stdout

        detach_stdout()
        return EXIT_READER_GONE


def _output_not_written(command: str, failure: Exception) -> int:
    """Say that ``snet COMMAND``'s output could not be written, in one line; exit 1."""
    from .output import output_not_written

    return output_not_written(f"snet{f' {command}' if command else ''}", failure)


# command -> (its module, the function that runs it), imported only for it; the demo's is
# given the preloaded worker too
RUNNERS = {
    "server": ("commands", "run_server"),
    "worker": ("commands", "run_worker"),
    "spert": ("spert", "run_spert"),
    "status": ("status", "run_status"),
    "tls": ("commands", "run_tls_init"),
    "plan": ("plan", "run_plan"),
    "train": ("train", "run_train"),
    "eval": ("offline", "run_eval"),
    "data": ("offline", "run_convert"),
    "demo": ("demo", "run_demo"),
}


# Commands that switch the garbage collector back on themselves, once they have loaded
# what they keep (protocol/heap.py); the others get it back before they start.
SETTLE_THEMSELVES = frozenset({"server", "worker", "spert", "train", "demo"})


def _run(args: argparse.Namespace, preloaded: PreloadedWorker | None) -> int:
    """Run the command ``args`` name, from its module (imported only for it)."""
    if args.command not in SETTLE_THEMSELVES:
        settle()
    module, name = RUNNERS[args.command]
    run = getattr(importlib.import_module(f".{module}", __package__), name)
    status: int = run(args, preloaded) if args.command == "demo" else run(args)
    return status


# Commands that end a long run with every file closed and every thread joined (the server's
# shutdown closes its trace and joins its step and checkpoint threads; a worker's session,
# a board's and the demo's end the same way): they leave without the interpreter's
# teardown, which after numpy, aiohttp and numba costs 0.15-0.2 s of CPU at every exit
# (the forked workers of ``--processes N`` already did).
QUICK_EXIT = frozenset({"server", "worker", "spert", "demo"})


def entry() -> NoReturn:
    """The ``snet`` command (its console script and ``python -m snet.cli``)."""
    from snet.protocol.heap import start_quietly

    from .lifeline import follow_supervisor
    from .output import install as install_output
    from .stop_signals import stop_at_once_on_sigterm

    start_quietly()  # no collections while it loads what it keeps (protocol/heap.py)
    follow_supervisor()  # first: started by ``snet demo``, it must not outlive the demo
    words = sys.argv[1:]
    stop_at_once_on_sigterm(words[0] if words[:1] and words[0] in COMMANDS else "")
    install_output()  # a failed write to stdout is OutputNotWritten, not any OSError
    finish(words, main(words, preload_workers=True))


def finish(words: list[str], status: int) -> NoReturn:
    """Exit with ``status`` the command ``words`` returned (``QUICK_EXIT``: at once)."""
    if words[:1] and words[0] in QUICK_EXIT:
        import logging

        from snet.protocol.errors import OutputNotWritten

        logging.shutdown()  # the last lines of the log, flushed
        for stream in (sys.stdout, sys.stderr):
            # a reader gone, a stream closed, a full disk: nothing is left to keep
            with contextlib.suppress(OSError, ValueError, OutputNotWritten):
                stream.flush()
        os._exit(status)
    sys.exit(status)


if __name__ == "__main__":
    entry()
