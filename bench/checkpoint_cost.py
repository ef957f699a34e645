"""What checkpoints cost the training rate, and what a checkpoint and a digest cost.

    python -m bench.checkpoint_cost [--repeats 2] [--workers 3]

1. The default job, fault-free, with checkpoints at epoch ends only, every 60 s (the
   default: for this job that is the same), every 10 steps, and after every step (taken
   whenever the writer is free): steps per second of training and the server's own
   figures (checkpoints written, seconds on the event loop taking them, seconds in the
   writer thread). Settings alternate, ``--repeats`` times each, since the machine is shared.
2. In this process, for the default network and for a 2 MB element (351:1262:45): the
   time to take a checkpoint's copies, to encode it, to write it crash-consistently, and
   the digest (CRC-32) against blake2b.

Prints JSON (and writes it with ``--json``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.arguments import emit, output_path
from bench.chaos import JobRun
from snet.protocol.digest import weights_digest
from snet.protocol.network import NetworkSpec, initial_weights
from snet.server.checkpoint import CheckpointStore, encode_checkpoint

SETTINGS = {
    "epoch ends only": ["--checkpoint-seconds", "1000000"],
    "every 10 steps": ["--checkpoint-steps", "10"],
    "every step": ["--checkpoint-steps", "1"],
}
RUN_SECONDS = 600.0


def training_rate(directory: Path, flags: list[str], workers: int) -> dict[str, Any]:
    run = JobRun(directory, flags, workers)
    try:
        run.start_server()
        run.start_workers()
        assert run.server is not None
        run.server.wait(RUN_SECONDS)
    finally:
        run.close()
    status = run.status()
    seconds = sum(e["seconds"] for e in status["epochs"])  # from the first lease to the end
    figures = status["checkpoints"]
    written = max(figures["written"], 1)
    return {
        "steps_per_second": round(status["weight_version"] / seconds, 1),
        "checkpoints": figures["written"],
        "take_ms_each": round(1000 * figures["take_seconds_total"] / written, 3),
        "write_ms_each": round(1000 * figures["write_seconds_total"] / written, 2),
        "bytes": figures["last"].get("bytes"),
    }


def _best(seconds: list[float]) -> float:
    return round(1000 * min(seconds), 3)


def _timed(action: Any, repeats: int = 20) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return _best(times)


def element_costs(sizes: tuple[int, ...], directory: Path) -> dict[str, Any]:
    """Per checkpoint and per digest, in milliseconds, for one network."""
    spec = NetworkSpec(sizes, ("sigmoid",) * (len(sizes) - 2))
    weights = initial_weights(spec, 1)
    velocity = np.zeros_like(weights)
    uses = np.zeros(54_000, np.uint16)
    state = {"weights": weights, "velocity": velocity.copy(), "best": weights,
             "ledger": uses}  # fmt: skip
    store = CheckpointStore(directory / "-".join(map(str, sizes)), keep=2)
    return {
        "network": ":".join(map(str, sizes)),
        "element_bytes": weights.nbytes,
        "take_ms (velocity and ledger copies)": _timed(lambda: (velocity.copy(), uses.copy())),
        "encode_ms": _timed(lambda: encode_checkpoint(state)),
        "write_ms (encode, fsync, rename, fsync dir)": _timed(lambda: store.write(state), 5),
        "digest_crc32_ms": _timed(lambda: weights_digest(weights), 50),
        "digest_blake2b_ms": _timed(lambda: hashlib.blake2b(weights.data, digest_size=8), 50),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--json", type=output_path, help="also write the result here")
    args = parser.parse_args(argv)
    rates: dict[str, list[dict[str, Any]]] = {name: [] for name in SETTINGS}
    with tempfile.TemporaryDirectory(prefix="snet-ckpt-cost-") as scratch:
        root = Path(scratch)
        for repeat in range(args.repeats):
            for index, (name, flags) in enumerate(SETTINGS.items()):
                directory = root / f"{repeat}-{index}"
                rates[name].append(training_rate(directory, flags, args.workers))
        elements = [element_costs(sizes, root) for sizes in ((117, 512, 10), (351, 1262, 45))]
    result = {"training": rates, "per_checkpoint": elements}
    emit(json.dumps(result, indent=1), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
