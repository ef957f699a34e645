"""``UpdateDecoder``: compressed updates into free pooled elements, or a clear refusal.

The update rule only ever sees float32 elements: an update that arrives encoded (see
protocol/codecs) is decoded into a free element of the server's pool, after the codec has
checked every part, index and scale. Decoding keeps no state, so one codec object per
codec name serves every worker.
"""

from __future__ import annotations

from snet.protocol.codecs import ElementCodec, parse_codec
from snet.protocol.errors import CodecError
from snet.protocol.messages import Encoded
from snet.protocol.network import ElementLayout

from .pool import ElementLoan, ElementPool


class UpdateDecoder:
    """Decodes encoded updates of one network into elements of one pool."""

    def __init__(self, layout: ElementLayout, pool: ElementPool) -> None:
        self.layout = layout
        self.pool = pool
        self._codecs: dict[str, ElementCodec] = {}

    def decode(self, agreed: str, encoded: Encoded) -> ElementLoan:
        """The update in a pooled element; ``CodecError`` (nothing held) when it is not in
        the ``agreed`` codec or does not decode."""
        if encoded.codec != agreed:
            raise CodecError(f"update encoded with {encoded.codec}, agreed codec is {agreed}")
        codec = self._codecs.get(agreed)
        if codec is None:
            codec = self._codecs[agreed] = parse_codec(agreed)
        loan = self.pool.acquire()
        try:
            codec.decode(self.layout, encoded, loan.flat)
        except BaseException:  # CodecError, or a codec's bug: the element is not kept
            loan.release()
            raise
        return loan
