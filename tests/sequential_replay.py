"""What a run's weights should be: its final weights read back (``load_weights``), and
sequential training replayed on the frames of each step its trace records
(``replay_sequentially``), for the tests that a run equals its sequential replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from snet.client.data import load_corpus
from snet.client.network import BunchNetwork
from snet.protocol.job import DataSpec
from snet.protocol.network import ElementLayout, NetworkSpec, initial_weights
from snet.server.update_rule import UpdateRule


def load_weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        layers = len([k for k in data.files if k.startswith("W")])
        return [data[f"{kind}{i}"] for i in range(layers) for kind in ("W", "b")]


def replay_sequentially(
    trace: list[dict], spec: NetworkSpec, momentum: float, data: str = ""
) -> np.ndarray:
    """Sequential bunch training on the union of each step's frames, in the same order
    (of the default data, or of ``data``)."""
    corpus = load_corpus(DataSpec(source=data) if data else DataSpec(), spec.output_size)
    rule = UpdateRule(initial_weights(spec, seed=1), momentum)
    biggest = max(sum(len(u["frames"]) for u in step["updates"]) for step in trace)
    network = BunchNetwork(spec, biggest)
    gradient = ElementLayout.for_network(spec).allocate()
    for step in trace:
        frames = np.concatenate([np.array(u["frames"], dtype=np.int64) for u in step["updates"]])
        network.gradient(rule.weights, corpus.windows(frames), corpus.labels[frames], gradient)
        rule.step([gradient], len(frames), step["learning_rate"])
    return rule.weights
