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


BMUF_MIN_RANK = 16  # the fewest powersgd factors a bmuf block's delta trains well in


def bmuf_update_problem(codec: str, what: str) -> str:
    """Why bmuf workers may not send their blocks' model deltas in ``codec`` ("" if they
    may; ``what``: how a refusal names it). Not a codec that folds the worker's momentum
    into gradients (topk); not powersgd of few factors: a block's delta is large, there
    are few of them, and what the factors leave out waits long in the residual (a probe's
    demo ended at 78 % CV at rank 2, where int8 reached 92 %; docs/compression.md: 46 %
    after 3 epochs at rank 4, 89 % at 16, 90 % uncompressed)."""
    use = f"use none, fp16, int8, sign or powersgd:{BMUF_MIN_RANK} or more"
    if carries_momentum(codec):
        return (f"{what} {codec} carries a worker's momentum for gradients; bmuf workers "
                f"send model deltas: {use}")  # fmt: skip
    parsed = parse_codec(codec)
    if isinstance(parsed, PowerSgdCodec) and parsed.rank < BMUF_MIN_RANK:
        return (f"{what} {codec}: a bmuf block's model delta in {parsed.rank} factors "
                f"leaves most of it waiting in the residual and undertrains (docs/"
                f"compression.md); {use}")  # fmt: skip
    return ""
