"""TLS for both ports, with the standard library's ``ssl`` (issue 12).

The server presents ``--tls-cert``/``--tls-key`` on its worker port and its HTTP port;
workers verify it against ``--tls-ca`` (the host name they connect to must be in the
certificate). With ``--tls-client-ca`` the worker port also asks every worker for a
certificate signed by that CA (mutual TLS); the HTTP port never does (browsers and
``snet status`` carry the token instead). ``snet tls init`` makes a private CA and these
certificates for a small cluster (transport/certificates.py).

A worker whose CA does not sign the server's certificate, or whose own certificate the
server refuses, is refused for good (exit 4): retrying cannot cure either.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
import ssl
from pathlib import Path

from snet.protocol.errors import ConfigError

from .files import read_at_most

log = logging.getLogger("snet")


def warn_if_shared(path: str, what: str) -> None:
    """A warning when the secret in ``path`` (a token file, a TLS key) can be read by other
    users of the machine: accepted silently before, where the docs ask for mode 600."""
    try:
        mode = Path(path).stat().st_mode & 0o777
    except OSError:
        return  # said where it is read
    if mode & 0o077:
        log.warning("%s %s can be read by other users of this machine (mode %03o): "
                    "chmod 600 it", what, path, mode)  # fmt: skip


EXPIRY_WARNING_DAYS = 7  # a certificate this close to its end is said at start too


def warn_if_expiring(cert: str, what: str) -> None:
    """A warning when the certificate in ``cert`` has expired or soon will: a server with
    an expired one started without a word, and every worker was then refused. Read with
    ``cryptography`` where it is installed (the standard library reads no dates)."""
    try:
        from cryptography import x509
    except ImportError:
        return
    try:
        loaded = x509.load_pem_x509_certificate(Path(cert).read_bytes())
    except (OSError, ValueError):
        return  # ssl accepted it: not ours to judge
    start, end = loaded.not_valid_before_utc, loaded.not_valid_after_utc
    now = datetime.datetime.now(datetime.UTC)
    left = end - now
    if now < start:  # every worker was refused, "certificate is not yet valid", unwarned
        log.warning("%s %s is not valid before %s: peers will refuse it until then", what,
                    cert, start)  # fmt: skip
    elif left.total_seconds() <= 0:
        log.warning("%s %s expired on %s: peers will refuse it (snet tls init makes new "
                    "ones)", what, cert, end.date())  # fmt: skip
    elif left.days < EXPIRY_WARNING_DAYS:
        log.warning("%s %s expires on %s", what, cert, end.date())


TOKEN_FILE_BYTES = 4096  # a token is a few dozen characters


def token_in_sight(variables: tuple[str, ...]) -> str:
    """What to say of a token that came from neither its file nor one of the environment
    ``variables``, the ways that keep it out of ps and config files ("" if it did)."""
    if any(name in os.environ for name in variables):
        return ""
    return (f"the token was given as a flag or in the config file; prefer --token-file or "
            f"{variables[0]} (a flag shows in ps)")  # fmt: skip


def read_token_file(path: str) -> str:
    """The shared secret kept in ``path`` (``--token-file``, on the server and on a
    worker): its text, stripped. ConfigError when it cannot be read or is empty."""
    try:
        raw = read_at_most(path, TOKEN_FILE_BYTES, f"token_file {path}", "a token")
        token = raw.decode("utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"cannot read token_file {path}: {exc}") from None
    if not token:
        raise ConfigError(f"token_file {path} is empty")
    warn_if_shared(path, "token_file")
    return token


def _load_chain(context: ssl.SSLContext, cert: str, key: str, role: str) -> None:
    """``cert`` and ``key`` into ``context`` (``_warn_chain`` says what is wrong with
    them, once however often they are loaded)."""
    for path in (cert, key):
        if not Path(path).is_file():
            raise ConfigError(f"{role} TLS file {path} does not exist")
    try:
        context.load_cert_chain(cert, key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"cannot use {cert} with {key} as a TLS certificate: {exc}") from None


def _warn_chain(cert: str, key: str, role: str) -> None:
    """A key others can read, a certificate out of date (or nearly): said, not refused."""
    warn_if_shared(key, f"{role} TLS key")
    warn_if_expiring(cert, f"{role} TLS certificate")


def _load_ca(context: ssl.SSLContext, ca: str, what: str) -> None:
    if Path(ca).is_dir():  # "does not exist" sent a user looking for a missing path
        raise ConfigError(f"{what} {ca} is a directory: give the CA's file (e.g. {ca}/ca.pem)")
    if not Path(ca).is_file():
        raise ConfigError(f"{what} {ca} does not exist")
    try:
        context.load_verify_locations(cafile=ca)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError(f"cannot read {what} {ca}: {exc}") from None


def server_context(cert: str, key: str, client_ca: str = "") -> ssl.SSLContext:
    """The worker port's context (``client_ca``: workers must show a certificate it signed);
    what is wrong with the certificate or its key said."""
    context = _server_context(cert, key, client_ca)
    _warn_chain(cert, key, "the server's")
    return context


def _server_context(cert: str, key: str, client_ca: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_chain(context, cert, key, "the server's")
    if client_ca:
        _load_ca(context, client_ca, "tls_client_ca")
        context.verify_mode = ssl.CERT_REQUIRED
        # TLS 1.3 checks a client's certificate after the client has finished its side of
        # the handshake, and a refused worker learnt it (here) only after 30 s of silence,
        # as a plain EOF, again and again; under TLS 1.2 its handshake does not complete,
        # which the worker reports as such within its retry window.
        context.maximum_version = ssl.TLSVersion.TLSv1_2
    return context


def server_contexts(
    cert: str, key: str, client_ca: str = ""
) -> tuple[ssl.SSLContext, ssl.SSLContext]:
    """The server's two contexts, of one certificate (its warnings said once): the worker
    port's (``server_context``) and the HTTP port's, which asks for no client's."""
    return server_context(cert, key, client_ca), _server_context(cert, key, "")


