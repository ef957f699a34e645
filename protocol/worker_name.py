"""``name_problem``: the rule for a worker's name, which both sides check; ``printable``:
any other text of a peer's as a log line or a table shows it.

A name goes into the server's logs, ``/status`` and ``/metrics`` labels, so it is short
and printable (a newline would forge log lines). The server refuses a Hello whose name
breaks the rule; a worker checks its own ``--name`` before it connects, so that the
mistake is one line at start-up rather than a refusal (or, for a name too long for a
frame's header, a protocol error) from the server.

Other words a peer sends (a goodbye's reason, an error's code and text, its backend's
name, why it asks for a copy of the weights) are kept as sent, but shown through
``printable``: a newline in them wrote a whole forged line into the server's log
("... ERROR snet.server: FORGED"), and an ESC drove the operator's terminal from
``snet status``.
"""

from __future__ import annotations

NAME_CHARS = 64  # a worker name's length
# The C0 controls (newline, carriage return, ESC...), DEL and the C1 controls, the line and
# paragraph separators, and the bidirectional controls (which reorder what a reader sees)
_CONTROLS = (*range(0x20), 0x7F, *range(0x80, 0xA0), 0x2028, 0x2029, *range(0x202A, 0x202F),
             *range(0x2066, 0x206A))  # fmt: skip
_ESCAPES = {code: f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" for code in _CONTROLS}


def printable(text: str) -> str:
    """``text`` with its control characters written as escapes (a newline as ``\\x0a``)."""
    return text.translate(_ESCAPES)


def name_problem(name: str) -> str:
    """Why a worker name cannot be used ("" if it can)."""
    if len(name) > NAME_CHARS:
        return f"worker name is {len(name)} characters long, over {NAME_CHARS}"
    if not name.isprintable():
        return f"worker name {name!r} has characters that are not printable"
    return ""
