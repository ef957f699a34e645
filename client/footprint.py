"""What a worker holds for its server's job, checked against this machine's memory.

A worker learns the network from the server's ``Welcome``; ``check_fits_in_memory`` runs
then, before the backend, the buffers or the compressor are made for it (client/
joining.py). A job this machine cannot hold is refused as this worker's own limit
(``RefusedHere``: "cannot run the server's job", exit 4): the server is told why and
carries on without it, instead of this worker raising ``MemoryError`` part-way or, with
overcommit, being killed later by the kernel's OOM killer (perhaps with another process).

The estimate counts whole float32 copies of the element, from what the code allocates:
the ``WeightsBox``'s slots and the ``SendBuffers`` (client/buffers.py), the compute
loop's scratch (client/worker.py), bmuf's local trainer (client/blocks.py: its weights,
velocity and gradient), and the update compressor (client/compression.py: its residual,
target and decoded copy, a velocity for momentum-corrected codecs, a clipped copy for
those that clip, the gradients of the last ``KEEP_SENT`` updates); and the backend's
activations for a bunch (client/network.py: a few float32 values per unit and row, rows
being at least ``MIN_ROWS``). In np mode the backend holds a slice, sized only later (a
board checks its own memory then): the whole-network buffers alone are counted.

A worker that joins again (its server restarted) still holds what it made for the last
job, which the new one reuses or frees: that much counts as available, so that a worker
that ran is never turned away by its own earlier allocations.
"""

from __future__ import annotations

from snet.protocol.codecs import parse_codec
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.memory import WORD32, MemoryNeed
from snet.transport.host_memory import available_bytes

from .compression import CLIPPED_FAMILIES, KEEP_SENT

BOX_SLOTS = 3  # WeightsBox's default
SEND_BUFFERS = 2  # SendBuffers' default
MIN_ROWS = 1024  # NumpyBackend sizes its BunchNetwork for max(bunch, 1024) rows
ROW_COPIES = 3  # float32 values per unit and row: activations, deltas and their scratch


def worker_need(job: JobSpec, update_codec: str = "none") -> MemoryNeed:
    """About what a worker holds for ``job`` sending updates in ``update_codec``."""
    copies = [(BOX_SLOTS, "weights slots"), (SEND_BUFFERS, "send buffers"), (1, "scratch")]
    other: list[tuple[int, str]] = []
    if job.mode != "np":  # np's backend holds a slice, sized later
        rows = max(job.bunch_size, MIN_ROWS)
        activations = WORD32 * ROW_COPIES * rows * sum(job.network.sizes)
        other.append((activations, f"a bunch's activations ({rows:,} rows)"))
    if job.mode == "bmuf":
        copies.append((3, "of bmuf's local trainer"))
    if update_codec != "none":
        codec = parse_codec(update_codec)
        held = 3 + codec.momentum_corrected + (codec.family in CLIPPED_FAMILIES) + KEEP_SENT
        copies.append((held, f"of the {update_codec} compressor"))
    return MemoryNeed(WORD32 * job.network.connections, tuple(copies), tuple(other))


def check_fits_in_memory(
    job: JobSpec, update_codec: str, earlier: JobSpec | None = None, earlier_codec: str = "none"
) -> None:
    """ConfigError when this worker's estimate for ``job`` exceeds this machine's available
    memory plus what it still holds for ``earlier``, the job of its last session (sent in
    ``earlier_codec``): the new session reuses or frees that."""
    free = available_bytes()
    if free is not None and earlier is not None:
        free += worker_need(earlier, earlier_codec).total
    refusal = worker_need(job, update_codec).refusal(job.network.describe(), "on this worker", free)
    if refusal:
        raise ConfigError(refusal)
