"""Codecs for elements on the wire: pure numpy, no I/O.

::

    none        float32, exact
    fp16        half precision                         2x fewer bytes
    int8        blockwise int8, a scale per 256        ~4x
    sign        1 bit per value, a scale per 512       ~28x
    topk:F      largest fraction F, index gap + value  ~1/(1.3 F) (varint gaps; warm-up)
    powersgd:R  rank-R factors of weight matrices      depends on the shapes

``parse_codec("topk:0.01")`` makes a codec object (a fresh one per call: an encoder may
keep state). Updates use any of them with error feedback on the worker; weights to a
worker use ``weights.WEIGHTS_CODECS`` (full copies in fp16, or deltas in any codec).
"""

from __future__ import annotations

from ..errors import ConfigError
from ..numbering import plain_float, plain_int
from .base import ElementCodec, PartSpec
from .quantize import Fp16Codec, Int8Codec, NoneCodec, SignCodec
from .sparse import PowerSgdCodec, TopKCodec

CODEC_FORMS = ("none", "fp16", "int8", "sign", "topk:F", "powersgd:R")
FAMILIES = ("none", "fp16", "int8", "sign", "topk", "powersgd")

__all__ = [
    "CODEC_FORMS",
    "FAMILIES",
    "ElementCodec",
    "PartSpec",
    "canonical",
    "carries_momentum",
    "parse_codec",
]


def parse_codec(text: str) -> ElementCodec:
    """The codec a name describes; ``ConfigError`` (naming the known forms) when none does."""
    family, colon, argument = str(text).strip().partition(":")
    simple = {"none": NoneCodec, "fp16": Fp16Codec, "int8": Int8Codec, "sign": SignCodec}
    try:
        if family in simple and not colon:  # "fp16:" is no codec
            return simple[family]()
        if family == "topk":
            return TopKCodec(plain_float(argument))
        if family == "powersgd":
            return PowerSgdCodec(plain_int(argument))
    except ValueError:
        pass
    raise ConfigError(f"unknown codec {text!r:.40}; known: {', '.join(CODEC_FORMS)}")


def canonical(text: str) -> str:
    """The canonical spelling of a codec name (``"topk:.010"`` -> ``"topk:0.01"``, ``"FP16"``
    -> ``"fp16"``: settings' choices are taken in any case, as the staleness policy's).
    A frame's codec must be canonical already (protocol/framing.py)."""
    return parse_codec(str(text).lower()).name


def carries_momentum(update_codec: str) -> bool:
    """Whether updates in ``update_codec`` carry the worker's momentum (``topk``): the
    server then applies them as they are, without its own momentum (protocol 8.8)."""
    return parse_codec(update_codec).momentum_corrected
