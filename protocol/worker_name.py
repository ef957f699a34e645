"""``name_problem``: the rule for a worker's name, which both sides check.

A name goes into the server's logs, ``/status`` and ``/metrics`` labels, so it is short
and printable (a newline would forge log lines). The server refuses a Hello whose name
breaks the rule; a worker checks its own ``--name`` before it connects, so that the
mistake is one line at start-up rather than a refusal (or, for a name too long for a
frame's header, a protocol error) from the server.
"""

from __future__ import annotations

NAME_CHARS = 64  # a worker name's length


def name_problem(name: str) -> str:
    """Why a worker name cannot be used ("" if it can)."""
    if len(name) > NAME_CHARS:
        return f"worker name is {len(name)} characters long, over {NAME_CHARS}"
    if not name.isprintable():
        return f"worker name {name!r} has characters that are not printable"
    return ""
