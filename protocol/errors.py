"""The exception tree shared by every part of snet.

::

    SnetError                      anything snet raises on purpose
    ├── ConfigError                a bad job, network or process configuration
    ├── ListenError                the server cannot listen on a configured address
    ├── DataError                  a data set that cannot be used (missing, wrong shape)
    ├── ProtocolError              the peer broke the wire protocol; the connection is lost
    │   ├── FrameError             a frame that cannot be decoded
    │   │   ├── FrameTooLarge      declared sizes over the configured limits
    │   │   └── MalformedFrame     bad magic, bad msgpack, missing or mistyped fields
    │   ├── UnknownMessage         a message type this version does not know
    │   └── VersionMismatch        the peer speaks another protocol version
    ├── AuthError                  the shared-token proof is missing or wrong
    ├── RejectedUpdate             an update that is refused (shape, NaN, stale lease);
    │                              the connection survives, the update is not applied
    └── RemoteError                the peer sent an Error message

Errors are translated where they cross a layer: the transports turn socket errors into
connection loss, the decoder turns msgpack errors into ``MalformedFrame``. No name here
reuses a built-in exception's name.
"""

from __future__ import annotations


class SnetError(Exception):
    """Base of every exception snet raises on purpose."""


class ConfigError(SnetError):
    """A configuration that cannot be run (network, job, process settings)."""


class DataError(SnetError):
    """Training data that cannot be used: missing file, wrong dimension, bad labels."""


class ListenError(SnetError):
    """The server cannot open a port it was told to listen on (in use, no such address)."""


class ProtocolError(SnetError):
    """The peer broke the wire protocol; the connection cannot continue."""

    code = "protocol"


class FrameError(ProtocolError):
    """A frame that cannot be decoded."""

    code = "bad_frame"


class FrameTooLarge(FrameError):
    """A frame whose declared header or payload size is over the configured limit."""

    code = "frame_too_large"


class MalformedFrame(FrameError):
    """Bad magic, undecodable header, or header fields missing or of the wrong type."""

    code = "malformed_frame"


class UnknownMessage(ProtocolError):
    """A message type this protocol version does not define."""

    code = "unknown_message"


class VersionMismatch(ProtocolError):
    """The peer speaks a different protocol version."""

    code = "version_mismatch"


class AuthError(SnetError):
    """The shared-token proof is missing or wrong."""

    code = "auth_failed"


class RejectedUpdate(SnetError):
    """An update refused by the server (wrong shape, NaN/Inf, unknown lease, ...).

    The connection survives; the update is counted and never applied.
    """

    code = "update_rejected"


class RemoteError(SnetError):
    """The peer sent an Error message; ``code`` and the text say what it refused."""

    def __init__(self, code: str, text: str) -> None:
        super().__init__(f"{code}: {text}")
        self.code = code
        self.text = text
