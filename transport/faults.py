"""The fault switch: deterministic faults injected on purpose, for tests (ps-lite's
``PS_DROP_MSG``, torchft's ``EventInjector``).

A process is told its faults as one string (the ``faults`` setting: ``SNET_FAULTS`` for a
server, ``SNET_WORKER_FAULTS`` for a worker, or the TOML key), rules separated by ``;``::

    drop:update:5            the 5th update this process sends never leaves it
    corrupt:weights:9        the 9th weights it receives arrives damaged
    duplicate:lease:2        the 2nd lease arrives twice
    delay:weights:3:0.5      the 3rd weights, and everything after it, 0.5 s late
    drop:receive:heartbeat:4 a kind both sides send needs its direction
    cut:send:65536           the connection is cut once 65536 bytes have been sent

``ACTION:[DIRECTION:]KIND:N[:SECONDS]``: ``N`` counts the messages of ``KIND`` in that
direction over the process's life, from 1, across reconnections; each rule fires once.
The direction may be left out when this side only sends, or only receives, that kind.
What each action does (``transport/stream.py`` applies them):

- ``drop``: the message is lost on the way (the conversation still counts it as sent).
- ``duplicate``: it arrives twice.
- ``corrupt``: it arrives with a broken frame prefix; the receiver refuses it as
  ``malformed_frame`` and closes the connection (the protocol has no checksum: a damaged
  payload would not be noticed, so the fault damages what the receiver checks).
- ``delay``: it and everything after it on that connection wait ``SECONDS`` (default 1);
  TCP keeps order, so a late frame holds up the ones behind it, as on a stalled link.
- ``cut``: the connection is aborted once ``N`` bytes have gone in that direction.

With no rules the transport holds no switch at all and pays nothing per message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from snet.protocol.conversation import Role, senders
from snet.protocol.errors import ConfigError
from snet.protocol.messages import MESSAGE_TYPES
from snet.protocol.numbering import is_plain_int

ACTIONS = ("drop", "duplicate", "corrupt", "delay", "cut")
DIRECTIONS = ("send", "receive")
SYNTAX = "ACTION:[DIRECTION:]KIND:N[:SECONDS] or cut:DIRECTION:BYTES"


@dataclass(frozen=True)
class FaultRule:
    """One fault: ``action`` on the ``nth`` message of ``kind`` going ``direction`` (for
    ``cut``: once ``nth`` bytes have gone that way; ``kind`` is empty)."""

    action: str
    direction: str
    kind: str
    nth: int
    seconds: float = 1.0

    def __str__(self) -> str:
        if self.action == "cut":
            return f"cut:{self.direction}:{self.nth}"
        return f"{self.action}:{self.direction}:{self.kind}:{self.nth}"


def parse_faults(text: str, role: Role) -> tuple[FaultRule, ...]:
    """The rules in ``text`` for a process playing ``role``; ``ConfigError`` names the
    rule that is wrong and why."""
    return tuple(_parse_rule(rule.strip(), role) for rule in text.split(";") if rule.strip())


def _parse_rule(rule: str, role: Role) -> FaultRule:
    def bad(why: str) -> ConfigError:
        return ConfigError(f"fault {rule!r}: {why} (write {SYNTAX})")

    parts = rule.split(":")
    action = parts[0]
    if action not in ACTIONS:
        raise bad(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
    if action == "cut":
        if len(parts) != 3 or parts[1] not in DIRECTIONS:
            raise bad("cut takes a direction (send or receive) and a byte count")
        return FaultRule("cut", parts[1], "", _count(parts[2], bad))
    direction = parts[1] if len(parts) > 1 and parts[1] in DIRECTIONS else ""
    rest = parts[2:] if direction else parts[1:]
    if len(rest) not in (2, 3) or (len(rest) == 3 and action != "delay"):
        raise bad("expected a message kind and a count" + (" (and seconds)" * (action == "delay")))
    kind, nth = rest[0], _count(rest[1], bad)
    if kind not in MESSAGE_TYPES:
        raise bad(f"unknown message kind {kind!r}; one of {', '.join(sorted(MESSAGE_TYPES))}")
    ways = {"send" if sender is role else "receive" for sender in senders(kind)}
    if not direction:
        if len(ways) != 1:
            raise bad(f"a {role.value} both sends and receives {kind}: say send or receive")
        direction = ways.pop()
    elif direction not in ways:
        raise bad(f"a {role.value} never {'sends' if direction == 'send' else 'receives'} {kind}")
    seconds = 1.0
    if len(rest) == 3:
        try:
            seconds = float(rest[2])
        except ValueError:
            raise bad(f"delay seconds {rest[2]!r} is not a number") from None
        if not 0 <= seconds <= 3600:
            raise bad("delay seconds must be between 0 and 3600")
    return FaultRule(action, direction, kind, nth, seconds)


def _count(text: str, bad: Callable[[str], ConfigError]) -> int:
    if not is_plain_int(text) or int(text) < 1:
        raise bad(f"count {text!r} is not a whole number from 1 up")
    return int(text)


@dataclass
class FaultSwitch:
    """Counts a process's messages and bytes per direction; says which rule hits which.

    One switch serves every connection of the process, so counts run across reconnections
    and a rule fires once."""

    rules: tuple[FaultRule, ...]
    injected: list[str] = field(default_factory=list)  # what fired, in order, for logs/tests
    _messages: dict[tuple[str, str], int] = field(default_factory=dict)
    _bytes: dict[str, int] = field(default_factory=dict)

    @classmethod
    def from_text(cls, text: str, role: Role) -> FaultSwitch | None:
        """The switch for ``text``, or None when it names no fault (the switch is off)."""
        rules = parse_faults(text, role)
        return cls(rules) if rules else None

    def message(self, direction: str, kind: str) -> FaultRule | None:
        """Count one message; the rule that hits it, if any."""
        key = (direction, kind)
        count = self._messages[key] = self._messages.get(key, 0) + 1
        for rule in self.rules:
            if (rule.direction, rule.kind, rule.nth) == (direction, kind, count):
                self.injected.append(str(rule))
                return rule
        return None

    def passing(self, direction: str, nbytes: int) -> int | None:
        """Count ``nbytes`` going ``direction``; None when they all pass, else how many
        pass before a ``cut`` rule cuts the connection."""
        before = self._bytes.get(direction, 0)
        after = self._bytes[direction] = before + nbytes
        for rule in self.rules:
            if rule.action == "cut" and rule.direction == direction and before < rule.nth <= after:
                self.injected.append(str(rule))
                return rule.nth - before
        return None
