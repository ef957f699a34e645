"""The garbage collector at start-up: what a process loads, it keeps to its end.

A snet process's start-up (numpy, numba and its cached kernels, aiohttp, its own code)
makes a hundred thousand objects or more, nearly all kept for the whole run, and each full
collection walks every one of them: 54 ms in a worker once numba is loaded. A demo
worker's process ran two of them while it loaded, on the path to its first bunch, and
each process ran more while it trained.

So the commands' entry points (``snet``, the demo's preloaded workers) switch the
collector off first thing (``start_quietly``), and ``settle`` puts everything made so far
out of its sight for good (``gc.freeze``; a forked worker freezes what it inherited at
its own start, before any collection could walk it, so those pages stay shared with the
process it was forked from) and switches it back on: when the command's event loop
starts, before ``snet train``'s first epoch, and again once a server has loaded its data
(before any worker connects) and once numba's kernels are loaded. Only objects made after
that are ever collected. The start-up's own cyclic garbage is kept with the rest: about
1,300 objects and 150 kB in a worker. A process whose collector was never switched off
here (the tests, which call ``main`` in their own process and check what the collector
finds) is left as it is.
"""

from __future__ import annotations

import gc

_quiet = False  # start_quietly() was called: settle() has something to do


def start_quietly() -> None:
    """Switch the collector off for the start-up of this process (its entry point's)."""
    global _quiet
    _quiet = True
    gc.disable()


def settle() -> None:
    """After ``start_quietly``: freeze what exists (never collected, never walked again)
    and switch the collector on; else nothing. May be called again later: what was made
    in between is frozen then."""
    if _quiet:
        gc.freeze()
        gc.enable()
