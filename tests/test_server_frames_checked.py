"""What a worker takes from its server is checked before it is used (a hostile or broken
server's lease of frames beyond the data, indices of floats, utterance lengths below zero,
weights of another size: the worker ended in a traceback of numpy's or numba's)."""

from __future__ import annotations

import re
from types import SimpleNamespace

import numpy as np
import pytest

from snet.client.data import checked_lengths
from snet.client.work import WorkQueue
from snet.protocol.errors import DataError, ProtocolError
from snet.protocol.job import JobSpec
from snet.protocol.messages import DataInfo, Evaluate, Lease
from snet.protocol.network import ElementLayout

JOB = JobSpec()
CORPUS = SimpleNamespace(bounds=SimpleNamespace(total_frames=1000))


@pytest.mark.parametrize(
    ("indices", "said"),
    [
        (np.array([3, 10**12]), "lease 7 names frames 3 to 1000000000000; the data has 1000"),
        (np.array([-7, 3]), "lease 7 names frames -7 to 3; the data has 1000"),
        (np.array([1.0, 2.0], "<f4"), "lease 7 holds (2,) values of type float32, not frame"),
        (np.zeros((2, 3), np.int64), "lease 7 holds (2, 3) values of type int64, not frame"),
        (np.zeros(0, np.int64), "lease 7 holds (0,) values of type int64, not frame"),
    ],
)
def test_a_lease_beyond_the_data_is_refused(indices: np.ndarray, said: str) -> None:
    work = WorkQueue()
    with pytest.raises(ProtocolError, match=f"^{re.escape(said)}"):
        work.file(Lease(7, 0, indices), JOB, CORPUS)  # type: ignore[arg-type]
    assert not work.leases
    work.file(Lease(8, 0, np.arange(990, 1000)), JOB, CORPUS)  # type: ignore[arg-type]
    assert [held.lease.lease_id for held in work.leases] == [8]


def test_weights_to_evaluate_of_another_size_are_refused() -> None:
    work = WorkQueue()
    with pytest.raises(ProtocolError, match=r"weights to evaluate of shape \(5,\)"):
        work.file(Evaluate(3, 0, np.zeros(5, "<f4")), JOB, CORPUS)  # type: ignore[arg-type]
    size = ElementLayout.for_network(JOB.network).size
    work.file(Evaluate(3, 0, np.zeros(size, "<f4")), JOB, CORPUS)  # type: ignore[arg-type]
    assert len(work.evaluations) == 1


@pytest.mark.parametrize(
    "lengths", [np.array([5, -1, 6]), np.array([4.0, 6.0]), np.array([[10]]), np.array([3, 3])]
)
def test_utterance_lengths_not_of_the_data_are_refused(lengths: np.ndarray) -> None:
    info = DataInfo(13, 10, norms=np.zeros((2, 13)), lengths=lengths)
    with pytest.raises(DataError, match="the server's utterance lengths"):
        checked_lengths(info)
    good = DataInfo(13, 10, norms=np.zeros((2, 13)), lengths=np.array([4, 6], "<i8"))
    assert checked_lengths(good).tolist() == [4, 6]
