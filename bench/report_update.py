"""``snet bench``'s ``update`` and ``accuracy`` sections as Markdown (bench/report.py calls
these): what an update costs on each side beside its bunch's compute, and time to
accuracy against ``snet train``, with issue 19's and issue 15's targets."""

from __future__ import annotations

from typing import Any

UPDATE_COLUMNS = [
    ("element", "element"),
    ("code", "code"),
    ("network", "network"),
    ("updates_per_s", "updates/s"),
    ("worker_compute_ms", "worker compute CPU ms"),
    ("worker_loop_ms", "worker event loop CPU ms"),
    ("server_loop_ms", "server event loop CPU ms"),
    ("server_step_ms", "server step thread CPU ms"),
    ("overhead_over_compute", "overhead/compute"),
    ("latency_ms", "send to new weights ms"),
]

ACCURACY_HEADER = [
    "| mode | seconds to target | train / demo (speed) | speed per repeat (at 1.0 or more) "
    "| first epoch demo / train | reached | epochs to target | CPU s: first epoch "
    "| CPU s: to target | CPU s: whole run | 2-core bound |",
    "|---|---|---|---|---|---|---|---|---|---|---|",
]


def accuracy_targets(results: dict[str, Any]) -> list[list[Any]]:
    """Rows for the targets table: (label, measured, goal, met)."""
    accuracy = results.get("accuracy") or {}
    modes = accuracy.get("modes") or {}
    rows: list[list[Any]] = []
    if "async" in modes:
        speed = modes["async"]["speed_ratio"]
        label = "async, 2 workers: time to CV target, snet train / demo"
        rows.append([label, speed, ">= 1.0", speed is not None and speed >= 1.0])
    for mode in ("async", "sync", "bmuf"):  # this code's: baseline:MODE rows are not targets
        if mode in modes:
            first = modes[mode]["first_epoch_ratio"]
            label = f"{mode}, 2 workers: first epoch's end, demo / snet train"
            rows.append([label, first, "<= 1.5", first is not None and first <= 1.5])
    if "bmuf" in modes:  # issue 15
        speed = modes["bmuf"]["speed_ratio"]
        label = "bmuf, 2 workers: time to CV target, snet train / demo"
        rows.append([label, speed, ">= 1.5", speed is not None and speed >= 1.5])
    seeds = accuracy.get("across_seeds") or {}
    for mode, goal in (("async", 1.0), ("bmuf", 1.5)):  # the same goals, at other seeds
        if mode in (seeds.get("modes") or {}):
            speed = seeds["modes"][mode]["speed_ratio"]
            label = f"{mode}, 2 workers, {_seeds(seeds)}: time to CV target, snet train / demo"
            rows.append([label, speed, f">= {goal}", speed is not None and speed >= goal])
    return rows


def _seeds(result: dict[str, Any]) -> str:
    seeds = result.get("seeds") or [1]
    return f"seeds {seeds[0]}-{seeds[-1]}" if len(seeds) > 1 else f"seed {seeds[0]}"


