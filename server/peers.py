"""``peer_address``: the address a connection came from, one string per host.

The per-address bounds on both ports (server/admission.py, server/http_guard.py) count
connections by it, as nginx's ``limit_conn`` counts by ``$binary_remote_addr``: an IPv4
address, or a whole IPv6 address (not its /64: a host may hold many, and a bound per
prefix would lump a site's machines together), written canonically so that one host is
one key however its address was spelt, and an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``,
what a dual-stack socket reports for an IPv4 peer) is the IPv4 address it maps. A peer
behind a reverse proxy or NAT is the proxy's address: the help of the bounds says how to
raise or disable them there.
"""

from __future__ import annotations

import ipaddress


def peer_address(peername: object) -> str:
    """The host part of a transport's ``peername`` (``(host, port)`` or, for IPv6,
    ``(host, port, flowinfo, scope_id)``), canonical; anything else as text (a Unix
    socket's path, or "?" when the transport knows none)."""
    if not isinstance(peername, tuple) or not peername:
        return str(peername) if peername else "?"
    host = str(peername[0])
    if ":" not in host:
        return host  # IPv4 as the kernel writes it: already canonical
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return str(address.ipv4_mapped)
    return str(address)
