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
being at least ``MIN_ROWS``). In np mode nothing is counted: the backend holds a slice,
sized only later (a board checks its own memory then), and the whole-network buffers are
zeros that no weights or updates are ever written into (the kernel maps none of them).
A need above all the memory this process could ever have is refused; one above what is
available now is a warning (transport/host_memory.py).

A worker that joins again (its server restarted) still holds what it made for the last
job, which the new one reuses or frees: that much counts as available, so that a worker
that ran is never turned away by its own earlier allocations.
"""

from __future__ import annotations

import logging

from snet.protocol.codecs import parse_codec
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.memory import WORD32, MemoryNeed
from snet.transport.host_memory import host_memory

from .compression import CLIPPED_FAMILIES, KEEP_SENT
from .network import MIN_ROWS

log = logging.getLogger("snet.worker")

BOX_SLOTS = 3  # WeightsBox's default
ROW_COPIES = 3  # float32 values per unit and row: activations, deltas and their scratch


def activations(job: JobSpec) -> tuple[int, str]:
    """A bunch's activations for ``job`` (bytes, and the words for them): its trainer's
    BunchNetwork holds ``ROW_COPIES`` float32 values per unit and row."""
    rows = max(job.bunch_size, MIN_ROWS)
    return WORD32 * ROW_COPIES * rows * sum(
        job.network.sizes
    ), f"a bunch's activations ({rows:,} rows)"


def worker_need(job: JobSpec, update_codec: str = "none") -> MemoryNeed:
    """About what a worker holds for ``job`` sending updates in ``update_codec``."""
    # here, not at the top: snet train reads activations() and must not load the worker's
    # policies (np's slice work imports asyncio; tests/test_startup_imports.py)
    from .policies import make_compute_policy

    policy = make_compute_policy(job)
    if not policy.holds_whole_network:
        # Its whole-network buffers are zeros it never writes (no weights come, no update
        # goes); its slice is sized later, when the server cuts the hidden layer.
        return MemoryNeed(WORD32 * job.network.connections, ())
    copies = [(BOX_SLOTS, "weights slots"), (policy.send_buffers, "send buffers"), (1, "scratch")]
    other = [activations(job)]
    if policy.local_copies:
        copies.append((policy.local_copies, f"of {policy.name}'s local trainer"))
    if update_codec != "none":
        codec = parse_codec(update_codec)
        held = 3 + codec.momentum_corrected + (codec.family in CLIPPED_FAMILIES) + KEEP_SENT
        copies.append((held, f"of the {update_codec} compressor"))
    return MemoryNeed(WORD32 * job.network.connections, tuple(copies), tuple(other))


def check_fits_in_memory(
    job: JobSpec, update_codec: str, earlier: JobSpec | None = None, earlier_codec: str = "none"
) -> None:
    """ConfigError when this worker's estimate for ``job`` exceeds all the memory it could
    ever have (a job this worker cannot run); a warning when it exceeds what is available
    now plus what it still holds for ``earlier``, the job of its last session (sent in
    ``earlier_codec``): the new session reuses or frees that."""
    need, memory = worker_need(job, update_codec), host_memory()
    network = job.network.describe()
    refusal = need.refusal(network, "on this worker", memory.total, memory.bounded_by)
    if refusal:
        raise ConfigError(refusal)
    free = memory.available
    if free is not None and earlier is not None:
        free += worker_need(earlier, earlier_codec).total
    warning = need.shortfall(network, "on this worker", free)
    if warning:
        log.warning("%s", warning)
