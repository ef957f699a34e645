"""bench/replay.py: a server trace replayed in one process recomputes each update on the
weights of its base version and applies the steps exactly as the server would."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.replay import Replay, read_trace, replay
from snet.client.compression import UpdateCompressor
from snet.client.network import BunchNetwork
from snet.protocol.job import JobSpec
from snet.server.update_rule import UpdateRule

JOB = JobSpec()


def trace(tmp_path: Path) -> tuple[Path, list[dict]]:
    """Two steps of two updates each; the second step's updates are one version stale
    and one current, from two workers."""
    frames = [list(range(i * 64, (i + 1) * 64)) for i in range(4)]
    steps = [
        {"version": 1, "epoch": 0, "learning_rate": 0.2, "updates": [
            {"worker": "w1", "base_version": 0, "frames": frames[0]},
            {"worker": "w2", "base_version": 0, "frames": frames[1]}]},
        {"version": 2, "epoch": 0, "learning_rate": 0.2, "updates": [
            {"worker": "w1", "base_version": 0, "frames": frames[2]},
            {"worker": "w2", "base_version": 1, "frames": frames[3]}]},
    ]  # fmt: skip
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps(step) + "\n" for step in steps))
    return path, steps


def test_replay_applies_each_update_on_its_base_version(tmp_path: Path) -> None:
    path, steps = trace(tmp_path)
    assert list(read_trace(path)) == steps
    run = Replay(JOB, "none", {})
    # The reference: gradients by hand, on the versions the trace names.
    rule = UpdateRule(run.rule.weights, JOB.momentum)
    network = BunchNetwork(JOB.network, 128)
    versions = [rule.weights]
    for step in steps:
        gradients = []
        for update in step["updates"]:
            frames = np.asarray(update["frames"])
            g = run.layout.allocate()
            x, labels = run.corpus.windows(frames), run.corpus.labels_of(frames)
            network.gradient(versions[update["base_version"]], x, labels, g)
            gradients.append(g)
        versions.append(rule.step(gradients, 128, step["learning_rate"]))
        figures = run.step(step)
        assert figures["updates"] == 2
    assert figures["stale"] == 1  # w1's second update was computed on version 0
    np.testing.assert_allclose(run.rule.weights, versions[-1], rtol=1e-5, atol=1e-7)


def test_replay_passes_updates_through_each_workers_compressor(tmp_path: Path) -> None:
    path, steps = trace(tmp_path)
    run = Replay(JOB, "topk:0.01", {"clip_factor": 0.0})
    for step in steps:
        run.step(step)
    compressors = run.compressors
    assert set(compressors) == {"w1", "w2"}
    for compressor in compressors.values():
        assert isinstance(compressor, UpdateCompressor)
        assert compressor.updates == 2 and compressor.clip_factor == 0.0
    assert max(run.residuals()) > 0  # topk left most of the element for later
    assert 0.0 <= replay(path, "sign", 1, 0, {})[0] <= 100.0  # one epoch, scored on CV
