"""Numbers as people read them: epochs counted from 1, counts with their noun.

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


def counted(number: int, noun: str, plural: str = "") -> str:
    """``number`` and its noun, as a reader says them: "1 epoch", "2 epochs", "3 classes"
    (``plural``: when it is not the noun and an s)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"
