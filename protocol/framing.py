"""Frames: a fixed prefix, a msgpack header, then the arrays as raw buffers.

::

    offset  size  field
    0       2     magic b"SN"
    2       1     protocol version (1)
    3       1     flags (0; reserved)
    4       4     header length H, unsigned big-endian
    8       8     payload length P, unsigned big-endian
    16      H     header: a msgpack map {"type": str, "arrays": [...], <fields>}
    16+H    P     payload: the arrays' raw bytes, one after another

Each entry of "arrays" is a map {"dtype": "<f4", "shape": [n, ...], "codec": "none",
"nbytes": n}; the payload is exactly the sum of their nbytes. A message whose element may
travel compressed (``ENCODABLE``) carries instead one or more arrays, the codec's parts,
whose descriptors all name the same codec (e.g. "topk:0.01"); the decoder gives it to the
message as ``Encoded`` and the receiver decodes it against its layout (codecs/). Sizes are
checked against
``FrameLimits`` before anything is allocated. Arrays are never passed through msgpack:
``encode`` returns the header bytes and the arrays' own buffers for scatter/gather
sending, and ``FrameDecoder`` can receive a payload straight into a buffer that a
``PayloadSink`` provides (a free element of a pool) and hands out numpy views of it.
"""

from __future__ import annotations

import dataclasses
import math
import struct
import typing
from dataclasses import dataclass, fields
from typing import Any, Protocol

import msgpack
import numpy as np

from . import PROTOCOL_VERSION
from .codecs import canonical
from .errors import ConfigError, MalformedFrame, UnknownMessage
from .messages import MESSAGE_TYPES, Encoded, Message

MAGIC = b"SN"
PREFIX = struct.Struct(">2sBBIQ")
PREFIX_SIZE = PREFIX.size  # 16
ALLOWED_DTYPES = frozenset({"<f4", "<f2", "<f8", "<i4", "<i8", "|u1", "|i1", "<u2", "<u4"})
ITEM_BYTES = {name: np.dtype(name).itemsize for name in ALLOWED_DTYPES}  # no dtype per frame
CODEC_NONE = "none"
NOT_IN_HEADER = frozenset({"encoded"})  # message fields that are not header fields


@dataclass(frozen=True)
class FrameLimits:
    """The largest frame a decoder accepts. Everything over is refused before allocation."""

    max_header_bytes: int = 64 * 1024
    max_payload_bytes: int = 512 * 1024 * 1024
    max_arrays: int = 64
    max_ndim: int = 8


MIB = 1024 * 1024


