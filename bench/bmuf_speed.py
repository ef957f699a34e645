"""Does parallel pay on one 2-core machine? bmuf against ``snet train``, time to accuracy.

The target is the CV accuracy ``snet train`` (the default job, one BLAS thread) reaches
after its 10 epochs. Each repeat runs, in alternating order so that a busy spell of
other processes falls on both alike:

- ``snet train`` with one BLAS thread;
- ``snet demo --mode bmuf --workers 2`` (the default job, bunch 128 per worker, blocks
  of ``--block-bunches``, filter ``--block-filter``), one BLAS thread per process;

and takes the wall time from launching the command to the first epoch line whose CV
accuracy is at or above the target (start-up included). It reports the median ratio
train / bmuf, the bytes per epoch on the wire (the server's compression ledger) of bmuf
against a per-bunch ``snet demo --mode sync`` run, and, with ``--link``, the time to the
same accuracy when the server and each worker sit in network namespaces joined by a
``--link`` (default 100 Mbit/s) tbf-shaped bridge (bench/netns.py; needs root) for bmuf,
sync and async::

    .venv/bin/python -m bench.bmuf_speed --repeats 5 --json /tmp/speed.json
    sudo .venv/bin/python -m bench.bmuf_speed --repeats 0 --link 100mbit --json /tmp/link.json
"""

from __future__ import annotations

import argparse
import json
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from snet.cli.runtime import blas_thread_env
from snet.transport.cpu_time import tree_cpu_seconds

from .arguments import emit, output_path
from .netns import SlowNetwork
from .nsrun import train as train_in_namespaces

EPOCH_LINE = re.compile(r"^epoch\s+(\d+)\b.*CV\s+([0-9.]+)%")


def timed_epochs(
    args: list[str], env: dict[str, str] | None = None, cpu: list[float] | None = None
) -> tuple[list[tuple[float, float]], str]:
    """Run ``snet ARGS`` with one BLAS thread (and ``env`` on top); (seconds from launch,
    CV) of each epoch line as it is printed, and the whole output. ``cpu``, if given,
    gets the CPU seconds of the command's processes up to each epoch line
    (transport/cpu_time.py), and their total at the end as its last entry."""
    launched = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "snet.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**blas_thread_env(1), **(env or {})},
        text=True,
    )
    assert process.stdout is not None
    epochs, lines = [], []
    for line in process.stdout:
        lines.append(line)
        if match := EPOCH_LINE.match(line):
            epochs.append((time.monotonic() - launched, float(match.group(2)) / 100))
            if cpu is not None:
                cpu.append(tree_cpu_seconds(process.pid) or 0.0)
    if cpu is not None:  # the command's whole CPU: its processes have all been reaped
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
    if process.wait() != 0:
        raise RuntimeError(f"snet {' '.join(args)} failed:\n{''.join(lines)[-2000:]}")
    if cpu is not None:
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return epochs, "".join(lines)


def first_at(epochs: list[tuple[float, float]], target: float) -> float | None:
    return next((seconds for seconds, cv in epochs if cv >= target - 1e-9), None)


def wire_bytes(status: dict[str, Any]) -> dict[str, Any]:
    """Bytes on the wire per epoch, both ways, from a final /status."""
    ledger = status["compression"]
    epochs = max(len(status["epochs"]), 1)
    return {
        "received_bytes_per_epoch": round(ledger["received_bytes"] / epochs),
        "sent_bytes_per_epoch": round(ledger["sent_bytes"] / epochs),
        "updates_per_epoch": round(ledger["updates"] / epochs, 1),
    }


def demo(mode_flags: list[str], workdir: Path) -> tuple[list[tuple[float, float]], dict]:
    """``snet demo --workers 2`` with ``mode_flags``; its epochs and its final status."""
    out = Path(tempfile.mkdtemp(prefix="demo-", dir=workdir))
    epochs, _ = timed_epochs(["demo", "--workers", "2", "--out-dir", str(out), *mode_flags])
    return epochs, json.loads((out / "status.json").read_text())


