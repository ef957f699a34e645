"""``python -m bench [--only SECTIONS] [--quick] ...``: the benchmark suite (bench/suite.py)."""

from __future__ import annotations

import sys

from snet.cli.progress_bar import EXIT_READER_GONE, detach_stdout

from .suite import parser, run_bench

if __name__ == "__main__":
    try:
        arguments = parser().parse_args()
    except BrokenPipeError:  # the help's reader has gone: as SIGPIPE would end it
        detach_stdout()
        sys.exit(EXIT_READER_GONE)
    except OSError as exc:  # the help onto a full disk (argparse would swallow it)
        detach_stdout()
        print(f"python -m bench: cannot write its output: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(1)
    sys.exit(run_bench(arguments))
