"""Frames inline: the server sends each raw frame once, the worker cuts the same windows
from them as a worker that reads the data itself."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from snet.client.data import InlineStore, inline_corpus, local_corpus
from snet.protocol.errors import DataError
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.network import NetworkSpec
from snet.server.dataplan import plan_data
from snet.server.inline import InlineFrames


def _job(path: Path, context: int = 2) -> JobSpec:
    rng = np.random.default_rng(5)
    lengths = rng.integers(3, 12, size=40)
    frames = rng.standard_normal((int(lengths.sum()), 4)).astype(np.float32) * 3 + 1
    labels = rng.integers(0, 5, size=len(frames))
    np.savez(path, X=frames, y=labels, lengths=lengths)
    network = NetworkSpec((4 * (2 * context + 1), 8, 5), ("sigmoid",))
    data = DataSpec(source=str(path), context=context, cv_fraction=0.25)
    return JobSpec(network=network, data=data, bunch_size=8, chunk_frames=64)


def test_inline_frames_give_the_same_windows_and_are_sent_once(tmp_path: Path) -> None:
    job = _job(tmp_path / "d.npz")
    plan = plan_data(job)
    info = plan.data_info()
    local = local_corpus(job, info)
    inline = inline_corpus(job, info)
    server = InlineFrames(plan, job.data.context)
    server.start(worker_id=7)
    centres = plan.train_frames[:50]
    assert not inline.ready_for(centres)
    message = server.frames_for(7, centres)
    assert message is not None
    assert len(message.indices) == len(np.unique(message.indices))  # raw frames, once each
    assert len(message.indices) < len(centres) * (2 * job.data.context + 1)
    inline.store.add(message.indices, message.features, message.labels)  # type: ignore[attr-defined]
    assert inline.ready_for(centres)
    np.testing.assert_array_equal(inline.windows(centres), local.windows(centres))
    np.testing.assert_array_equal(inline.labels_of(centres), local.labels_of(centres))
    again = server.frames_for(7, centres)  # nothing new to send
    assert again is None
    overlapping = server.frames_for(7, plan.train_frames[40:60])
    assert overlapping is not None
    assert not set(overlapping.indices.tolist()) & set(message.indices.tolist())
    assert server.frames_for(8, centres) is None  # a worker that reads its own data


def test_a_different_local_copy_is_not_used(tmp_path: Path) -> None:
    job = _job(tmp_path / "d.npz")
    info = plan_data(job).data_info()
    other = _job(tmp_path / "d.npz")  # same name, rewritten: same content (same seed)
    assert local_corpus(other, info).features == 4
    np.savez(tmp_path / "d.npz", X=np.zeros((10, 4)), y=np.zeros(10, int), lengths=[5, 5])
    with pytest.raises(DataError, match="differs from the server's"):
        local_corpus(job, info)
    with pytest.raises(DataError, match="does not exist"):
        local_corpus(job.with_changes(data=DataSpec(source=str(tmp_path / "no.npz"))), info)
    # the same shape with other labels (another file under the same name, as on a worker
    # started from another directory): it trained on it, CV 24.5 % where 100 % was due
    _job(tmp_path / "d.npz")
    with np.load(tmp_path / "d.npz") as data:
        arrays = {name: data[name] for name in data.files}
    arrays["y"] = (arrays["y"] + 1) % 5
    np.savez(tmp_path / "d.npz", **arrays)
    with pytest.raises(DataError, match="has the server's shape but other labels"):
        local_corpus(job, info)
    legacy = dataclasses.replace(info, labels="")  # from a server that sent no digest
    assert local_corpus(job, legacy).features == 4
    assert plan_data(job).data_info(labels=False).labels == ""  # to a worker of before


def test_stores_say_when_every_row_is_at_hand(tmp_path: Path) -> None:
    """A local store holds every row (the worker then skips the per-lease lookup); an
    inline store only once the server has sent each one, and a window's rows count
    however often they repeat."""
    job = _job(tmp_path / "d.npz")
    plan = plan_data(job)
    info = plan.data_info()
    local, inline = local_corpus(job, info), inline_corpus(job, info)
    assert local.store.complete and local.ready_for(plan.train_frames)
    everything = np.arange(info.total_frames)
    centres = plan.train_frames[:30]
    assert not inline.store.complete
    needed = inline.needed_rows(centres)
    store = inline.store
    assert isinstance(store, InlineStore)
    store.add(needed[:-1], local.store.take(needed[:-1]), local.labels_of(needed[:-1]))
    assert not inline.ready_for(centres)  # one row short
    store.add(needed[-1:], local.store.take(needed[-1:]), local.labels_of(needed[-1:]))
    assert inline.ready_for(centres) and not store.complete
    rest = np.setdiff1d(everything, needed)
    twice = np.concatenate([rest[:-1], rest[:1]])  # a row named twice, the last one missing
    store.add(twice, local.store.take(twice), local.labels_of(twice))
    assert not store.complete and store.rows_held == info.total_frames - 1
    store.add(everything, local.store.take(everything), local.labels_of(everything))
    assert store.complete and inline.ready_for(plan.train_frames)
    np.testing.assert_array_equal(inline.windows(centres), local.windows(centres))
