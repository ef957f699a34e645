"""Proof of a shared token without sending it: HMAC-SHA256 over the server's nonce.

The server sends a fresh random nonce in ``ServerHello``; the worker answers with
``proof(token, nonce)``; the server compares in constant time. The token itself never
crosses the wire, and a recorded proof is useless against another nonce.
"""

from __future__ import annotations

import hashlib
import hmac

NONCE_BYTES = 32


def proof(token: str, nonce: bytes) -> bytes:
    """The proof a worker holding ``token`` sends for ``nonce``."""
    return hmac.new(token.encode("utf-8"), b"snet-hello\x00" + nonce, hashlib.sha256).digest()


def verify(token: str, nonce: bytes, claimed: bytes) -> bool:
    """True when ``claimed`` proves knowledge of ``token`` for this ``nonce``."""
    return hmac.compare_digest(proof(token, nonce), claimed)
