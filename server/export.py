"""Trained weights as a self-describing ``.npz``: W0, b0, W1, b1, ... plus the layer sizes."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import numpy as np

from snet.protocol.network import ElementLayout, NetworkSpec


def weights_npz(spec: NetworkSpec, flat: np.ndarray, version: int, epoch: int) -> bytes:
    """The weights as the bytes of an .npz file."""
    views = ElementLayout.for_network(spec).views(np.asarray(flat))
    arrays: dict[str, Any] = {
        "sizes": np.array(spec.sizes, dtype=np.int64),
        "activations": np.array(spec.activations, dtype=str),
        "version": np.array(version, dtype=np.int64),
        "epoch": np.array(epoch, dtype=np.int64),
    }
    for layer in range(len(views) // 2):
        arrays[f"W{layer}"] = views[2 * layer]
        arrays[f"b{layer}"] = views[2 * layer + 1]
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def write_atomically(path: Path, payload: bytes) -> None:
    """Write atomically: a reader never sees half a file, a crash never leaves one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_suffix(path.suffix + ".tmp")
    with open(temporary, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)
