"""Replay a server's step trace in one process, with any update codec, and watch it.

An asynchronous run is not reproducible: which worker's update lands in which step, and
on which stale version it was computed, changes from run to run. The server's trace
(``snet server --trace-file``) records exactly that: per step the learning rate and, per
update, the worker, the version it was computed on and its frames. Replaying it here
recomputes every update on the weights of its base version, passes it through the
worker's codec with error feedback (one ``UpdateCompressor`` per worker, as the workers
keep) and applies the steps with the server's ``UpdateRule``: the same run, made
deterministic, which can then be replayed with another codec or compressor setting on
the very same schedule. (``none`` on a ``none`` trace reproduces the run's CV accuracy to
float rounding.)

::

    python -m bench.replay TRACE --codec topk:0.01 [--epochs N] [--watch STEPS]

``--watch`` prints, for each of the first STEPS steps, the applied step's norm per layer
array, the staleness, the hidden biases' median magnitude, the share of saturated hidden
units on a fixed sample of training frames, and the largest worker residual per array.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from snet.client.compression import UpdateCompressor
from snet.client.kernel_choice import job_kernels
from snet.client.network import BunchNetwork
from snet.data.corpus import Corpus, load_corpus
from snet.protocol.job import JobSpec
from snet.protocol.network import ElementLayout, initial_weights
from snet.server.update_rule import UpdateRule

KEEP_VERSIONS = 64  # versions kept for stale updates (async staleness is a few)
SATURATED = 4.0  # |pre-activation| beyond which a sigmoid unit's slope is < 0.018
SAMPLE_FRAMES = 1024


def read_trace(path: Path) -> Iterator[dict[str, Any]]:
    """The trace's step records, in order (not its other records, e.g. policy changes).
    Where a restarted server resumed from a checkpoint (a ``resumed`` record), the steps
    the killed one published after that version are left out: the weights do not descend
    from them."""
    steps: list[dict[str, Any]] = []
    with path.open(encoding="utf-8") as handle:
        for line in handle:
            if not line.strip():
                continue
            record = json.loads(line)
            if "resumed" in record:
                while steps and steps[-1]["version"] > record["resumed"]:
                    steps.pop()
            elif "updates" in record:
                steps.append(record)
    yield from steps


@dataclass
class Probe:
    """Figures of a set of weights on a fixed sample of training frames."""

    corpus: Corpus
    layout: ElementLayout
    sample: np.ndarray

    def hidden(self, weights: np.ndarray) -> tuple[float, float]:
        """(median |b0|, share of first-layer hidden units saturated on the sample)."""
        views = self.layout.views(weights)
        z = self.corpus.windows(self.sample) @ views[0] + views[1]
        return float(np.median(np.abs(views[1]))), float(np.mean(np.abs(z) > SATURATED))


class Replay:
    """Steps of a trace replayed with one codec for every worker."""

    def __init__(
        self,
        job: JobSpec,
        codec: str,
        options: dict[str, Any],
        keep_versions: int = KEEP_VERSIONS,
        kernels: str = "auto",
    ) -> None:
        """``keep_versions``: how many of the latest weight versions stay at hand as bases
        of stale updates (a loaded machine can hold a worker back for more than the
        default's 64 versions; a small network can afford to keep them all). ``kernels``:
        the step to recompute the updates with (``BunchNetwork``'s; the run's workers' own
        makes the replay bit for bit)."""
        self.job = job
        self.keep_versions = keep_versions
        spec = job.network
        self.layout = ElementLayout.for_network(spec)
        self.corpus = load_corpus(job.data, spec.output_size, spec.input_size)
        self.rule = UpdateRule(initial_weights(spec, job.seed), job.momentum, lanes=1)
        # the step the run's workers took for this job (client/kernel_choice.py)
        step = job_kernels(kernels, job, len(self.corpus.train_frames))
        self.network = BunchNetwork(spec, 1024, kernels=step)
        self.codec = codec
        self.options = options
        self.history: dict[int, np.ndarray] = {0: self.rule.weights}
        self.compressors: dict[str, UpdateCompressor | None] = {}
        self.version = 0
        self._gradient = self.layout.allocate()
        sample = np.random.default_rng(0).choice(self.corpus.train_frames, SAMPLE_FRAMES)
        self.probe = Probe(self.corpus, self.layout, np.sort(sample))

    def _compressor(self, worker: str) -> UpdateCompressor | None:
        if worker not in self.compressors:
            made = None
            if self.codec != "none":
                made = UpdateCompressor(
                    self.codec, self.layout, momentum=self.job.momentum, **self.options
                )
            self.compressors[worker] = made
        return self.compressors[worker]

    def step(self, record: dict[str, Any]) -> dict[str, Any]:
        """Apply one traced step; figures about it."""
        gradients: list[np.ndarray] = []
        direct: list[np.ndarray] = []
        patterns, stale, norms = 0, 0, []
        for update in record["updates"]:
            frames = np.asarray(update["frames"], dtype=np.int64)
            base = self.history[update["base_version"]]
            x, labels = self.corpus.windows(frames), self.corpus.labels_of(frames)
            self.network.gradient(base, x, labels, self._gradient)
            norms.append(float(np.linalg.norm(self._gradient)) / len(frames))
            compressor = self._compressor(update["worker"])
            if compressor is None:
                gradients.append(self._gradient.copy())
            else:
                compressor.compress(self._gradient, patterns=len(frames))
                target = direct if compressor.velocity is not None else gradients
                target.append(compressor.decoded.copy())
            patterns += len(frames)
            stale = max(stale, self.version - update["base_version"])
        before = self.rule.weights
        after = self.rule.step(gradients, patterns, record["learning_rate"], direct)
        if after is None:
            raise RuntimeError(f"step {self.version + 1} is not finite")
        self.version += 1
        self.history[self.version] = after
        self.history.pop(self.version - self.keep_versions, None)
        moved = [float(np.linalg.norm(v)) for v in self.layout.views(after - before)]
        return {"step": self.version, "updates": len(record["updates"]), "stale": stale,
                "moved": moved, "gradient": max(norms)}  # fmt: skip

    def residuals(self) -> list[float]:
        """The largest worker residual norm per layer array (0 without compression)."""
        largest = [0.0] * len(self.layout.shapes)
        for compressor in self.compressors.values():
            if compressor is not None:
                for i, view in enumerate(self.layout.views(compressor.residual)):
                    largest[i] = max(largest[i], float(np.linalg.norm(view)))
        return largest

    def cv_accuracy(self) -> float:
        frames = self.corpus.cv_frames
        x, labels = self.corpus.windows(frames), self.corpus.labels_of(frames)
        correct = 0
        for start in range(0, len(frames), 1024):
            _, right = self.network.evaluate(
                self.rule.weights, x[start : start + 1024], labels[start : start + 1024]
            )
            correct += right
        return 100.0 * correct / len(frames)


def _floats(values: list[float]) -> str:
    return " ".join(f"{v:8.3f}" for v in values)


def _epoch_done(run: Replay, epoch: int, cvs: list[float]) -> None:
    cvs.append(run.cv_accuracy())
    median, saturated = run.probe.hidden(run.rule.weights)
    print(f"epoch {epoch + 1}: CV {cvs[-1]:.2f}%  |b0| median {median:.2f}  "
          f"saturated {saturated:.3f}", flush=True)  # fmt: skip


def replay(path: Path, codec: str, epochs: int, watch: int, options: dict[str, Any]) -> list[float]:
    """Replay ``path`` with ``codec``; CV accuracy after each replayed epoch."""
    run = Replay(JobSpec(), codec, options)
    cvs: list[float] = []
    epoch = 0
    for record in read_trace(path):
        if record["epoch"] != epoch:
            _epoch_done(run, epoch, cvs)
            epoch = record["epoch"]
            if epoch >= epochs:
                return cvs
        figures = run.step(record)
        if figures["step"] <= watch:
            median, saturated = run.probe.hidden(run.rule.weights)
            print(f"step {figures['step']:4d} n={figures['updates']} stale={figures['stale']} "
                  f"g {figures['gradient']:.3f} moved {_floats(figures['moved'])}  "
                  f"|b0| {median:.3f} sat {saturated:.3f}  "
                  f"residual {_floats(run.residuals())}", flush=True)  # fmt: skip
    _epoch_done(run, epoch, cvs)
    compressors = [c for c in run.compressors.values() if c is not None]
    if compressors:
        clipped = sum(c.clipped for c in compressors)
        print(f"clipped {clipped} of {sum(c.updates for c in compressors)} updates", flush=True)
    return cvs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("trace", type=Path)
    parser.add_argument("--codec", default="none")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--watch", type=int, default=0, help="print the first STEPS steps")
    parser.add_argument(
        "--clip-factor", type=float, help="the workers' local clipping (0: none; default: theirs)"
    )
    args = parser.parse_args(argv)
    options = {} if args.clip_factor is None else {"clip_factor": args.clip_factor}
    replay(args.trace, args.codec, args.epochs, args.watch, options)
    return 0


if __name__ == "__main__":
    sys.exit(main())
