"""``DataPlan``: the job's data as the server needs it.

The server reads the utterance lengths (to split and lease the training frames), checks
the labels and the feature count against the network before any worker joins (a wrong
label or dimension fails at startup with a clear message), and fixes the normalisation
every worker applies (the job's norm file, or the training frames' mean and standard
deviation, computed here in one streaming pass and kept in the data cache for the next
start on the same data: ``data/cache.py``). A separate CV file is joined after the training
data (``snet.data.joined``); a test file is opened and checked too, and scored once
training ends (``server/testset.py``). Otherwise the features themselves are read only for
workers that cannot read the data and are sent their frames inline (``server/inline.py``).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass

import numpy as np

from snet.data.cache import cache_directory
from snet.data.corpus import job_norms
from snet.data.joined import JoinedSource, open_job_source, split_frames
from snet.data.norms import Norms, check_finite
from snet.data.sources import FrameSource, check_against_network, open_source, total_frames
from snet.data.windows import UtteranceBounds
from snet.protocol.digest import labels_digest
from snet.protocol.errors import DataError
from snet.protocol.job import JobSpec
from snet.protocol.messages import DataInfo

log = logging.getLogger("snet.server")


@dataclass
class DataPlan:
    """The opened source, its split, bounds and normalisation."""

    source: JoinedSource
    train_frames: np.ndarray
    cv_frames: np.ndarray
    total_frames: int
    bounds: UtteranceBounds
    norms: Norms
    test: FrameSource | None = None  # the job's test file, scored once training ends
    # of the labels, made once here (off the event loop): a pass over every label, which
    # each worker's join would otherwise make again (0.1 s for 30 million frames)
    labels: str = ""

    def data_info(self, labels: bool = True) -> DataInfo:
        """What every worker is told after ``Welcome`` (``labels``: with the labels'
        digest, for a worker that knows the field: ``DATA_LABELS``)."""
        norms, lengths = self.norms.as_array(), self.bounds.lengths.astype("<i8")
        return DataInfo(
            self.source.features,
            self.total_frames,
            norms=norms,
            lengths=lengths,
            cv_utterances=self.source.cv_utterances,
            labels=self.labels if labels else "",
        )

    def fingerprint(self) -> str:
        """What identifies the data a checkpoint was trained on: the utterance lengths, the
        split, the feature count and the normalisation (not the features themselves, which
        the server never reads in full)."""
        digest = hashlib.blake2b(digest_size=16)
        digest.update(f"{self.source.features}:{self.total_frames}".encode())
        for array in (self.bounds.lengths, self.train_frames, self.cv_frames,
                      self.norms.mean, self.norms.std):  # fmt: skip
            digest.update(np.ascontiguousarray(array).tobytes())
        return digest.hexdigest()


def plan_data(job: JobSpec, data_cache: str = "none") -> DataPlan:
    """Open and check the job's data (raises DataError with what is wrong); the server's
    ``data_cache`` setting keeps the normalisation for its next start (``none``: not)."""
    source = open_job_source(job.data)
    network = job.network
    check_against_network(source, job.data.window, network.input_size, network.output_size)
    test = open_source(job.data.part("test"), "test") if job.data.test_source else None
    if test is not None and total_frames(test) == 0:  # it was scored: 0.00 % of 0 frames
        raise DataError(f"the test file {test.description} has no frames")
    if test is not None:
        check_against_network(
            test, job.data.window, network.input_size, network.output_size, every_class=False
        )
    train, cv = split_frames(job.data, source.lengths, source.cv_utterances)
    if len(train) < job.bunch_size:  # --cv-fraction 0.9999 trained on 0.00 %, unsaid
        log.warning("the split leaves %d training frames of %s, fewer than one bunch (%d): "
                    "a lower --cv-fraction (now %g) or more data trains on more",
                    len(train), source.description, job.bunch_size,
                    job.data.cv_fraction)  # fmt: skip
    # The values are checked for NaN and infinity where they are read: the training
    # frames (and CV frames of the same file) as the norms are computed, or were when the
    # kept ones were (their key is the files' identity); a CV file of its own and the test
    # file apart. Reading the CV frames of the training file apart would read all of it
    # (an .npz is read whole) at every start, which the kept norms spare.
    separate_cv = source.cv_utterances > 0
    cache = cache_directory(data_cache)
    norms = job_norms(job.data, source, train, cache, checked=None if separate_cv else cv)
    if separate_cv:
        check_finite(source, cv)
    if test is not None:
        check_finite(test, np.arange(total_frames(test)))
    bounds = UtteranceBounds(source.lengths)
    total = total_frames(source)
    return DataPlan(source, train, cv, total, bounds, norms, test, labels_digest(source.labels))
