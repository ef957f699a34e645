"""np mode with and without software pipelining against sequential training.

``train_np_replay`` replays what an np-mode server and its workers compute, in one
process and without sockets: the lone worker's frame order (the one the server's
``SliceRounds`` takes from its lease book), the ``SliceMaster`` and one
``SliceTrainer`` per worker, in the order the messages reach them: without pipelining
the forward pass of bunch k+1 follows the error of bunch k; with it (``np_pipeline``) it
runs before that error is applied, as Quicknet on MultiSpert did. tests/test_np_training.py
checks that a real server and workers give exactly these weights.

The main program trains the default job (117:512:10 on the FSDD MFCCs, 10 epochs, the
default rate list, momentum 0.9, bunches of 128) sequentially (``snet train``) and
network-parallel with and without pipelining, and writes each epoch's CV accuracy::

    .venv/bin/python bench/np_pipeline.py            # writes docs/np-pipeline.json
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from snet.cli.offline import lone_worker_chunks, train_job
from snet.client.data import load_corpus
from snet.client.network import BunchNetwork
from snet.client.slice_trainer import SliceTrainer
from snet.protocol.job import JobSpec
from snet.protocol.network import initial_weights
from snet.server.slice_master import SliceMaster

ROOT = Path(__file__).resolve().parent.parent


def train_np_replay(job: JobSpec, workers: int, pipelined: bool) -> tuple[np.ndarray, list[float]]:
    """(final weights, CV accuracy after each epoch) of np-mode training of ``job``."""
    spec = job.network
    corpus = load_corpus(job.data, spec.output_size, spec.input_size)
    master = SliceMaster(spec, job.momentum, initial_weights(spec, job.seed))
    trainers = []
    for grant in master.reslice(dict.fromkeys(range(workers), 1.0)).values():
        trainer = SliceTrainer(spec, job.momentum)
        trainer.load(grant.part, grant.weights, grant.velocity, -1)
        trainers.append(trainer)
    chunks = lone_worker_chunks(job, corpus)
    scorer = BunchNetwork(spec, 1024)
    cv_x, cv_labels = corpus.windows(corpus.cv_frames), corpus.labels_of(corpus.cv_frames)
    accuracy = []
    for epoch in range(job.epochs):
        rate = job.learning_rate(epoch)
        bunches = [
            chunk[offset : offset + job.bunch_size]
            for chunk in chunks(epoch)
            for offset in range(0, len(chunk), job.bunch_size)
        ]
        partials = {0: _forward(trainers, corpus.windows(bunches[0]), 0)}
        for k, frames in enumerate(bunches):
            following = k + 1 < len(bunches)
            if pipelined and following:
                partials[k + 1] = _forward(trainers, corpus.windows(bunches[k + 1]), k + 1)
            delta, _, _ = master.combine(partials.pop(k), corpus.labels_of(frames))
            master.step_output(delta, len(frames), rate)
            for trainer in trainers:
                trainer.backward(k, delta, len(frames), rate)
            if not pipelined and following:
                partials[k + 1] = _forward(trainers, corpus.windows(bunches[k + 1]), k + 1)
        for worker, trainer in enumerate(trainers):
            master.take_report(worker, trainer.part, trainer.weights, trainer.velocity)
        _, correct = scorer.evaluate(master.element, cv_x, cv_labels)
        accuracy.append(correct / len(cv_labels))
    return master.element.copy(), accuracy


def _forward(trainers: list[SliceTrainer], x: np.ndarray, bunch: int) -> list[np.ndarray]:
    return [trainer.forward(bunch, x) for trainer in trainers]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--out", default=str(ROOT / "docs" / "np-pipeline.json"))
    args = parser.parse_args()
    job = JobSpec(mode="np", epochs=args.epochs)
    sequential = [float(row["cv_accuracy"]) for row in train_job(job).epochs]
    _, plain = train_np_replay(job, args.workers, pipelined=False)
    _, pipelined = train_np_replay(job, args.workers, pipelined=True)
    result = {
        "job": f"{job.network.describe()}, {args.epochs} epochs, bunch {job.bunch_size}, "
        f"momentum {job.momentum}, {args.workers} np workers",
        "cv_accuracy": {"sequential": sequential, "np": plain, "np_pipelined": pipelined},
        "final_gap_points": {
            "np": 100 * (sequential[-1] - plain[-1]),
            "np_pipelined": 100 * (sequential[-1] - pipelined[-1]),
        },
    }
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["final_gap_points"]))


if __name__ == "__main__":
    main()
