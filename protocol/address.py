"""``split_host_port``: a server's address as users give it, ``HOST:PORT``.

A worker's ``--server`` and ``snet status --url`` without a scheme both take it; an IPv6
host may come bracketed (``[::1]:7000``) or bare, as the server logs it (``::1:7000``):
the port is what follows the last colon.
"""

from __future__ import annotations

import ipaddress

from .numbering import is_plain_int


def split_host_port(text: str) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT``; ``ValueError`` without a host, with a port that is
    not a whole number from 1 to 65535 (no server listens on port 0), or with a host
    holding a colon that is no IPv6 address (``::1`` alone, its port left out)."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not is_plain_int(port) or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r} is not HOST:PORT with a port from 1 to 65535")
    if ":" in host and not _is_ipv6(host):
        raise ValueError(f"{text!r} is not HOST:PORT (IPv6: ::1:7080 or [::1]:7080)")
    return host, int(port)


def _is_ipv6(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).version == 6
    except ValueError:
        return False
