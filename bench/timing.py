"""Small timing helpers shared by the benchmarks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def seconds_per_call(
    function: Callable[[], object], budget: float = 0.6, repeats: int = 3
) -> float:
    """The best of ``repeats`` means of ``function``'s time, each over ``budget`` seconds.

    The best (not the mean) of the repeats is reported because on a shared machine noise
    only ever adds time.
    """
    function()  # warm caches, allocate
    means = []
    for _ in range(repeats):
        calls, started = 0, time.perf_counter()
        while True:
            function()
            calls += 1
            elapsed = time.perf_counter() - started
            if elapsed >= budget / repeats and calls >= 2:
                break
        means.append(elapsed / calls)
    return min(means)


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