def mib_at_least(payload_bytes: int) -> int:
    """The smallest whole number of MiB (a ``--max-frame-mb``) that holds the payload."""
    return -(-payload_bytes // MIB)


@dataclass(frozen=True)
class ArrayInfo:
    """One entry of a header's "arrays" list, checked."""

    dtype: str
    shape: tuple[int, ...]
    codec: str
    nbytes: int


class PayloadSink(Protocol):
    """Supplies the buffer a payload is received into (e.g. a free pooled element).

    Return ``(buffer, token)`` with ``len(buffer) == payload_bytes`` to receive in place,
    or ``None`` to let the decoder allocate. The token comes back beside the message
    (``Decoded.slot``), or from ``FrameDecoder.abandon()`` if the frame never completes:
    whoever takes it owns the buffer.
    """

    def payload_target(
        self, message_type: str, arrays: tuple[ArrayInfo, ...], payload_bytes: int
    ) -> tuple[memoryview, object] | None: ...


# ---------------------------------------------------------------- encoding


DESCRIPTOR_KEYS = frozenset(("dtype", "shape", "codec", "nbytes"))


def _array_info(array: np.ndarray, codec: str = CODEC_NONE) -> dict[str, Any]:
    return {
        "dtype": array.dtype.str,
        "shape": list(array.shape),
        "codec": codec,
        "nbytes": array.nbytes,
    }


def encode(message: Message) -> list[bytes | memoryview]:
    """The frame as pieces for ``transport.writelines``: prefix+header, then each array.

    The array pieces are memoryviews of the message's own arrays (no copy): the caller
    must not change those arrays until the transport has sent them.
    """
    header: dict[str, Any] = {"type": message.TYPE}
    omitted = _OMITTED.get(message.TYPE)
    for name in _HEADER_NAMES[message.TYPE]:
        value = getattr(message, name)
        if omitted and name in omitted and value == omitted[name]:
            continue  # left out at its default: a receiver of an earlier version does not know it
        header[name] = list(value) if isinstance(value, tuple) else value
    encoded: Encoded | None = getattr(message, "encoded", None)
    codec = encoded.codec if encoded is not None else CODEC_NONE
    sources: list[Any] = (
        list(encoded.parts)
        if encoded is not None
        else [getattr(message, n) for n in message.ARRAYS]
    )
    arrays: list[Any] = [a if a.flags.c_contiguous else np.ascontiguousarray(a) for a in sources]
    header["arrays"] = [_array_info(a, codec) for a in arrays]
    header_bytes = msgpack.packb(header, use_bin_type=True)
    payload_len = sum(a.nbytes for a in arrays)
    prefix = PREFIX.pack(MAGIC, PROTOCOL_VERSION, 0, len(header_bytes), payload_len)
    pieces: list[bytes | memoryview] = [prefix + header_bytes]
    pieces.extend(memoryview(a).cast("B") for a in arrays if a.nbytes)
    return pieces


def encode_bytes(message: Message) -> bytes:
    """The whole frame as one bytes object (convenient for tests and small messages)."""
    return b"".join(bytes(piece) for piece in encode(message))


# ---------------------------------------------------------------- header checks


def _checker(annotation: Any) -> tuple[str, Any]:
    origin = typing.get_origin(annotation)
    if origin is tuple:
        return ("tuple_str", None)
    if origin is dict or annotation is dict:
        return ("dict", None)
    return ("plain", annotation)


_SCHEMAS: dict[str, dict[str, tuple[str, Any]]] = {}
_HEADER_NAMES: dict[str, tuple[str, ...]] = {}  # for encode(): fields() is slow per frame
_OPTIONAL: dict[str, set[str]] = {}  # fields added later, with defaults: may be left out
# fields the encoder leaves out at their default (metadata ``omitted_when_default``): sent
# only to a peer that knows them, which an older one, refusing unknown fields, does not
_OMITTED: dict[str, dict[str, Any]] = {}
_KNOWN_KEYS: dict[str, frozenset[str]] = {}  # what a header of the type may hold
for _name, _cls in MESSAGE_TYPES.items():
    _hints = typing.get_type_hints(_cls)
    _header_fields = [
        f for f in fields(_cls) if f.name not in _cls.ARRAYS and f.name not in NOT_IN_HEADER
    ]
    _SCHEMAS[_name] = {f.name: _checker(_hints[f.name]) for f in _header_fields}
    _HEADER_NAMES[_name] = tuple(f.name for f in _header_fields)
    _OPTIONAL[_name] = {
        f.name
        for f in _header_fields
        if f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
    }
    _omitted = {f.name: f.default for f in _header_fields if f.metadata.get("omitted_when_default")}
    if _omitted:
        _OMITTED[_name] = _omitted
    _KNOWN_KEYS[_name] = frozenset(_SCHEMAS[_name]) | {"type", "arrays"}


def _check_field(type_name: str, name: str, kind: str, expected: Any, value: Any) -> Any:
    if kind == "tuple_str":
        if isinstance(value, list) and all(isinstance(v, str) for v in value):
            return tuple(value)
    elif kind == "dict":
        if isinstance(value, dict):
            return value
    elif expected is float:
        if not isinstance(value, bool) and isinstance(value, int | float):
            return float(value)
    elif isinstance(value, expected) and not (expected is int and isinstance(value, bool)):
        return value
    # the error (and the repr in it) is built only for a bad value: this runs per field
    raise MalformedFrame(f"{type_name}.{name}: unexpected value {value!r:.60}")


# How deep a header may nest (the header map itself is level 1): msgpack's unpacker stack,
# not a setting of ours; one level more is its StackError, a fatal malformed_frame. (A
# worker report's depth of 8 is checked later, and refused without ending the connection.)
HEADER_DEPTH = 1024
# msgpack's errors that say nothing themselves (the refusal's text ended at its colon)
WORDLESS: dict[type[Exception], str] = {
    msgpack.StackError: f"nested deeper than {HEADER_DEPTH} levels",
    msgpack.FormatError: "a byte that starts no msgpack value",
}


def parse_header(data: bytes | memoryview) -> tuple[str, dict[str, Any]]:
    """Decode and check a header; returns (message type, header map)."""
    try:
        header = msgpack.unpackb(data, raw=False, strict_map_key=True)
    except Exception as exc:  # msgpack raises several unrelated types, some without words
        detail = str(exc) or WORDLESS.get(type(exc), type(exc).__name__)
        raise MalformedFrame(f"header is not valid msgpack: {detail}") from exc
    if not isinstance(header, dict):
        raise MalformedFrame("header is not a msgpack map")
    type_name = header.get("type")
    if not isinstance(type_name, str):
        raise MalformedFrame("header has no 'type' string")
    if type_name not in MESSAGE_TYPES:
        raise UnknownMessage(f"unknown message type {type_name!r:.40}")
    return type_name, header


def parse_arrays(
    type_name: str, header: dict[str, Any], payload_len: int, limits: FrameLimits
) -> tuple[ArrayInfo, ...]:
    """Check the header's array list against the message type and the payload length."""
    raw = header.get("arrays", [])
    cls = MESSAGE_TYPES[type_name]
    expected = len(cls.ARRAYS)
    if not isinstance(raw, list) or len(raw) > limits.max_arrays:
        raise MalformedFrame(f"{type_name} must carry {expected} array(s)")
    codec = _frame_codec(type_name, raw)
    if codec == CODEC_NONE and len(raw) != expected:
        raise MalformedFrame(f"{type_name} must carry {expected} array(s)")
    if codec != CODEC_NONE and not raw:
        raise MalformedFrame(f"{type_name} encoded with {codec} carries no parts")
    infos = []
    for entry in raw:
        dtype, shape = entry.get("dtype"), entry.get("shape")
        nbytes = entry.get("nbytes")
        if not isinstance(dtype, str) or dtype not in ALLOWED_DTYPES:
            raise MalformedFrame(f"array dtype {dtype!r:.20} is not allowed")
        if (
            not isinstance(shape, list)
            or len(shape) > limits.max_ndim
            or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in shape)
        ):
            raise MalformedFrame(f"bad array shape {shape!r:.60}")
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
            raise MalformedFrame("array nbytes must be a non-negative integer")
        if math.prod(shape) * ITEM_BYTES[dtype] != nbytes:  # Python ints: no overflow
            raise MalformedFrame(f"array nbytes {nbytes} does not match {dtype} {shape}")
        if math.prod(n for n in shape if n) > limits.max_payload_bytes:
            # an empty array whose other dimensions no array could have (numpy refused to
            # shape one: a ValueError's words sent back as the error's text)
            raise MalformedFrame(f"array shape {shape!r:.60} is larger than any frame")
        infos.append(ArrayInfo(dtype, tuple(shape), codec, nbytes))
    if sum(i.nbytes for i in infos) != payload_len:
        raise MalformedFrame(
            f"arrays need {sum(i.nbytes for i in infos)} bytes, payload has {payload_len}"
        )
    return tuple(infos)