def client_context(ca: str, cert: str = "", key: str = "", what: str = "tls_ca") -> ssl.SSLContext:
    """A worker's context: the server must be signed by ``ca`` (named ``what`` in an
    error); ``cert`` and ``key`` are this worker's own certificate, for a server that
    asks for one."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_ca(context, ca, what)
    if cert or key:
        if not (cert and key):
            raise ConfigError("a worker's TLS certificate needs both tls_cert and tls_key")
        _load_chain(context, cert, key, "the worker's")
        _warn_chain(cert, key, "the worker's")
    return context


def refusal(exc: BaseException | None) -> str:
    """Why a TLS peer refused us, for a one-line message ("" if ``exc`` is not that)."""
    while exc is not None and not isinstance(exc, ssl.SSLError):
        exc = exc.__cause__
    if isinstance(exc, ssl.SSLCertVerificationError):
        return f"the server's certificate is not trusted: {exc.verify_message}"
    if isinstance(exc, ssl.SSLError):
        reason = getattr(exc, "reason", None) or str(exc)  # set by the ssl module, not all
        if "CERTIFICATE" in reason.upper() or "UNKNOWN_CA" in reason.upper():
            return f"the server refused this worker's certificate ({reason})"
        if "WRONG_VERSION_NUMBER" in reason.upper():  # plain bytes where TLS was expected
            return f"the server does not serve TLS ({reason}): drop --tls-ca"
        return f"TLS failed ({reason})"
    return ""


class CopyingTransport:
    """What a stream behind TLS writes to: every write is copied at once (a TLS transport
    keeps a reference to what it is given until it has encrypted it, and the streams reuse
    their buffers once a write returns), so nothing is ever pending on the stream's side;
    the TLS transport's own flow control still pauses and resumes the stream."""

    def __init__(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport

    def __getattr__(self, name: str) -> object:
        return getattr(self._transport, name)

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self._transport.write(bytes(data))  # type: ignore[attr-defined]

    def writelines(self, pieces: list[bytes | bytearray | memoryview]) -> None:
        self._transport.write(b"".join(bytes(piece) for piece in pieces))  # type: ignore[attr-defined]

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        # the stream's "pause at once" (high water 0) would never be lifted behind TLS
        self._transport.set_write_buffer_limits(high=max(high or 0, 1 << 18))  # type: ignore[attr-defined]

    def get_write_buffer_size(self) -> int:
        return 0  # copied at once: nothing of the stream's is pending


class CopyingProtocol(asyncio.Protocol):
    """A ``BufferedProtocol`` behind TLS, fed by copying.

    asyncio's and uvloop's TLS transports hand a buffered protocol its bytes unreliably
    (measured here: a worker over TLS stalled after the handshake on asyncio and after
    about a hundred updates on uvloop, waiting for bytes already decrypted). Over TLS the
    stream is therefore a plain protocol that copies what arrives into the buffers the
    stream hands out; decryption copies the bytes anyway, so this costs one more copy."""

    def __init__(self, inner: asyncio.BufferedProtocol) -> None:
        self.inner = inner
        self.transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        self.inner.connection_made(CopyingTransport(transport))  # type: ignore[arg-type]

    def data_received(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not (self.transport is None or self.transport.is_closing()):
            target = memoryview(self.inner.get_buffer(len(view))).cast("B")
            count = min(len(target), len(view))
            if count == 0:
                return
            target[:count] = view[:count]
            self.inner.buffer_updated(count)
            view = view[count:]

    def eof_received(self) -> bool | None:
        return self.inner.eof_received()

    def connection_lost(self, exc: Exception | None) -> None:
        self.inner.connection_lost(exc)

    def pause_writing(self) -> None:
        self.inner.pause_writing()

    def resume_writing(self) -> None:
        self.inner.resume_writing()
