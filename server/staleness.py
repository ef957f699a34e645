"""``StalenessControl``: the staleness policy in force, how it changed, and the bound.

The job names the policy (``protocol/staleness.py``); the HTTP control endpoint
(server/http.py) may change it while training runs. A change takes effect at the next
step and is recorded (when, at which version and epoch, from what to what, asked by whom)
for /status and the trace. The policy's effect on gradients is the step runner's
(server/stepping.py, server/compensation.py); the bound is checked here, on the event
loop, when the step policy has chosen the steps: an update that would be applied more
than ``S`` versions after its base is refused, and its frames go back to the queue (a
version only grows, so holding it could never make it fresher). Workers that know the
bound from the job keep at most ``max(S, 1)`` updates unsettled (client/policies.py), so
this is rare.

State is plain attributes (``setting`` text, ``changes``) so it can be checkpointed.
"""

from __future__ import annotations

import time
from typing import Any

from snet.protocol.errors import ConfigError
from snet.protocol.staleness import StalenessSetting

CHANGES_KEPT = 50  # the most recent policy changes /status lists


class StalenessControl:
    """The staleness policy of one server."""

    def __init__(self, text: str, mode: str) -> None:
        self.mode = mode
        self.setting = StalenessSetting.parse(text)
        self.changes: list[dict[str, Any]] = []
        self.refused_stale = 0  # updates refused for lagging more than the bound

    @property
    def name(self) -> str:
        return self.setting.describe()

    def change(self, text: str, version: int, epoch: int, by: str) -> dict[str, Any]:
        """Put the policy ``text`` in force from the next step; returns the record of the
        change. ConfigError for a bad policy, or for any but ``none`` in sync mode (every
        sync update is on the current version: there is no staleness to act on)."""
        setting = StalenessSetting.parse(text)
        if self.mode == "sync" and setting.policy != "none":
            raise ConfigError("sync mode has no stale updates: only 'none' applies")
        record = {
            "time": round(time.time(), 3),
            "version": version,
            "epoch": epoch,
            "from": self.name,
            "to": setting.describe(),
            "by": by,
        }
        self.setting = setting
        self.changes = [*self.changes, record][-CHANGES_KEPT:]
        return record

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

    def figures(self) -> dict[str, Any]:
        """For /status."""
        return {
            "policy": self.name,
            "changes": list(self.changes),
            "refused_stale": self.refused_stale,
        }
