"""The exception tree shared by every part of snet.

::

    SnetError                      anything snet raises on purpose
    ├── ConfigError                a bad job, network or process configuration
    ├── ListenError                the server cannot listen on a configured address
    ├── OutDirInUse                another server holds the out-dir's lock
    ├── ResultsNotWritten          trained weights that could not be written (a full disk)
    ├── OutputNotWritten           standard output that cannot take a command's output
    │                              (a full disk, a terminal gone; not a reader gone: that
    │                              stays BrokenPipeError, as Python raises it)
    ├── DataError                  a data set that cannot be used (missing, wrong shape)
    ├── ProtocolError              the peer broke the wire protocol; the connection is lost
    │   ├── FrameError             a frame that cannot be decoded
    │   │   ├── FrameTooLarge      declared sizes over the configured limits
    │   │   └── MalformedFrame     bad magic, bad msgpack, missing or mistyped fields
    │   ├── OutOfTurn              a message the conversation does not allow now
    │   ├── UnknownMessage         a message type this version does not know
    │   ├── UnknownCodec           a worker asked for a codec the server does not know
    │   └── VersionMismatch        the peer speaks another protocol version
    ├── LocalProtocolError         this side tried to send out of turn: a bug, not the peer
    ├── TransportError             the connection itself failed, not what came over it
    │   ├── ConnectionLost         the peer or the link went away (socket error, EOF)
    │   ├── ServerUnreachable      no connection to the server within the retry window
    │   └── TlsRefused             the server's certificate untrusted, or ours refused
    ├── AuthError                  the shared-token proof is missing or wrong
    ├── CodecError                 an encoded element that does not fit its codec and
    │                              layout (part count or shape, index, NaN scale)
    ├── RejectedUpdate             an update that is refused (shape, NaN, stale lease,
    │                              bad encoding); the connection survives, the update
    │                              is not applied
    └── RemoteError                the peer sent an Error message

Errors are translated where they cross a layer: the transport (transport/stream.py and
transport/dial.py) turns socket errors into ``ConnectionLost`` and
``ServerUnreachable``, the decoder turns msgpack errors into ``MalformedFrame``, the
conversation (conversation.py) raises ``OutOfTurn`` for the peer and
``LocalProtocolError`` for this side. No name here reuses a built-in exception's name.
"""

from __future__ import annotations


class SnetError(Exception):
    """Base of every exception snet raises on purpose."""


class ConfigError(SnetError):
    """A configuration that cannot be run (network, job, process settings)."""


class DataError(SnetError):
    """Training data that cannot be used: missing file, wrong dimension, bad labels."""


class TrainingDiverged(SnetError):
    """A job whose steps can no longer be taken: every gradient not finite (``snet train``;
    the server says the same of updates it refuses, server/divergence.py)."""


# Steps (snet train) or updates (the server) refused in a row, none taken, after which a
# run has diverged: the next ones are computed on the same weights and are refused too.
DIVERGED_AFTER = 100


class ListenError(SnetError):
    """The server cannot open a port it was told to listen on (in use, no such address)."""


class OutDirInUse(SnetError):
    """Another running server holds the lock of the out-dir this one was given, or the pid
    file it was given names a live process: exit 1, an error to retry (2 says a setting
    to mend, which systemd's units do not restart)."""


class OutDirUnwritable(SnetError):
    """The out-dir cannot be written for now (a full disk, an I/O error): exit 1, an
    error to retry, not a setting to mend (exit 2, which systemd's units do not restart)."""


class ResultsNotWritten(SnetError):
    """Trained weights that could not be written (a full disk, the out-dir removed)."""


class OutputNotWritten(SnetError):
    """What a command printed could not be written to standard output (cli/output.py):
    not an ``OSError``, so that a handler of a file's or a socket's errors never takes it
    for one of those."""


class ProtocolError(SnetError):
    """The peer broke the wire protocol; the connection cannot continue."""

    code = "protocol"


class FrameError(ProtocolError):
    """A frame that cannot be decoded."""

    code = "bad_frame"


class FrameTooLarge(FrameError):
    """A frame whose declared header or payload size is over the configured limit.

    A payload over the limit carries its size and the limit (``payload_bytes``,
    ``limit_bytes``), so that a receiver can tell its own setting from the peer's fault."""

    code = "frame_too_large"

    def __init__(
        self, text: str, payload_bytes: int | None = None, limit_bytes: int | None = None
    ) -> None:
        super().__init__(text)
        self.payload_bytes = payload_bytes
        self.limit_bytes = limit_bytes


class MalformedFrame(FrameError):
    """Bad magic, undecodable header, or header fields missing or of the wrong type."""

    code = "malformed_frame"


class TlsOnPlainPort(MalformedFrame):
    """The first bytes are a TLS handshake, on a port that does not serve TLS: a worker
    given ``--tls-ca``, or one asking whether the port wants TLS (client/port_probe.py),
    not a hostile peer's damaged frame."""


class OutOfTurn(ProtocolError):
    """The peer sent a message its side may not send in the conversation's current state
    (anything but ``hello`` first, a server-only message from a worker, ...)."""

    code = "protocol"


class LocalProtocolError(SnetError):
    """This side tried to send a message out of turn: a bug in snet, never the peer's
    fault (not a ``ProtocolError``, so that nothing mistakes it for the peer's)."""


class TransportError(SnetError):
    """The connection itself failed: a socket error, the peer gone, no route."""


class ConnectionLost(TransportError):
    """The peer or the link went away (reset, EOF, silence); a worker reconnects."""


class ServerUnreachable(TransportError):
    """No connection to the server could be made within the retry window."""


class TlsRefused(TransportError):
    """TLS failed for good: the server's certificate is not trusted, or it refused ours."""


class UnknownMessage(ProtocolError):
    """A message type this protocol version does not define."""

    code = "unknown_message"


class UnknownCodec(ProtocolError):
    """A worker asked, in its Hello, for a codec this server does not know."""

    code = "unknown_codec"


class VersionMismatch(ProtocolError):
    """The peer speaks a different protocol version."""

    code = "version_mismatch"


class AuthError(SnetError):
    """The shared-token proof is missing or wrong."""

    code = "auth_failed"


class CodecError(SnetError):
    """An encoded element that cannot be decoded: wrong number of parts, a part of the
    wrong dtype or shape, an index out of range or out of order, a NaN scale."""

    code = "bad_encoding"


class SlotOverwritten(CodecError):
    """The weights board's slot named in a frame holds a newer version by the time the
    worker reads it (the server went round its slots meanwhile): expected of a worker
    that fell behind on a busy machine, and mended with a full copy."""


class RejectedUpdate(SnetError):
    """An update refused by the server (wrong shape, NaN/Inf, unknown lease, ...).

    The connection survives; the update is counted and never applied. ``lease_id`` and
    ``offset`` name the refused update (-1 when not yet known, or not an update); they
    travel in the error frame. ``numeric``: refused for its numbers (not finite, beyond
    the plausible), what a diverging job sends, not for whom or when it was sent.
    """

    code = "update_rejected"

    def __init__(
        self, text: str, lease_id: int = -1, offset: int = -1, numeric: bool = False
    ) -> None:
        super().__init__(text)
        self.lease_id = lease_id
        self.offset = offset
        self.numeric = numeric


class RemoteError(SnetError):
    """The peer sent an Error message; ``code`` and the text say what it refused."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text


class RefusedHere(RemoteError):
    """This side refused what the peer asked (a worker that cannot run the server's job,
    ``bad_job``) and told it so: the same ending as the peer's refusal, but its cause is
    here, and the log must not blame the peer."""
