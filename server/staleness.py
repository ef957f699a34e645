"""``StalenessControl``: the staleness policy in force, how it changed, and the bound.

The job names the policy (``protocol/staleness.py``); the HTTP control endpoint
(server/control.py) may change it while training runs. A change takes effect at the next
step and is recorded (when, at which version and epoch, from what to what, asked by whom)
for /status and the trace. The policy's effect on gradients is the step runner's
(server/stepping.py, server/compensation.py); the bound is checked here, on the event
loop, when the step policy has chosen the steps: an update that would be applied more
than ``S`` versions after its base is refused, and its frames go back to the queue (a
version only grows, so holding it could never make it fresher). Workers that know the
bound keep at most ``max(S, 1)`` updates unsettled (client/policies.py), so this is rare.
Workers learn the policy in force from the job in their ``welcome`` and, when it changes
while they train, from a ``policy`` message: sent to each worker that said it follows
changes (``FOLLOWS_POLICY``); an older worker is not sent what it could not read, and the
server's refusals alone keep the bound for it.

State is plain attributes (``setting`` text, ``changes``) so it can be checkpointed.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from snet.protocol.job import JobSpec
from snet.protocol.messages import FOLLOWS_POLICY, PolicyChange
from snet.protocol.staleness import StalenessSetting

from .session import WorkerSession

if TYPE_CHECKING:
    from .stepping import PendingUpdate
    from .stepqueue import StepQueue

log = logging.getLogger("snet.server")

CHANGES_KEPT = 50  # the most recent policy changes /status lists


class StalenessControl:
    """The staleness policy of one server."""

    def __init__(self, job: JobSpec) -> None:
        self.job = job  # its mode says where a policy applies (protocol/modes.py)
        self.setting = StalenessSetting.parse(job.staleness)
        self.changes: list[dict[str, Any]] = []
        self.refused_stale = 0  # updates refused for lagging more than the bound
        self.revision = 0  # counts changes (the list is capped): a checkpoint is then due

    @property
    def name(self) -> str:
        return self.setting.describe()

    def job_in_force(self, job: JobSpec) -> dict[str, Any]:
        """The job a joining worker is welcomed with: with the policy in force now."""
        return dataclasses.replace(job, staleness=self.name).to_dict()

    def change(
        self, text: str, version: int, epoch: int, by: str, workers: Iterable[WorkerSession]
    ) -> dict[str, Any]:
        """Put the policy ``text`` in force from the next step and tell the ``workers``
        that follow changes; returns the record of the change (with how many workers were
        told, and how many could not be). ConfigError for a bad policy, or for any but
        ``none`` where the job's mode has no stale updates to act on (sync rounds, sync
        bmuf blocks, np): the job's own rule, as the job given at start-up was checked."""
        setting = StalenessSetting.parse(text)
        self.job.with_changes(staleness=setting.describe())  # ConfigError: not in this mode
        record = {
            "time": round(time.time(), 3),
            "version": version,
            "epoch": epoch,
            "from": self.name,
            "to": setting.describe(),
            "by": by,
        }
        if record["to"] == record["from"]:  # in force already: nothing recorded, told, saved
            return record | {"unchanged": True, "workers_told": 0, "workers_not_told": 0}
        self.setting = setting
        self.revision += 1
        workers = list(workers)
        told = [w for w in workers if FOLLOWS_POLICY in w.capabilities]
        for worker in told:
            worker.send(PolicyChange(version, setting.describe()))
        record |= {"workers_told": len(told), "workers_not_told": len(workers) - len(told)}
        self.changes = [*self.changes, record][-CHANGES_KEPT:]
        log.info("staleness policy %s -> %s (by %s, version %d; %d of %d workers told)",
                 record["from"], record["to"], by, version, len(told), len(workers))  # fmt: skip
        return record

    def refuse_over_bound(
        self,
        chosen: list[list[int]],
        steps: StepQueue,
        version: int,
        refuse: Callable[[PendingUpdate, str], None],
    ) -> bool:
        """Bounded staleness: take the ``chosen`` updates (indexes into the queue) that
        would lag more than the bound out of ``steps`` and ``refuse`` each (its frames go
        back to the queue); whether any was."""
        bases = [p.message.base_version for p in steps.queued()]
        stale = self.over_bound(chosen, bases, version)
        for index, pending in steps.remove(set(stale)):
            self.refused_stale += 1
            refuse(pending, self.reason(stale[index]))
        return bool(stale)

    def over_bound(self, groups: list[list[int]], bases: list[int], version: int) -> dict[int, int]:
        """Of the chosen steps (indexes into ``bases``, the queued updates' base versions),
        the updates bounded staleness refuses, with the staleness each would have had: the
        ``i``-th step applied is taken on ``version + i`` (counting only the steps that
        keep an update)."""
        if self.setting.policy != "bounded":
            return {}
        refused: dict[int, int] = {}
        applied = 0
        for group in groups:
            lags = {index: version + applied - bases[index] for index in group}
            stale = {i: lag for i, lag in lags.items() if lag > self.setting.bound}
            refused |= stale
            if len(stale) < len(group):
                applied += 1
        return refused

    def reason(self, staleness: int) -> str:
        return (
            f"bounded staleness: update would be {staleness} versions stale, "
            f"the bound is {self.setting.bound}"
        )

    def checkpoint_state(self) -> dict[str, Any]:
        """The policy in force and its history, so a restart keeps a run-time change."""
        return {
            "policy": self.name,
            "changes": list(self.changes),
            "refused_stale": self.refused_stale,
        }

    def restore_checkpoint(self, state: dict[str, Any] | None) -> None:
        """Back to ``checkpoint_state()`` (None: a checkpoint from before it was kept)."""
        if state is not None:
            self.setting = StalenessSetting.parse(state["policy"])
            self.changes = list(state["changes"])[-CHANGES_KEPT:]
            self.refused_stale = int(state["refused_stale"])

    def figures(self) -> dict[str, Any]:
        """For /status."""
        return {
            "policy": self.name,
            "changes": list(self.changes),
            "refused_stale": self.refused_stale,
        }
