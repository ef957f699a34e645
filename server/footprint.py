"""What the server holds for its job's network, checked against this machine's memory.

``check_fits_in_memory`` runs first thing in startup, before the server locks its out-dir,
loads the data or allocates anything: a network (or ``--pool-size``) too large for this
machine is one line and exit 2, instead of a ``MemoryError`` part-way or, with
overcommit, the kernel's OOM killer later (and perhaps another process on the machine).

The estimate counts whole float32 copies of the element, from what the code allocates:

- the element pool (server/pool.py): an element is made only when no freed one is left,
  and the most recently freed is reused first, so a run holds about as many as it holds
  updates at once: counted as twice what ``--min-workers`` workers may have unsettled,
  and two for a step's pass (none in np mode, which sends no updates), at most
  ``pool_size``;
- the update rule (server/update_rule.py): the weights, two velocity buffers, and the
  next step's fresh weights while the published ones are still sent and scored; np's
  rule (server/slice_master.py) has no step but keeps the slices' element and momentum;
- bmuf with a look-ahead (nbm, nesterov: server/block_filter.py): the published point
  and the next step's;
- newbob: the best epoch's weights (server/epochs.py);
- a checkpoint being written (server/checkpointer.py, checkpoint.py): the copied velocity
  and the file's bytes, one copy of every array of the state;
- the staleness policies (server/stepping.py, compensation.py): DC-ASGD and Gap-Aware keep
  ``HISTORY_VERSIONS`` past weights (Gap-Aware also its step sizes), and every policy that
  changes gradients makes a new one per update of a pass (at most the pool's).

The data, the interpreter and short-lived temporaries come on top: the words say
"about". A policy changed at run time (server/control.py) is not foreseen here. A need
above all this process could ever have (the machine's memory, or its container's limit:
transport/host_memory.py) is refused; one above what is available now is a warning.
"""

from __future__ import annotations

import logging

from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.memory import WORD32, MemoryNeed
from snet.protocol.staleness import StalenessSetting
from snet.transport.host_memory import host_memory

from .compensation import HISTORY_VERSIONS
from .policies import make_step_policy

log = logging.getLogger("snet.server")


def pool_in_use(job: JobSpec, pool_size: int, min_workers: int = 1) -> int:
    """The pool's elements a run writes (see the module's notes)."""
    if not make_step_policy(job).pools_updates:
        return 0
    return min(pool_size, 2 + 2 * job.max_in_flight * max(min_workers, 1))


def server_need(job: JobSpec, pool_size: int, min_workers: int = 1) -> MemoryNeed:
    """About what the server holds for ``job`` with a pool of ``pool_size`` elements and
    ``min_workers`` workers."""
    in_use = pool_in_use(job, pool_size, min_workers)
    newbob = job.schedule == "newbob"
    combination = make_step_policy(job).combination  # the mode's rule: what it holds
    staleness = StalenessSetting.parse(job.staleness)
    # the arrays a checkpoint's state holds: the rule's, and newbob's best
    state = combination.state_arrays + newbob
    copies = [
        (in_use, f"pooled update elements in use (of --pool-size {pool_size:,})"),
        (combination.rule_copies, "of the update rule"),
        (combination.lookahead_copies(job), f"of bmuf's {job.block_filter} look-ahead"),
        (int(newbob), "of newbob's best weights"),
        (1 + state, "while a checkpoint is written"),
    ]
    if staleness.needs_base_weights:
        history = HISTORY_VERSIONS + (staleness.policy == "gap")  # and Gap-Aware's sizes
        copies.append((history, f"of the {staleness.policy} staleness history"))
    if staleness.changes_gradients:
        copies.append((in_use, f"of {staleness.policy}'s adjusted gradients"))
    return MemoryNeed(WORD32 * job.network.connections, tuple(copies))


def check_fits_in_memory(job: JobSpec, pool_size: int, min_workers: int = 1) -> None:
    """ConfigError (exit 2) when the server's estimate exceeds all the memory it could
    ever have; a warning when it exceeds what is available now. Nothing is allocated or
    locked before it."""
    need, memory = server_need(job, pool_size, min_workers), host_memory()
    network = job.network.describe()
    refusal = need.refusal(network, "on this server", memory.total, memory.bounded_by)
    if refusal:
        raise ConfigError(f"{refusal}: give a smaller network")
    warning = need.shortfall(network, "on this server", memory.available)
    if warning:
        log.warning("%s", warning)