def update_section(rows: list[dict[str, Any]], rerun: str) -> list[str]:
    """The per-update cost table (bench/update_cost.py)."""
    lines = [
        "## Per-update cost",
        "",
        f"{rerun}"
        "A real server and 2 async workers (bunch 64 each, one BLAS thread) train for a few "
        "seconds after a warm-up; each process's CPU time is read per thread from /proc and "
        "divided by the updates of that window (bench/update_cost.py). The worker's compute "
        "thread is the bunch's arithmetic; its event loop encodes and sends the update and "
        "receives and takes over the new weights; the server's event loop receives, checks "
        "and queues each update and sends every worker the new weights after each step; "
        "its step thread checks each update's norm, steps and digests the weights. "
        "`overhead/compute` is the three CPU costs of moving an update over the compute's; "
        "`send to new weights` the median time from a worker's send of an update to the "
        "first bunch it starts on weights that include it (the worker's own clock). Rows "
        "of code `baseline` were measured on an earlier checkout (`--baseline`) just "
        "before the row of `this` code below them.",
        "",
        "| " + " | ".join(title for _, title in UPDATE_COLUMNS) + " |",
        "|" + "---|" * len(UPDATE_COLUMNS),
    ]
    for row in rows:
        cells = ["-" if row.get(key) is None else str(row[key]) for key, _ in UPDATE_COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return [*lines, ""]


def accuracy_section(result: dict[str, Any], rerun: str) -> list[str]:
    """The time-to-accuracy table (bench/time_to_accuracy.py)."""
    target = result.get("target_cv")
    lines = [
        "## Time to accuracy",
        "",
        f"{rerun}"
        f"Seconds from launching the command to the first epoch whose CV frame accuracy is "
        f"at least {100 * (target or 0):.0f}% (start-up included), and to the first epoch's "
        f"end, for `snet train` (one BLAS thread) and `snet demo --workers 2` in each mode, "
        f"in rotated order, {result.get('repeats')} repeat(s); ratios are to `snet train` "
        f"of the same repeat, medians. `snet train` took "
        f"{result.get('train_to_target_s')} s to the target and "
        f"{result.get('train_first_epoch_s')} s to its first epoch's end (medians). On a "
        "machine that other people's work keeps busy, 3 processes get a larger share of "
        "the cores than 1, which flatters the demo. Rows `baseline:MODE` are the demo of "
        "an earlier checkout (`--baseline`), run in the same rotation. The CPU columns are "
        "the CPU seconds of all the command's processes (transport/cpu_time.py), which the "
        "load swings much less: to the first epoch's end, to the target and for the whole "
        "run; `2-core bound` is `snet train`'s CPU to the target over half the demo's, the "
        "most two idle cores could give the demo if it kept both busy (`snet train` "
        f"needed {result.get('train_cpu_first_epoch_s')}, "
        f"{result.get('train_cpu_to_target_s')} and {result.get('train_cpu_whole_run_s')} "
        "CPU seconds).",
        "",
        *ACCURACY_HEADER,
        *_accuracy_rows(result),
    ]
    seeds = result.get("across_seeds")
    if seeds:
        lines += [
            "",
            "**At other seeds.** Every repeat above is the default job (seed 1), whose "
            "`snet train` is one fixed run. Repeat r below runs `snet train` and the demos "
            "at job seed r (`--seed`, the weights' and the frame order's), paired, "
            f"{_seeds(seeds)}: how the demo does against `snet train` in general, not "
            "against one run of it (`snet train` took "
            f"{seeds.get('train_to_target_s')} s to the target at the median, and "
            f"{_train_epochs(seeds)} epochs to it, seed by seed).",
            "",
            *ACCURACY_HEADER,
            *_accuracy_rows(seeds),
        ]
    lines += ["", "Runs on other machines, with notes: docs/time-to-accuracy.md."]
    return [*lines, ""]


def _train_epochs(result: dict[str, Any]) -> str:
    """``snet train``'s epochs to the target in each repeat, "-" where it missed it."""
    runs = result.get("runs") or []
    return ", ".join(str(run["train"].get("epochs_to_target") or "-") for run in runs)


def _accuracy_rows(result: dict[str, Any]) -> list[str]:
    """A table row per mode of one time-to-accuracy result."""
    keys = ("first_epoch_ratio", "reached", "epochs_to_target", "cpu_first_epoch_s",
            "cpu_to_target_s", "cpu_whole_run_s", "cpu_bound_speed_ratio")  # fmt: skip
    rows = []
    for mode, row in (result.get("modes") or {}).items():
        spread = _spread(row.get("speed_ratios"))
        cells = [mode, row.get("to_target_s"), row.get("speed_ratio"), spread]
        cells += [row.get(key) for key in keys]
        rows.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return rows


def _spread(ratios: list[float] | None) -> str | None:
    """The repeats' speeds as ``lowest-highest (k/n)``, k of them at 1.0 or more: a median
    at 1.0 says nothing of how often a run is slower (None for results without them)."""
    if not ratios:
        return None
    at_least = sum(ratio >= 1.0 for ratio in ratios)
    return f"{min(ratios)}-{max(ratios)} ({at_least}/{len(ratios)})"
