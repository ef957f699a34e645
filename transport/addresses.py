"""Addresses: where a server listens, and who its peers are.

``dual_stack_socket``: ``::`` means every address of both families, as it does to the
other servers a user knows (nginx's ``[::]``, the kernel's ``bindv6only = 0``). asyncio's
``create_server`` sets ``IPV6_V6ONLY`` on every IPv6 socket it makes, so a server told
``--host ::`` took IPv6 connections only and refused each IPv4 worker and browser; for
``::`` one dual-stack socket is made here instead. Every other host, ``""`` included (one
socket a family), is asyncio's to bind.

``peer_address``: the address a connection came from, one string per host. The
per-address bounds on both ports (server/admission.py, server/http_guard.py) count
connections by it, as nginx's ``limit_conn`` counts by ``$binary_remote_addr``: an IPv4
address, or a whole IPv6 address (not its /64: a host may hold many, and a bound per
prefix would lump a site's machines together), written canonically so that one host is
one key however its address was spelt, and an IPv4-mapped IPv6 address (``::ffff:a.b.c.d``,
what a dual-stack socket reports for an IPv4 peer) is the IPv4 address it maps. A peer
behind a reverse proxy or NAT is the proxy's address: the help of the bounds says how to
raise or disable them there. ``peer_text`` adds the port, as logs and /status show a peer.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
import ssl
from collections.abc import Callable

ALL_ADDRESSES_V6 = "::"
BACKLOG = 100  # asyncio's own default for the sockets it makes


def dual_stack_socket(host: str, port: int) -> socket.socket | None:
    """A listening socket on ``port`` taking IPv4 and IPv6 when ``host`` is ``::`` and the
    machine has both; None otherwise (the caller binds ``host`` as it would). Raises
    ``OSError`` as binding does (the port taken, say)."""
    if host != ALL_ADDRESSES_V6 or not socket.has_dualstack_ipv6():
        return None
    return socket.create_server(
        (host, port), family=socket.AF_INET6, backlog=BACKLOG, dualstack_ipv6=True
    )


async def start_listening(
    make_protocol: Callable[[], asyncio.BaseProtocol],
    host: str,
    port: int,
    tls: ssl.SSLContext | None,
    handshake_seconds: float | None,
    sock: socket.socket | None = None,
) -> asyncio.Server:
    """The running loop's server for ``make_protocol`` on ``sock`` when one is given (a
    socket already listening), else on ``host`` and ``port`` (``::`` dual-stack)."""
    loop = asyncio.get_running_loop()
    made = None if sock else dual_stack_socket(host, port)
    listening = sock or made
    if listening is not None:
        try:
            return await loop.create_server(
                make_protocol, sock=listening, ssl=tls, ssl_handshake_timeout=handshake_seconds
            )
        except BaseException:
            if made is not None:
                made.close()  # its own: the caller's stays the caller's to close
            raise
    return await loop.create_server(
        make_protocol, host or None, port, ssl=tls, ssl_handshake_timeout=handshake_seconds
    )


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


def peer_text(peername: object) -> str:
    """A transport's ``peername`` as ``host:port`` (``[host]:port`` for IPv6, whose colons
    would run into the port's), its host as ``peer_address`` writes it."""
    host = peer_address(peername)
    if not isinstance(peername, tuple) or len(peername) < 2:
        return host
    return f"[{host}]:{peername[1]}" if ":" in host else f"{host}:{peername[1]}"