def _frame_codec(type_name: str, raw: list[Any]) -> str:
    """The one codec every array descriptor of a frame names (checked), or "none"."""
    codecs = set()
    for entry in raw:
        if not isinstance(entry, dict):
            raise MalformedFrame("array descriptor is not a map")
        if not entry.keys() <= DESCRIPTOR_KEYS:  # the spec's strict check (section 3)
            extra = sorted(str(key) for key in entry.keys() - DESCRIPTOR_KEYS)
            raise MalformedFrame(f"array descriptor has unknown key(s) {extra!r:.60}")
        codec = entry.get("codec", CODEC_NONE)
        if not isinstance(codec, str):
            raise MalformedFrame(f"array codec {codec!r:.20} is not a string")
        codecs.add(codec)
    if not codecs or codecs == {CODEC_NONE}:
        return CODEC_NONE
    if len(codecs) > 1:
        raise MalformedFrame(f"arrays of one frame name several codecs: {sorted(codecs)!r:.80}")
    codec = codecs.pop()
    try:
        known = canonical(codec)
    except ConfigError:
        known = ""
    if known != codec:
        raise MalformedFrame(f"unknown array codec {codec!r:.20}")
    if not getattr(MESSAGE_TYPES[type_name], "ENCODABLE", False):
        raise MalformedFrame(f"{type_name} cannot carry an element encoded with {codec}")
    return codec


def build_message(
    type_name: str,
    header: dict[str, Any],
    arrays: tuple[ArrayInfo, ...],
    payload: memoryview,
) -> Message:
    """Construct the message object, with numpy views over ``payload`` for its arrays."""
    cls = MESSAGE_TYPES[type_name]
    schema = _SCHEMAS[type_name]
    if not header.keys() <= _KNOWN_KEYS[type_name]:
        extra = set(header) - _KNOWN_KEYS[type_name]  # str and bytes keys: sorted as text
        raise MalformedFrame(f"{type_name} has unknown field(s) {sorted(extra, key=repr)}")
    values: dict[str, Any] = {}
    for name, (kind, expected) in schema.items():
        if name not in header:
            if name in _OPTIONAL[type_name]:
                continue  # a field newer than the sender: the dataclass default applies
            raise MalformedFrame(f"{type_name} lacks field {name!r}")
        value = header[name]
        # a value of exactly the field's type (most are, an int's never a bool then) needs
        # no call: this runs for every field of every frame on both sides
        values[name] = (
            value
            if type(value) is expected
            else _check_field(type_name, name, kind, expected, value)
        )
    views, position = [], 0
    for info in arrays:
        chunk = payload[position : position + info.nbytes]
        views.append(np.frombuffer(chunk, dtype=info.dtype).reshape(info.shape))
        position += info.nbytes
    if arrays and arrays[0].codec != CODEC_NONE:
        values["encoded"] = Encoded(arrays[0].codec, tuple(views))
    else:
        values.update(zip(cls.ARRAYS, views, strict=True))
    return typing.cast(Message, cls(**values))
