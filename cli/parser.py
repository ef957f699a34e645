"""The ``snet`` command line: each command's flags, and the parser built from them.

Nothing imported at the top here may import numpy: a worker's BLAS thread count is fixed
before numpy is first imported (cli/blas.py), and building a command's flags imports its
config classes, numpy with them, so they are imported in the functions that add them.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from _typeshed import SupportsWrite

DESCRIPTION = (
    "snet: an asynchronous client/server parameter service for data-parallel training "
    "(server, worker, spert, status, plan, eval, train, data, bench, demo, tls)"
)

OUT_DIR_HELP = "directory for the weights (default snet-out; env SNET_OUT_DIR, as the server's)"


def _whole_number(text: str) -> int:
    """An argparse type: as ``int`` reads it, but only ASCII digits (it also took "1_0"
    and other scripts' digits: protocol/numbering.py)."""
    from snet.protocol.numbering import plain_int

    return plain_int(text, signed=True)


def _number(text: str) -> float:
    """An argparse type: as ``float`` reads it, but in ASCII (protocol/numbering.py)."""
    from snet.protocol.numbering import plain_float

    return plain_float(text)


_whole_number.__name__, _number.__name__ = "int", "float"  # argparse's "invalid int value"


def _add_plan_flags(parser: argparse.ArgumentParser) -> None:
    """``snet plan`` (cli/plan.py); its defaults are those of the scaling benchmark."""
    parser.add_argument("--network", default="351:1262:45", help='layer sizes, e.g. "351:1262:45"')
    parser.add_argument(
        "--bunch", type=_whole_number, default=1000, help="patterns per worker update"
    )
    parser.add_argument(
        "--link-mbps",
        dest="link_mbps",
        type=_number,
        help="your link's speed in Mbit/s, e.g. 1000 (without it: the 127.0.0.1 loopback "
        "the constants were measured on, and a note saying so)",
    )
    parser.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts")
    parser.add_argument(
        "--strategies",
        default="pattern",
        help="pattern (the default), network (--mode np: sync rows without, async rows "
        "with --np-pipeline), or both: pattern,network",
    )
    parser.add_argument(
        "--modes",
        default="sync,async,bmuf,bmuf-overlap,bmuf-async",
        help="comma-separated: sync, async, bmuf (sync blocks), bmuf-overlap (sync blocks "
        "overlapping the exchange: --block-overlap), bmuf-async",
    )
    parser.add_argument(
        "--block-bunches", dest="block_bunches", type=_whole_number, default=16, help="bmuf: tau"
    )
    parser.add_argument(
        "--compress", default="none", help="update codec: none, fp16, int8, sign (bmuf deltas too)"
    )
    parser.add_argument(
        "--exemplars", type=_whole_number, default=1_000_000, help="exemplars per epoch (BSP table)"
    )
    parser.add_argument("--constants", help="JSON with the model's constants (snet bench output)")
    parser.add_argument("--calibrate", action="store_true", help="measure the constants now")
    parser.add_argument("--measured", help="scaling benchmark JSON to draw against the model")
    parser.add_argument("--png", help="draw the model (and the measurement) to this PNG file")
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")


def _server_flags(server: argparse.ArgumentParser) -> None:
    from snet.server.config import ServerConfig

    from .flags import add_config_flag, add_field_flags, add_job_flags

    add_field_flags(server, ServerConfig, "SNET_")
    add_config_flag(server, "[server] and [job] tables")
    add_job_flags(server)


def _worker_flags(worker: argparse.ArgumentParser) -> None:
    from snet.client.config import WorkerConfig

    from .flags import add_config_flag, add_field_flags

    add_field_flags(worker, WorkerConfig, "SNET_WORKER_")
    add_config_flag(worker, "a [worker] table")


def _spert_flags(spert: argparse.ArgumentParser) -> None:
    from snet.client.config import WorkerConfig
    from snet.client.spert.config import BoardConfig

    from .flags import add_config_flag, add_field_flags

    add_field_flags(spert, WorkerConfig, "SNET_WORKER_", skip=("backend", "processes"))
    add_config_flag(spert, "[worker] and [spert] tables")
    board = spert.add_argument_group("board (also [spert] in the TOML file)")
    add_field_flags(board, BoardConfig, "SNET_SPERT_")


def _status_flags(status: argparse.ArgumentParser) -> None:
    status.add_argument(
        "--url",
        default=None,
        help="the server's HTTP address, HOST:PORT or its URL, /status or not "
        "(default SNET_URL or http://127.0.0.1:7080)",
    )
    status.add_argument("--json", action="store_true", help="print the raw JSON")
    status.add_argument(
        "--watch",
        action="store_true",
        help="follow the status until the run ends, a reading every --interval seconds and the "
        "last; exit 0 once ended, 1 if the server stops answering mid-run (Ctrl-C: stop)",
    )
    status.add_argument(
        "--interval", type=_number, default=2.0, help="least seconds between readings of --watch"
    )
    status.add_argument(
        "--token", help="the server's token (as a worker's --token; default SNET_TOKEN)"
    )
    status.add_argument(
        "--token-file",
        help="the server's token, read from this file (keeps it out of ps; wins over --token)",
    )
    status.add_argument(
        "--tls-ca", help="an https server's certificate must be signed by this CA file"
    )


def _eval_flags(evaluate: argparse.ArgumentParser) -> None:
    from dataclasses import fields

    from snet.protocol.job import DataSpec

    from .flags import add_field_flags

    evaluate.add_argument("--weights", required=True, help="a weights .npz written by snet")
    add_field_flags(
        evaluate,
        DataSpec,
        "SNET_JOB_DATA_",
        defaults={f.name: "the job's, as saved with the weights" for f in fields(DataSpec)}
        | {"norm_file": "the normalisation saved with the weights"},
    )
    evaluate.add_argument(
        "--subset",
        choices=("cv", "test", "train", "all"),
        default="cv",
        help="the job's CV frames (default), its test file, its training frames, or all",
    )
    evaluate.add_argument("--json", action="store_true", help="print the result as JSON")


def _train_flags(train: argparse.ArgumentParser) -> None:
    from .flags import add_config_flag, add_job_flags

    train.add_argument("--out-dir", dest="out_dir", help=OUT_DIR_HELP)
    train.add_argument(
        "--init-weights", dest="init_weights", help="an snet weights .npz to continue from"
    )
    train.add_argument(
        "--force", action="store_true", help="replace the weights an earlier run left there"
    )
    add_config_flag(train, "a [job] table (as the server reads it)")
    add_job_flags(train, parallel=False)
    train.add_argument(
        "--threads",
        type=_whole_number,
        default=None,  # None: SNET_TRAIN_THREADS, else 1 (train.train_threads)
        help="BLAS threads, pinned as a worker's are (default: 1; env SNET_TRAIN_THREADS): "
        "on a busy machine idle BLAS threads waiting for cores made it 5-10x slower",
    )


def _data_flags(data: argparse.ArgumentParser) -> None:
    data_commands = data.add_subparsers(dest="data_command", required=True)
    convert = data_commands.add_parser("convert", help="rewrite data as .pfile, .npz or .ark")
    convert.add_argument("input", help="any data snet reads")
    convert.add_argument("output", help="OUT.pfile, OUT.npz or OUT.ark (+ .scp, -ali.ark)")
    convert.add_argument("--labels", help="Kaldi alignment archive of the input")
    convert.add_argument("--force", action="store_true", help="replace outputs that exist")


def _bench_flags(bench: argparse.ArgumentParser) -> None:
    bench.add_argument("arguments", nargs=argparse.REMAINDER)


def _demo_flags(demo: argparse.ArgumentParser) -> None:
    from .flags import add_config_flag, add_job_flags

    demo.add_argument("--workers", type=_whole_number, default=2, help="numpy worker processes")
    demo.add_argument(
        "--spert", type=_whole_number, default=0, help="emulated Spert-II boards to add as workers"
    )
    demo.add_argument(
        "--spert-time-scale",
        dest="spert_time_scale",
        type=_number,
        default=None,  # 1: real time; given without --spert, it is refused, not ignored
        help="how much faster than real time the demo's boards run (default 1)",
    )
    demo.add_argument(
        "--http-port",
        dest="http_port",
        type=_whole_number,
        default=0,
        help="status port (0: any free)",
    )
    from .worker_priority import PRIORITIES, PRIORITY_VARIABLE

    demo.add_argument(
        "--worker-priority",
        dest="worker_priority",
        metavar="{" + ",".join(PRIORITIES) + "}",
        help="idle: the numpy workers run only when no other process wants the core "
        "(Linux SCHED_IDLE: fastest when the demo has the machine to itself, stalled by "
        "work started later); low: nice +5 (boards always are); auto (default; env "
        f"{PRIORITY_VARIABLE}): idle unless other processes were busy while the demo "
        "started (looked at once, not again)",
    )
    demo.add_argument("--out-dir", dest="out_dir", help=OUT_DIR_HELP)
    # As the server's: the demo resumes the out-dir's run, and its refusals name these.
    demo.add_argument(
        "--fresh", action="store_true", help="start over instead of resuming the out-dir's run"
    )
    demo.add_argument(
        "--force", action="store_true", help="with --fresh: overwrite a finished run's results"
    )
    demo.add_argument(
        "--weights-codec",
        dest="weights_codec",
        help="the workers' --weights-codec (none, fp16, delta:CODEC, shared; default shared: "
        "the server's weights board, shared memory on this machine)",
    )
    add_config_flag(demo, "a [job] table (as the server reads it)")
    # the demo divides the job's bunch among its workers unless one is chosen (cli/demo.py)
    from snet.protocol.job import JobSpec  # as add_job_flags does

    divided = f"the job's {JobSpec().bunch_size} divided among the workers"
    add_job_flags(demo, defaults={"bunch_size": divided})


def _tls_flags(tls: argparse.ArgumentParser) -> None:
    tls_commands = tls.add_subparsers(dest="tls_command", required=True)
    init = tls_commands.add_parser(
        "init", help="make a private CA, the server's certificate and the workers'"
    )
    init.add_argument("directory", help="where to write ca.pem, server.pem, worker.pem, keys")
    init.add_argument(
        "--hosts", default="", help="the server's host names and addresses, comma-separated"
    )
    init.add_argument(
        "--workers", default="", help="one certificate per worker name (default: one shared)"
    )


class Parser(argparse.ArgumentParser):
    """argparse's parser, but help and ``--version`` that cannot be written fail.

    argparse prints them itself, through ``_print_message``, which swallows any
    ``OSError`` of the write: onto a full disk the text was lost and the flush at exit
    failed after it, a traceback and status 120 (unbuffered, cli/output.py's
    ``OutputNotWritten``, no ``OSError``, was a traceback too). Here a message to standard
    output is written and flushed before argparse exits, so that its failure
    (``OutputNotWritten``, or ``BrokenPipeError`` for a reader gone) reaches
    ``cli/main.py``, which says it as for every command's output. Messages to stderr
    (usage on an error) stay argparse's: where stderr fails nothing can be said.
    Subparsers are made of the same class (argparse's ``parser_class`` default).

    And no abbreviated flags: ``snet status --token SECRET`` was taken for
    ``--token-file``, whose error then printed the secret as a file it could not read;
    and a flag added later would change what an abbreviation meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def _print_message(self, message: str, file: SupportsWrite[str] | None = None) -> None:
        to_stdout = file is not None and file is sys.stdout  # help and --version
        if message and to_stdout:
            sys.stdout.write(message)
            sys.stdout.flush()  # buffered, it would fail only at exit, after argparse's exit
            return
        super()._print_message(message, file)


# command -> (its help, what adds its flags, add_parser's other arguments)
COMMANDS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None], dict[str, Any]]] = {
    "server": ("run the server daemon", _server_flags, {}),
    "worker": ("attach a worker to a server", _worker_flags, {}),
    "spert": ("attach an emulated Spert-II board as a worker (backend spert)", _spert_flags, {}),
    "status": ("show a server's training status", _status_flags, {}),
    "plan": (
        "predict MCUPS and speed-up per strategy and mode (performance models)",
        _add_plan_flags,
        {},
    ),
    "eval": ("score saved weights on data", _eval_flags, {}),
    "train": ("sequential training in this process", _train_flags, {}),
    "data": ("data tools", _data_flags, {}),
    "bench": (
        "run a source checkout's benchmark suite (python -m bench; its flags pass through)",
        _bench_flags,
        {"add_help": False},
    ),
    "demo": ("train locally: a server and N worker processes", _demo_flags, {}),
    "tls": ("TLS certificates for a cluster", _tls_flags, {}),
}


@functools.cache
def command_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The command line: every command's flags, or (``only``: the command word given)
    that command's alone. Building the flags of the server, worker, job and data imports
    their config classes and numpy (about 0.3 s of CPU), which ``snet status``, ``snet
    tls``, ``snet --version`` and the top-level ``--help`` never use; they are imported
    here, not at the top, also because numpy must wait for the BLAS limit (main).

    Built once per ``only`` in a process: it depends on nothing but the code, and parsing
    leaves it as it was (what is parsed goes into a new namespace), so a process that
    parses again does not build it again (5-15 ms each: the test suite's fast ring, which
    calls ``main`` and starts its servers and workers in one process, built 160)."""
    from snet import __version__

    parser = Parser(prog="snet", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"snet {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for name, (help_text, add_flags, options) in COMMANDS.items():
        command = commands.add_parser(name, help=help_text, **options)
        if only is None or only == name:
            add_flags(command)
    return parser


def _command_of(parser: argparse.ArgumentParser, name: str) -> argparse.ArgumentParser:
    """The parser of the command ``name`` (to say an error with its own usage)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction) and name in action.choices:
            found: argparse.ArgumentParser = action.choices[name]
            return found
    return parser


def parse_command(words: list[str]) -> argparse.Namespace:
    """``words``, a command line after ``snet``, read as ``main`` reads them."""
    # keyed by a known command word only: a typo is refused by the parser of no command
    command = words[0] if words and words[0] in COMMANDS else ""
    parser = command_parser(command)
    args, unknown = parser.parse_known_args(words)
    if unknown:  # said by the command's parser: its usage, not all commands' (a typo
        # in one flag of snet worker printed the list of commands)
        _command_of(parser, command).error(f"unrecognized arguments: {' '.join(unknown)}")
    if command in ("train", "demo") and args.out_dir is None:  # as the server finds its own
        args.out_dir = os.environ.get("SNET_OUT_DIR", "snet-out")
    if command == "demo" and args.worker_priority is None:  # read here: the parser is kept
        from .worker_priority import default_priority

        args.worker_priority = default_priority()
    return args
