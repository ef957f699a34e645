"""How a worker and the server agree on codecs, through ``Hello.capabilities``.

A worker lists the codec families it can encode (``"codec:sign"``, ...), and may ask::

    "compress:CODEC"   its updates in CODEC (``snet worker --compress``)
    "weights:FORM"     its weights in FORM (``snet worker --weights-codec``)
    "board:weights"    its weights through the server's weights board (``shared``), where
                       the server can; an entry of its own, not ``weights:shared``, since a
                       server of an earlier version refuses a form it does not know and
                       ignores a capability it does not know (it sends ``none``)
    "board:updates"    its float32 updates through an update board the server makes for
                       it, where it can (``Welcome.codecs["update_board"]``)

The server answers in ``Welcome.codecs`` = ``{"update": ..., "weights": ...}``: the
codec asked for; else the job's ``compress`` when the worker can encode it; else
``"none"``. A name the server does not know is refused (``UnknownCodec``) with the list of
the names it knows, and the worker does not join.
"""

from __future__ import annotations

from collections.abc import Iterable

from ..errors import ConfigError, UnknownCodec
from . import FAMILIES, canonical
from .weights import SHARED, canonical_weights_form

COMPRESS = "compress:"
WEIGHTS = "weights:"
BOARD = "board:weights"
UPDATE_BOARD = "board:updates"
CODEC = "codec:"
# The worker checks DataInfo's ``labels`` digest: a server sends it only to one that says
# so, since a worker of an earlier version refuses a message with a field it does not know.
DATA_LABELS = "data:labels"


def worker_capabilities(compress: str, weights: str) -> tuple[str, ...]:
    """What a worker of this version says in its Hello (``compress`` "" = the job's)."""
    capabilities = [CODEC + family for family in FAMILIES] + [DATA_LABELS]
    if compress:
        capabilities.append(COMPRESS + compress)
    if weights == SHARED:  # the same machine: the updates' way back too
        capabilities += [BOARD, UPDATE_BOARD]
    elif weights and weights != "none":
        capabilities.append(WEIGHTS + weights)
    return tuple(capabilities)


def _asked(capabilities: Iterable[str], prefix: str) -> str | None:
    asked = [c[len(prefix) :] for c in capabilities if c.startswith(prefix)]
    return asked[-1] if asked else None


def agree_codecs(capabilities: tuple[str, ...], job_compress: str) -> dict[str, str]:
    """The codecs for a worker with these capabilities; ``UnknownCodec`` if it asks for
    one this server does not know."""
    update = _asked(capabilities, COMPRESS)
    if update is not None:
        try:
            update = canonical(update)
        except ConfigError as exc:
            raise UnknownCodec(f"cannot compress updates as asked: {exc}") from exc
    else:
        family = job_compress.partition(":")[0]
        update = job_compress if CODEC + family in capabilities else "none"
    weights = _asked(capabilities, WEIGHTS) or (SHARED if BOARD in capabilities else "none")
    try:
        weights = canonical_weights_form(weights)
    except ConfigError as exc:
        raise UnknownCodec(f"cannot send weights as asked: {exc}") from exc
    return {"update": update, "weights": weights}
