"""Imported first by conftest.py: numpy, in this process, with one BLAS thread.

The lab's workers compute in threads of the test process, as ``snet worker`` processes do
with one BLAS thread each (cli/main.py). With BLAS's default, a thread per core, each of
them competes with the others' BLAS threads, and in-process training ran 5-10 times
slower. BLAS reads the setting once, when numpy is first imported; the environment is
put back afterwards, so that the processes tests start see what they always did.
"""

from __future__ import annotations

import os
import sys

from snet.cli.runtime import BLAS_VARIABLES  # imports no numpy


def _numpy_with_one_blas_thread() -> None:
    assert "numpy" not in sys.modules, "numpy was imported before tests/conftest.py"
    saved = {name: os.environ.get(name) for name in BLAS_VARIABLES}
    os.environ.update(dict.fromkeys(BLAS_VARIABLES, "1"))
    try:
        import numpy  # noqa: F401
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


_numpy_with_one_blas_thread()
