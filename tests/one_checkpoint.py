"""``OneCheckpoint``: a checkpoint store holding one checkpoint, for ``resume_point``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from snet.server.checkpoint import LoadedCheckpoint


class OneCheckpoint:
    """A checkpoint store holding one checkpoint, of ``state``."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.loaded = LoadedCheckpoint(Path("ckpt-000001.snet"), state)

    def remove_leftovers(self) -> None:
        pass

    def newest(self) -> LoadedCheckpoint:
        return self.loaded

    def set_aside_newer(self, resumed: LoadedCheckpoint) -> None:
        pass  # none is damaged
