"""``python -m bench [--only SECTIONS] [--quick] ...``: the benchmark suite (bench/suite.py)."""

from __future__ import annotations

import sys

from .suite import parser, run_bench

if __name__ == "__main__":
    sys.exit(run_bench(parser().parse_args()))
