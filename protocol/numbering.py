"""Epoch numbers as people read them: counted from 1.

Inside snet epochs count from 0: the wire protocol's ``lease``, ``evaluate`` and
``eval_result`` messages, checkpoints, the trace file and the hooks' events (``BunchEvent``,
``EpochEvent``, ``before_epoch``) keep the index they always had, so that old peers,
checkpoints and traces stay valid. Whatever a person reads counts from 1: log lines,
/status, /control's records, /metrics, the dashboard and the command line's output. The
conversion is made only by ``shown_epoch``, where a number leaves for a reader.
"""

from __future__ import annotations


def shown_epoch(epoch: int) -> int:
    """The number a reader sees for the 0-based epoch index ``epoch``."""
    return epoch + 1
