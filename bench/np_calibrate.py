"""np mode's own constants, measured on np's own path (``measure_np_rounds``).

The pattern-parallel constants (bench/calibrate.py) come from synchronous rounds of
compute-free modelled workers: one large update and one large copy of the weights per
worker and round, the compute inline on the worker's event loop, no data read. An np
round is something else: every worker receives the bunch's frame indices and the last
error, reads the bunch's windows from its own copy of the data, runs its slice (a dozen
numpy calls, whatever its size), and answers a small message; the server adds the
answers, applies the softmax, records the bunch and sends the next one to every worker.
Measured in np_vs_pp's first runs, those rounds cost two to three times what the
pattern-parallel constants charged (docs/network-parallel.md, "Where an np round's time
goes").

So they are measured the same way, on np's path: real ``snet worker`` processes (numpy
backend) train ``input:4:output`` (four hidden units: the messages of the real network,
next to no compute) in ``--mode np`` with 1 and with ``MORE_WORKERS`` workers, and the
server's CPU time per bunch, the workers' reported compute and the wall time are read:

- ``np_worker_seconds`` (T_d): the growth of the server's CPU time per bunch with each
  further worker, less the messages' bytes at the link's rate;
- ``np_bunch_seconds`` (T_h): the rest of the server's CPU time per bunch at one worker;
- ``np_pattern_seconds``: the worker's reported compute per pattern beyond its four
  units' connection updates (its window, the calls' fixed costs);
- ``np_latency_seconds`` (L): the rest of a one-worker bunch's wall time (its messages'
  other ends, the wake-ups), less the bytes at the worker's rate.

Part of an np bunch's cost grows with the network, not with the bunch's messages: every
``COLLECT_EVERY`` bunches each worker reports its slice (weights and momentum) and the
server assembles and digests the element; at every epoch's end the slices are cut anew;
the server scores each epoch's CV itself, the whole network, while the workers train. So
a third run, one worker on ``input:WIDE_UNITS:output`` (a network of no table point),
gives the growth of the server's CPU time per bunch and of the rest per byte of the
element (``np_bunch_seconds_per_byte``, ``np_latency_seconds_per_byte``).

CPU time is what a busy machine does not inflate; only the latency is read off a clock.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

from snet.cli.runtime import blas_thread_env
from snet.perf.model import INDEX_BYTES, WORD_BYTES, Constants
from snet.protocol.network import NetworkSpec

from .processes import LocalCluster, cpu_seconds, job_flags, synthetic_corpus

MEASURE_SECONDS = 3.0
MORE_WORKERS = 4
UNITS = 4  # hidden units of the calibration network: one for each of MORE_WORKERS
WIDE_UNITS = 2048  # the third run's: an element of 3.2 MB
WARMUP_BUNCHES = 100


@dataclass(frozen=True)
class NpRound:
    """Seconds per bunch of one np calibration run."""

    wall: float
    server: float  # the server's CPU time
    compute: float  # a worker's reported compute (update and forward pass), the mean


def _np_round(directory: Path, spec: NetworkSpec, bunch: int, workers: int,
              corpus: tuple[Path, int]) -> NpRound:  # fmt: skip
    flags = job_flags("np", spec, bunch, *corpus)
    flags += ["--min-workers", str(workers), "--learning-rates", "0.01"]
    with LocalCluster(directory, blas_thread_env(1)) as cluster:
        server = cluster.server(flags)
        for index in range(workers):
            cluster.worker(server, f"w{index}", ["--backend", "numpy"])
        cluster.wait_for(
            lambda: server.status()["patterns_processed"] >= WARMUP_BUNCHES * bunch,
            120, "the first np bunches",
        )  # fmt: skip
        first, cpu_first, started = server.status(), cpu_seconds([server.process]), time.monotonic()
        time.sleep(MEASURE_SECONDS)
        last, cpu_last, ended = server.status(), cpu_seconds([server.process]), time.monotonic()
    bunches = (last["patterns_processed"] - first["patterns_processed"]) / bunch
    if bunches <= 0 or cpu_first is None or cpu_last is None:
        raise RuntimeError(f"np calibration: {workers} worker(s) trained no bunch, or no /proc")
    before = {row["name"]: row for row in first["workers"]}
    compute = [
        spec.connections * bunch / row["mcups"] / 1e6
        for row in last["workers"]
        if row["mcups"] > 0 and row["name"] in before
    ]
    return NpRound((ended - started) / bunches, (cpu_last - cpu_first) / bunches,
                   statistics.mean(compute) if compute else 0.0)  # fmt: skip


def measure_np_rounds(network: NetworkSpec, bunch: int, constants: Constants) -> Constants:
    """``constants`` with np's own (``np_*``) measured for ``network``'s input and output
    sizes at ``bunch`` (about 30 s: three short np runs)."""
    spec = NetworkSpec((network.sizes[0], UNITS, network.sizes[-1]), network.activations)
    wide = NetworkSpec((network.sizes[0], WIDE_UNITS, network.sizes[-1]), network.activations)
    with tempfile.TemporaryDirectory(prefix="snet-np-calibrate-") as tmp:
        root = Path(tmp)
        corpus = synthetic_corpus(root / "corpus.npz", spec, 500_000)
        one = _np_round(root / "1", spec, bunch, 1, corpus)
        more = _np_round(root / str(MORE_WORKERS), spec, bunch, MORE_WORKERS, corpus)
        big = _np_round(root / "wide", wide, bunch, 1, corpus)
    size = 2 * bunch * network.sizes[-1] * WORD_BYTES + bunch * INDEX_BYTES  # both ways
    per_worker = (more.server - one.server) / (MORE_WORKERS - 1)
    updates = spec.connections * bunch * constants.cu_seconds
    grown = (wide.connections - spec.connections) * WORD_BYTES
    rest = [r.wall - r.server - r.compute for r in (one, big)]
    return replace(
        constants,
        np_worker_seconds=max(per_worker - size * constants.link_seconds_per_byte, 1e-9),
        np_bunch_seconds=max(one.server - per_worker, 0.0),
        np_bunch_seconds_per_byte=max(big.server - one.server, 0.0) / grown,
        np_pattern_seconds=max(one.compute - updates, 0.0) / bunch,
        np_latency_seconds=max(rest[0] - size * constants.worker_seconds_per_byte, 0.0),
        np_latency_seconds_per_byte=max(rest[1] - rest[0], 0.0) / grown,
    )
