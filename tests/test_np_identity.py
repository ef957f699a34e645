"""A checkpoint written before a job setting existed still resumes when the setting is
left at its default (np mode's ``np_pipeline`` was added after checkpoints were), and
is refused when it is not; so does one whose job set what its mode never read (accepted
before such a job was refused: protocol/modes.py)."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import pytest

from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.server.checkpoint import LoadedCheckpoint
from snet.server.durability import job_identity, resume_point

from one_checkpoint import OneCheckpoint


def _resume(saved_job: dict[str, Any], job: JobSpec) -> LoadedCheckpoint | None:
    store = OneCheckpoint({"job": saved_job, "data": "fsdd"})
    # out_dir: where a refusal looks for a finished run's results to say --force too
    config = SimpleNamespace(fresh=False, init_weights="", out_dir="/nonexistent/snet-out")
    return resume_point(config, store, job_identity(job.to_dict(), "fsdd"))  # type: ignore[arg-type]


def _written_before_np_pipeline(job: JobSpec) -> dict[str, Any]:
    saved = job_identity(job.to_dict(), "fsdd")["job"]
    del saved["np_pipeline"]
    return saved


def test_a_checkpoint_from_before_a_setting_existed_resumes_at_its_default() -> None:
    job = JobSpec(mode="np", epochs=3)
    assert _resume(_written_before_np_pipeline(job), job) is not None
    saved_now = job_identity(job.to_dict(), "fsdd")["job"]  # written with the setting
    assert _resume(saved_now, job) is not None


def test_a_checkpoint_from_before_a_setting_is_not_of_a_job_that_changes_it() -> None:
    job = JobSpec(mode="np", epochs=3)
    with pytest.raises(
        ConfigError, match=r"checkpoint of another job \(np_pipeline false there, true here\)"
    ):
        _resume(_written_before_np_pipeline(job), job.with_changes(np_pipeline=True))
    with pytest.raises(ConfigError, match=r"another job \(epochs 3 there, 4 here\)"):
        _resume(_written_before_np_pipeline(job), job.with_changes(epochs=4))
    with pytest.raises(ConfigError, match="another job"):
        _resume({}, job)  # a saved job that says nothing is no match
    # a setting in a nested table is named, not the table (both read alike, cut at 60)
    other_split = job.with_changes(data=dataclasses.replace(job.data, split_seed=3))
    with pytest.raises(ConfigError, match=r"another job \(data.split_seed 0 there, 3 here\)"):
        _resume(_written_before_np_pipeline(job), other_split)


def test_a_run_that_set_what_its_mode_ignored_resumes_with_the_job_given_now() -> None:
    """``--mode sync --block-bunches 8 --np-pipeline`` trained (as plain sync) and was
    checkpointed before such a job was refused; the same command is refused now, and the
    job without those flags, the one that run trained, resumes it: its state is kept."""
    written = {**JobSpec(mode="sync", epochs=3).to_dict(), "block_bunches": 8,
               "np_pipeline": True, "updates_per_step": 2}  # fmt: skip
    saved = job_identity(written, "fsdd")["job"]
    with pytest.raises(ConfigError, match=r"^block_bunches 8 applies to bmuf mode only"):
        JobSpec(mode="sync", epochs=3, block_bunches=8)
    assert _resume(saved, JobSpec(mode="sync", epochs=3)) is not None
    # what the mode reads still tells jobs apart, and another mode is another job
    with pytest.raises(ConfigError, match=r"another job \(epochs 3 there, 4 here\)"):
        _resume(saved, JobSpec(mode="sync", epochs=4))
    with pytest.raises(ConfigError, match=r"another job \(mode 'sync' there, 'bmuf' here\)"):
        _resume(saved, JobSpec(mode="bmuf", epochs=3))  # its blocks of 8 never were
    # a bmuf run's blocks are its own: a checkpoint of blocks of 8 is not one of 16
    blocks = job_identity(JobSpec(mode="bmuf", block_bunches=8).to_dict(), "fsdd")["job"]
    with pytest.raises(ConfigError, match=r"another job \(block_bunches 8 there, 16 here\)"):
        _resume(blocks, JobSpec(mode="bmuf"))
