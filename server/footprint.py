"""What the server holds for its job's network, checked against this machine's memory.

``check_fits_in_memory`` runs first thing in startup, before the server locks its out-dir,
loads the data or allocates anything: a network (or ``--pool-size``) too large for this
machine is one line and exit 2, instead of a ``MemoryError`` part-way or, with
overcommit, the kernel's OOM killer later (and perhaps another process on the machine).

The estimate counts whole float32 copies of the element, from what the code allocates:

- the element pool: ``pool_size`` elements (server/pool.py), whatever the mode;
- the update rule (server/update_rule.py): the weights, two velocity buffers, and the
  next step's fresh weights while the published ones are still sent and scored; np's
  rule (server/slice_master.py) has no step but keeps the slices' element and momentum;
- bmuf with a look-ahead (nbm, nesterov: server/block_filter.py): the published point
  and the next step's;
- newbob: the best epoch's weights (server/epochs.py);
- a checkpoint being written (server/durability.py, checkpoint.py): the copied velocity
  and the file's bytes, one copy of every array of the state;
- the staleness policies (server/stepping.py, compensation.py): DC-ASGD and Gap-Aware keep
  ``HISTORY_VERSIONS`` past weights (Gap-Aware also its step sizes), and every policy that
  changes gradients makes a new one per update of a pass (at most the pool's).

The data, the interpreter and short-lived temporaries come on top: the refusal says
"about". A policy changed at run time (server/http.py) is not foreseen here.
"""

from __future__ import annotations

from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.memory import WORD32, MemoryNeed
from snet.protocol.staleness import StalenessSetting
from snet.transport.host_memory import available_bytes

from .compensation import HISTORY_VERSIONS

RULE_COPIES = 4  # weights, the next step's weights, velocity, spare velocity
NP_RULE_COPIES = 6  # the above, and the slice master's element and momentum
LOOKAHEAD_COPIES = 2  # bmuf's published look-ahead point and the next step's


def server_need(job: JobSpec, pool_size: int) -> MemoryNeed:
    """About what the server holds for ``job`` with a pool of ``pool_size`` elements."""
    newbob = job.schedule == "newbob"
    lookahead = job.mode == "bmuf" and job.block_filter in ("nbm", "nesterov")
    staleness = StalenessSetting.parse(job.staleness)
    # the arrays a checkpoint's state holds: weights, velocity, newbob's best, bmuf's
    # snapshot and model
    state = 2 + newbob + 2 * (job.mode == "bmuf")
    copies = [
        (pool_size, f"pooled update elements (--pool-size {pool_size:,})"),
        (NP_RULE_COPIES if job.mode == "np" else RULE_COPIES, "of the update rule"),
        (LOOKAHEAD_COPIES * lookahead, f"of bmuf's {job.block_filter} look-ahead"),
        (int(newbob), "of newbob's best weights"),
        (1 + state, "while a checkpoint is written"),
    ]
    if staleness.needs_base_weights:
        history = HISTORY_VERSIONS + (staleness.policy == "gap")  # and Gap-Aware's sizes
        copies.append((history, f"of the {staleness.policy} staleness history"))
    if staleness.changes_gradients:
        copies.append((pool_size, f"of {staleness.policy}'s adjusted gradients"))
    return MemoryNeed(WORD32 * job.network.connections, tuple(copies))


def check_fits_in_memory(job: JobSpec, pool_size: int) -> None:
    """ConfigError (exit 2) when the server's estimate exceeds this machine's available
    memory; nothing is allocated or locked before it."""
    need = server_need(job, pool_size)
    refusal = need.refusal(job.network.describe(), "on this server", available_bytes())
    if refusal:
        raise ConfigError(f"{refusal}: give a smaller network or --pool-size (at least 2)")
