"""BLAS thread counts, fixed before numpy is first imported (``cli/main.py``)."""

from __future__ import annotations

import os

BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_thread_env(threads: int) -> dict[str, str]:
    """This process's environment with every BLAS thread count set to ``threads``: for a
    child process, whose BLAS reads it when numpy (or torch) is first imported."""
    return {**os.environ, **dict.fromkeys(BLAS_VARIABLES, str(threads))}


def limit_blas_threads(threads: int) -> None:
    """Pin the BLAS thread count; effective only before numpy is first imported."""
    for name in BLAS_VARIABLES:
        os.environ.setdefault(name, str(threads))
