"""Benchmarks: every figure is a ratio measured in the same run. Never installed.

They run from a source checkout: ``python -m bench`` (the suite, see ``bench/suite.py``),
``python -m bench.scaling`` and the other modules, or ``snet bench`` in a checkout. Like
the command line, this harness starts servers and workers, so it may import every part of
``snet``; nothing in ``snet`` imports it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parent.parent


def child_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the checkout first on PYTHONPATH, so that a
    child started as ``python -m bench.X`` finds this bench from any directory."""
    base = dict(os.environ if env is None else env)
    rest = base.get("PYTHONPATH")
    base["PYTHONPATH"] = os.pathsep.join(filter(None, (str(CHECKOUT), rest)))
    return base
