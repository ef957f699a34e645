"""Time to accuracy: ``snet train`` against the 2-worker demo in sync, async and bmuf.

Each repeat runs, in an order rotated from one repeat to the next (so that a busy spell of
the machine's other users falls on each alike), with one BLAS thread per process:

- ``snet train`` (the default job, sequential, in one process);
- ``snet demo --workers 2 --mode M`` for M in sync, async and bmuf (the default job, its
  global bunch of 128 divided among the workers; bmuf with its defaults), and with
  ``--modes`` also ``bmuf-overlap`` (bmuf with ``--block-overlap true``),

and times, from launching the command, the first epoch line (the first epoch's end, CV
included) and the first line whose CV accuracy is at least ``--target`` (start-up
included). Figures are ratios to ``snet train`` of the same repeat: ``speed`` =
train's seconds to the target / the demo's (above 1: the demo is faster), ``first epoch``
= the demo's first epoch / train's. Medians over the repeats are reported, and each
repeat's speed (``speed_ratios``), since a median at 1.0 hides how often a run is slower.

``--vary-seed`` runs repeat ``r`` (from 0) of every command at job seed ``1 + r`` (the
weights' and the frame order's), paired: the same seed for ``snet train`` and the demos of
a repeat. Without it every repeat is the default job (seed 1), whose ``snet train`` is one
fixed run: at seed 1 it reaches 90 % CV in its fifth epoch, at seeds 2-8 in its third to
fifth (the fourth at the median), so the default job's ratio says how the demo does
against that one run, and the seeds' how it does against ``snet train`` in general.

``--baseline DIR`` adds the demo modes of a checkout of earlier code (its processes import
``snet`` from ``DIR/src``) to each repeat's rotation, as ``baseline:MODE``, against the same
``snet train`` runs::

    .venv/bin/python -m bench.time_to_accuracy --repeats 3 --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

import snet

from .arguments import checkout, compiled, emit, output_path, positive_int
from .bmuf_speed import first_at, timed_epochs

TARGET_CV = 0.90  # every mode reaches it within the default job's 10 epochs
MODES = ("sync", "async", "bmuf")
KNOWN_MODES = (*MODES, "np", "bmuf-overlap")  # bmuf-overlap: bmuf with --block-overlap true


def _run(
    which: str, workdir: Path, baseline: Path | None, seed: int | None
) -> tuple[list[tuple[float, float]], list[float]]:
    """``which``: train, a mode, or baseline:MODE (the demo of the ``baseline`` code);
    ``seed``: the job's seed, or None for the default job's."""
    out = tempfile.mkdtemp(prefix=f"{which.replace(':', '-')}-", dir=workdir)
    env = None
    if which.startswith("baseline:"):
        assert baseline is not None
        rest = os.environ.get("PYTHONPATH")
        env = {"PYTHONPATH": os.pathsep.join(filter(None, (str(baseline / "src"), rest)))}
    if which == "train":
        args = ["train", "--out-dir", out]
    else:  # bmuf-overlap: bmuf with --block-overlap true
        mode = which.split(":")[-1].removesuffix("-overlap")
        args = ["demo", "--workers", "2", "--mode", mode, "--out-dir", out]
        if which.endswith("-overlap"):
            args += ["--block-overlap", "true"]
    if seed is not None:
        args += ["--seed", str(seed)]
    cpu: list[float] = []
    epochs, _ = timed_epochs(args, env, cpu)
    return epochs, cpu


def _rounded(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def run_accuracy_bench(
    repeats: int = 3,
    target: float = TARGET_CV,
    modes: tuple[str, ...] = MODES,
    baseline: Path | None = None,
    vary_seed: bool = False,
) -> dict[str, Any]:
    """Per mode, the median ratios to ``snet train`` (see the module's notes)."""
    compiled(Path(snet.__file__).parent)  # as the baseline is (bench/arguments.py)
    if baseline is not None:
        modes = (*modes, *(f"baseline:{mode}" for mode in modes))
    names = ("train", *modes)
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="snet-accuracy-") as tmp:
        for repeat in range(repeats):
            order = names[repeat % len(names) :] + names[: repeat % len(names)]
            seed = 1 + repeat if vary_seed else None
            run: dict[str, Any] = {}
            for which in order:
                epochs, cpu = _run(which, Path(tmp), baseline, seed)
                hit = next((i for i, (_, cv) in enumerate(epochs) if cv >= target - 1e-9), None)
                run[which] = {
                    "first_epoch_s": round(epochs[0][0], 3) if epochs else None,
                    "to_target_s": _rounded(first_at(epochs, target), 3),
                    "final_cv": _rounded(epochs[-1][1], 4) if epochs else None,
                    "epochs_to_target": None if hit is None else hit + 1,
                    "cpu_first_epoch_s": round(cpu[0], 3) if epochs else None,
                    "cpu_to_target_s": None if hit is None else round(cpu[hit], 3),
                    "cpu_whole_run_s": round(cpu[-1], 3),
                }
            runs.append(run)
            print(f"  time to accuracy, repeat {repeat + 1}/{repeats}: {run}", flush=True)
    seeds = [1 + repeat for repeat in range(repeats)] if vary_seed else None
    result: dict[str, Any] = {"target_cv": target, "repeats": repeats, "seeds": seeds, "runs": runs}
    train = [r["train"] for r in runs]
    result["train_to_target_s"] = _median([t["to_target_s"] for t in train if t["to_target_s"]])
    result["train_first_epoch_s"] = _median([t["first_epoch_s"] for t in train])
    for key in ("cpu_first_epoch_s", "cpu_to_target_s", "cpu_whole_run_s"):
        result[f"train_{key}"] = _median([t[key] for t in train if t[key]])
    result["modes"] = {}
    for mode in modes:
        speed = [
            r["train"]["to_target_s"] / r[mode]["to_target_s"]
            for r in runs
            if r["train"]["to_target_s"] and r[mode]["to_target_s"]
        ]
        first = [
            r[mode]["first_epoch_s"] / r["train"]["first_epoch_s"]
            for r in runs
            if r[mode]["first_epoch_s"] and r["train"]["first_epoch_s"]
        ]
        reached = [r[mode]["to_target_s"] for r in runs if r[mode]["to_target_s"]]
        # What 2 idle cores would allow at most: train's CPU over half the demo's.
        bound = [
            r["train"]["cpu_to_target_s"] / (r[mode]["cpu_to_target_s"] / 2)
            for r in runs
            if r["train"]["cpu_to_target_s"] and r[mode]["cpu_to_target_s"]
        ]
        result["modes"][mode] = {
            "to_target_s": _median(reached),
            "speed_ratio": _median(speed),
            "speed_ratios": sorted(round(ratio, 3) for ratio in speed),  # the spread of pairs
            "first_epoch_ratio": _median(first),
            "reached": f"{len(speed)}/{len(runs)}",
            "epochs_to_target": _median(
                [r[mode]["epochs_to_target"] for r in runs if r[mode]["epochs_to_target"]]
            ),
            "cpu_first_epoch_s": _median([r[mode]["cpu_first_epoch_s"] for r in runs]),
            "cpu_to_target_s": _median(
                [r[mode]["cpu_to_target_s"] for r in runs if r[mode]["cpu_to_target_s"]]
            ),
            "cpu_whole_run_s": _median([r[mode]["cpu_whole_run_s"] for r in runs]),
            "cpu_bound_speed_ratio": _median(bound),
        }
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.time_to_accuracy", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--repeats", type=positive_int, default=3, help="rotations (default 3)")
    parser.add_argument("--target", type=float, default=TARGET_CV, help="CV accuracy, 0-1")
    said = f"of {', '.join(KNOWN_MODES)} (default {','.join(MODES)})"
    parser.add_argument("--modes", default=",".join(MODES), help=said)
    parser.add_argument(
        "--vary-seed", action="store_true", help="repeat r at job seed 1 + r (default: seed 1)"
    )
    parser.add_argument("--baseline", type=checkout, help="a checkout of earlier code to run too")
    parser.add_argument("--json", type=output_path, help="write the result here too")
    args = parser.parse_args(argv)
    modes = tuple(args.modes.split(","))
    unknown = [mode for mode in modes if mode not in KNOWN_MODES]
    if unknown or len(set(modes)) != len(modes):
        parser.error(f"--modes {args.modes!r}: each of {', '.join(KNOWN_MODES)} at most once")
    if not 0 < args.target <= 1:
        parser.error(f"--target {args.target:g}: a CV accuracy above 0, at most 1")
    result = run_accuracy_bench(args.repeats, args.target, modes, args.baseline, args.vary_seed)
    emit(json.dumps(result, indent=1), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
