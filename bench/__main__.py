"""``python -m bench [--only SECTIONS] [--quick] ...``: the benchmark suite (bench/suite.py)."""

from __future__ import annotations

import sys

from snet.cli.output import output_not_written
from snet.cli.progress_bar import EXIT_READER_GONE, detach_stdout

from .suite import parser, run_bench

if __name__ == "__main__":
    try:
        arguments = parser().parse_args()
    except BrokenPipeError:  # the help's reader has gone: as SIGPIPE would end it
        detach_stdout()
        sys.exit(EXIT_READER_GONE)
    except OSError as exc:  # the help onto a full disk (argparse would swallow it)
        sys.exit(output_not_written("python -m bench", exc.strerror or exc))
    sys.exit(run_bench(arguments))
