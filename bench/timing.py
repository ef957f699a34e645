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


def interleaved_seconds(
    functions: dict[str, Callable[[], object]],
    budget: float,
    rounds: int = 20,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, float]:
    """Seconds per call of each function, timed in turns: every round times a short burst
    of calls of each, and each function's fastest burst (its mean per call) is reported.

    Taking turns puts every function through the same spells of noise, and noise only
    ever adds time, so the fastest bursts' ratios hold on a shared machine. A burst's mean
    keeps what recurs in sustained work (allocation, garbage collection), which a single
    fastest call would leave out. ``clock`` may be ``time.thread_time`` for
    single-threaded work, which leaves out the time the thread waited for a core.
    """
    calls = {}
    for name, function in functions.items():
        function()  # warm caches, allocate
        started = clock()
        function()
        once = max(clock() - started, 1e-6)
        calls[name] = max(1, int(budget / rounds / len(functions) / once))
    best = dict.fromkeys(functions, float("inf"))
    for _ in range(rounds):
        for name, function in functions.items():
            started = clock()
            for _ in range(calls[name]):
                function()
            best[name] = min(best[name], (clock() - started) / calls[name])
    return best


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
