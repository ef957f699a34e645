"""A checkpoint is resumed only on the data it was trained on: the same frames' labels too.

The data's fingerprint (server/dataplan.py) covers the utterance lengths, the split and
the normalisation, never the labels; a file whose labels were rewritten (relabelled,
shuffled) resumed another run's weights and trained on, to 13 % CV. The labels' digest is
kept beside it; a checkpoint written before it was kept has none, and still resumes."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from snet.protocol.errors import ConfigError
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.network import NetworkSpec
from snet.server.checkpoint import LoadedCheckpoint
from snet.server.dataplan import plan_data
from snet.server.durability import job_identity, resume_point

from one_checkpoint import OneCheckpoint
from user_errors import tiny_set


def _identity(path: Path, tmp_path: Path) -> dict[str, Any]:
    job = JobSpec(network=NetworkSpec((39, 8, 3), ("sigmoid",)), bunch_size=16,
                  data=DataSpec(source=str(path), context=1))  # fmt: skip
    plan = plan_data(job, str(tmp_path / "cache"))
    return job_identity(job.to_dict(), plan.fingerprint(), plan.labels)


def _resume(saved: dict[str, Any], now: dict[str, Any]) -> LoadedCheckpoint | None:
    # out_dir: where a refusal looks for a finished run's results to say --force too
    config = SimpleNamespace(fresh=False, init_weights="", out_dir="/nonexistent/snet-out")
    return resume_point(config, OneCheckpoint(saved), now)  # type: ignore[arg-type]


def test_a_checkpoint_of_the_same_frames_with_other_labels_is_refused(tmp_path: Path) -> None:
    first = tiny_set(tmp_path / "a.npz")
    with np.load(first) as data:
        arrays = {name: data[name].copy() for name in data.files}
    arrays["y"] = np.random.default_rng(5).permutation(arrays["y"])  # same classes, moved
    np.savez(tmp_path / "b.npz", **arrays)
    # the file is rewritten in place, as the user did: same path, same shape, same norms
    before = _identity(first, tmp_path)
    (tmp_path / "b.npz").replace(first)
    after = _identity(first, tmp_path)
    assert before["data"] == after["data"]  # the fingerprint alone cannot tell them apart
    assert before["labels"] and before["labels"] != after["labels"]
    with pytest.raises(ConfigError, match=r"on other data \(its frames have other labels"):
        _resume(before, after)
    assert _resume(after, after) is not None


def test_a_checkpoint_written_before_labels_were_kept_still_resumes(tmp_path: Path) -> None:
    now = _identity(tiny_set(tmp_path / "a.npz"), tmp_path)
    older = {key: value for key, value in now.items() if key != "labels"}
    assert _resume(older, now) is not None
    with pytest.raises(ConfigError, match="the data's fingerprint differs"):
        _resume({**older, "data": "another"}, now)
