"""A worker's own frame limit (``--max-frame-mb``) against what its job sends it.

The limit protects the worker from a peer that declares a huge frame. Set below what the
job needs, it refuses the server's honest frames, and no reconnection can help: each new
connection is refused the same way. So it is a configuration error (exit 2), found as
early as the worker can know it: in the handshake, from the job's network (the server
sends whole float32 copies of the weights, and CV requests with them, in every mode but
np), or else when a frame is refused by this limit (np mode's slices, inline frames).
"""

from __future__ import annotations

from snet.protocol.errors import ConfigError
from snet.protocol.framing import MIB, mib_at_least
from snet.protocol.job import JobSpec
from snet.protocol.modes import whole_element_bytes

FLAG = "--max-frame-mb (SNET_WORKER_MAX_FRAME_MB, or max_frame_mb in [worker])"


class FrameLimitTooSmall(ConfigError):
    """This worker's ``max_frame_mb`` cannot hold a frame its job needs."""


def too_small(limit_bytes: int, needed_bytes: int, what: str) -> FrameLimitTooSmall:
    """The error naming the limit, the size needed (``what``: whose, with its verb, e.g.
    "a frame from the server takes") and the flag to raise."""
    return FrameLimitTooSmall(
        f"this worker's frame limit is {limit_bytes // MIB} MiB ({limit_bytes} bytes), but "
        f"{what} {needed_bytes} bytes: give {FLAG} at least {mib_at_least(needed_bytes)}"
    )


def check_job(job: JobSpec, limit_bytes: int) -> None:
    """Raise ``FrameLimitTooSmall`` when ``job``'s weights would not fit in the limit: the
    server sends whole float32 copies of them (after a resync, with an ``Evaluate``)
    whatever the weights codec, in every mode but np."""
    needed = whole_element_bytes(job.network, job.mode)
    if needed > limit_bytes:
        weights = f"the weights of network {job.network.describe()} take"
        raise too_small(limit_bytes, needed, weights)


def refused_frame(limit_bytes: int, payload_bytes: int) -> FrameLimitTooSmall:
    """The error for a frame this worker's limit refused (one the handshake could not
    foresee: np mode's slices, inline frames)."""
    return too_small(limit_bytes, payload_bytes, "a frame from the server takes")
