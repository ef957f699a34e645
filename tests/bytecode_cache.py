"""Imported by conftest.py before the tests' own modules: this process caches the bytecode
of what it compiles, as Python does by default, even where PYTHONDONTWRITEBYTECODE is set.

With it set, every run compiled the test modules (pytest's assertion rewriting), tests/'
helpers and bench/ from source again: 1.4 s of the 2.3 s it took to collect the fast
ring. The files go to the ``__pycache__`` directories beside them (ignored by git). The
processes tests start keep the environment they always had.
"""

from __future__ import annotations

import sys

sys.dont_write_bytecode = False