def local(repeats: int, bmuf_flags: list[str], workdir: Path) -> dict[str, Any]:
    """The interleaved ``snet train`` / bmuf demo runs and the bytes against sync."""
    runs: list[dict[str, Any]] = []
    target: float | None = None
    for repeat in range(repeats):
        pair: dict[str, Any] = {}
        order = ("train", "bmuf") if repeat % 2 == 0 else ("bmuf", "train")
        for which in order:
            if which == "train":
                out = tempfile.mkdtemp(prefix="train-", dir=workdir)
                epochs, _ = timed_epochs(["train", "--out-dir", out])
                target = epochs[-1][1] if target is None else target
                pair["train_final"] = epochs[-1][1]
            else:
                epochs, status = demo(bmuf_flags, workdir)
                pair["bmuf_final"] = epochs[-1][1]
                pair["bmuf_bytes"] = wire_bytes(status)
            pair[which] = epochs
        assert target is not None
        pair["train_seconds"] = first_at(pair["train"], target)
        pair["bmuf_seconds"] = first_at(pair["bmuf"], target)
        if pair["train_seconds"] and pair["bmuf_seconds"]:
            pair["ratio"] = round(pair["train_seconds"] / pair["bmuf_seconds"], 3)
        runs.append(pair)
        print(
            f"speed: repeat {repeat + 1}/{repeats}: train {pair['train_seconds']} s, bmuf "
            f"{pair['bmuf_seconds']} s (final {pair['bmuf_final']:.4f}, target {target:.4f})",
            file=sys.stderr,
            flush=True,
        )
    ratios = [r["ratio"] for r in runs if "ratio" in r]
    _, sync_status = demo(["--mode", "sync"], workdir)
    return {
        "target_cv": target,
        "runs": runs,
        "ratios": ratios,
        "median_ratio": statistics.median(ratios) if ratios else None,
        "reached": f"{len(ratios)}/{len(runs)}",
        "bytes_bmuf": runs[0]["bmuf_bytes"] if runs else None,
        "bytes_sync": wire_bytes(sync_status),
    }


def over_link(
    rate: str,
    target: float,
    bmuf_flags: list[str],
    workdir: Path,
    timeout: float,
    names: tuple[str, ...] = ("bmuf", "sync", "async"),
) -> dict[str, Any]:
    """Time to ``target`` with the server and 2 workers on shaped links, per mode."""
    results: dict[str, Any] = {}
    modes = {"bmuf": bmuf_flags, "sync": ["--mode", "sync"], "async": ["--mode", "async"]}
    with SlowNetwork(2, rate) as network:
        for name in names:
            flags = modes[name]
            run = train_in_namespaces(
                workdir / f"link-{name}",
                [*flags, "--bunch-size", "64"],  # the global 128 divided, as the demo does
                2,
                network=network,
                stop_after=timeout,
            )
            reached = run.time_to(target)
            results[name] = {
                "seconds_to_target": None if reached is None else round(reached, 1),
                "cv": run.cv(),
                "seconds_run": round(run.readings[-1]["t"] - run.launched, 1)
                if run.readings
                else None,
                "compression": run.readings[-1].get("compression") if run.readings else None,
            }
            print(f"speed over {rate}: {name}: {results[name]}", file=sys.stderr, flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.bmuf_speed", description=__doc__)
    parser.add_argument("--repeats", type=int, default=5, help="interleaved pairs of runs")
    parser.add_argument("--block-bunches", dest="block_bunches", default="16")
    parser.add_argument("--block-filter", dest="block_filter", default="cbm")
    parser.add_argument("--link", help="also over this tbf rate, e.g. 100mbit (root)")
    parser.add_argument("--target", type=float, help="CV target (default: snet train's)")
    parser.add_argument("--link-timeout", dest="link_timeout", type=float, default=600.0)
    parser.add_argument(
        "--link-modes", dest="link_modes", default="bmuf,sync,async", help="over --link"
    )
    parser.add_argument("--json", type=output_path, help="write the result here too")
    args = parser.parse_args(argv)
    bmuf = ["--mode", "bmuf", "--block-bunches", args.block_bunches,
            "--block-filter", args.block_filter]  # fmt: skip
    result: dict[str, Any] = {"bmuf_flags": bmuf}
    with tempfile.TemporaryDirectory(prefix="snet-bmuf-speed-") as tmp:
        workdir = Path(tmp)
        if args.repeats:
            result["local"] = local(args.repeats, bmuf, workdir)
        target = args.target or (result.get("local") or {}).get("target_cv")
        if args.link:
            if target is None:
                epochs, _ = timed_epochs(["train", "--out-dir", str(workdir / "target")])
                target = epochs[-1][1]
            result["target_cv"] = target
            result["link"] = {
                "rate": args.link,
                **over_link(
                    args.link,
                    target,
                    bmuf,
                    workdir,
                    args.link_timeout,
                    tuple(args.link_modes.split(",")),
                ),
            }
    emit(json.dumps(result, indent=1), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
