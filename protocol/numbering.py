"""Numbers as people read and write them: epochs counted from 1, counts with their noun,
sizes in their unit, and the numbers in settings' texts (``bounded:2``, ``topk:0.01``) in
plain ASCII digits.

Inside snet epochs count from 0: the wire protocol's ``lease``, ``evaluate`` and
``eval_result`` messages, checkpoints, the trace file and the hooks' events (``BunchEvent``,
``EpochEvent``, ``before_epoch``) keep the index they always had, so that old peers,
checkpoints and traces stay valid. Whatever a person reads counts from 1: log lines,
/status, /control's records, /metrics, the dashboard and the command line's output. The
conversion is made only by ``shown_epoch``, where a number leaves for a reader.
"""

from __future__ import annotations

import re

# Python's int() and float() also take "1_0" and other scripts' digits ("٣" is 3): a
# policy given as "bounded:1_0" ran as bounded:10, said back in another spelling
_PLAIN_INT = re.compile(r"[0-9]+")
_SIGNED_INT = re.compile(r"[+-]?[0-9]+")
# nan and inf as float() spells them: the settings' own checks refuse them by name
_PLAIN_FLOAT = re.compile(
    r"[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)", re.IGNORECASE
)


def shown_epoch(epoch: int) -> int:
    """The number a reader sees for the 0-based epoch index ``epoch``."""
    return epoch + 1


def counted(number: int, noun: str, plural: str = "") -> str:
    """``number`` and its noun, as a reader says them: "1 epoch", "2 epochs", "3 classes"
    (``plural``: when it is not the noun and an s)."""
    return f"{number} {noun if number == 1 else plural or noun + 's'}"


def is_plain_int(text: str) -> bool:
    """``text`` is a whole number of ASCII digits (``str.isdigit`` also takes "²", which
    ``int`` refuses, and other scripts' digits, which it takes)."""
    return _PLAIN_INT.fullmatch(text) is not None


def plain_int(text: str, signed: bool = False) -> int:
    """``text`` (spaces around it aside, as ``int`` takes them) as a whole number of ASCII
    digits, with a sign if ``signed``; ``ValueError`` for anything else."""
    text = text.strip()
    if not (_SIGNED_INT if signed else _PLAIN_INT).fullmatch(text):
        raise ValueError(f"not a whole number: {text!r}")
    return int(text)


def plain_float(text: str) -> float:
    """``text`` (spaces around it aside) as a decimal number in ASCII (``0.04``, ``.5``,
    ``-1e-3``, or ``nan``/``inf`` as ``float`` reads them: whoever reads a setting says
    why it cannot be one); ``ValueError`` for anything else (``1_0``, other scripts'
    digits)."""
    text = text.strip()
    if not _PLAIN_FLOAT.fullmatch(text):
        raise ValueError(f"not a number: {text!r}")
    return float(text)


def amount(count: int) -> str:
    """``count`` bytes as a refusal says it: in GiB from 1 GiB up, else in MiB or KiB,
    with one decimal (where "0.0 GiB" would hide the figure)."""
    for unit, name in ((1 << 30, "GiB"), (1 << 20, "MiB")):
        if count >= unit:
            return f"{count / unit:.1f} {name}"
    return f"{count / 1024:.1f} KiB"
