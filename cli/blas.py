"""BLAS thread counts, fixed before numpy is first imported (``cli/main.py``)."""

from __future__ import annotations

import os

from snet.protocol.numbering import is_plain_int

BLAS_VARIABLES = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def blas_thread_env(threads: int) -> dict[str, str]:
    """This process's environment with every BLAS thread count set to ``threads``: for a
    child process, whose BLAS reads it when numpy (or torch) is first imported."""
    return {**os.environ, **dict.fromkeys(BLAS_VARIABLES, str(threads))}


def limit_blas_threads(threads: int) -> None:
    """Pin the BLAS thread count; effective only before numpy is first imported."""
    for name in BLAS_VARIABLES:
        os.environ.setdefault(name, str(threads))


def early_blas_limit(argv: list[str]) -> None:
    """The BLAS thread count of a worker or of ``snet train`` (``--threads``, else
    SNET_WORKER_THREADS or SNET_TRAIN_THREADS, else 1), set before anything imports numpy:
    building the parser already does."""
    if not argv or argv[0] not in ("worker", "spert", "train"):
        return
    variable = "SNET_TRAIN_THREADS" if argv[0] == "train" else "SNET_WORKER_THREADS"
    threads = os.environ.get(variable, "1")
    for index, word in enumerate(argv):
        if word == "--threads" and index + 1 < len(argv):
            threads = argv[index + 1]
        elif word.startswith("--threads="):
            threads = word.split("=", 1)[1]
    limit_blas_threads(int(threads) if is_plain_int(threads) and int(threads) > 0 else 1)
