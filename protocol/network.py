"""The description of a network and the layout of its *element*.

An element is all weights and biases of the network in one contiguous float32 buffer:
for each layer in order, the weight matrix (fan_in x fan_out, row-major) and then the
bias vector (fan_out). The same layout carries a copy of the network (server -> worker)
and an update (worker -> server), so a received payload can land straight in a
preallocated element and be used through views without a copy.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ConfigError

HIDDEN_ACTIVATIONS = ("sigmoid", "tanh", "relu")
ELEMENT_DTYPE = np.dtype("<f4")


@dataclass(frozen=True)
class NetworkSpec:
    """Layer sizes and hidden-unit activations of a fully connected classifier.

    ``sizes`` is input, hidden..., output (at least input and output). The output layer is
    always softmax with cross-entropy. ``activations`` has one entry per hidden layer.
    """

    sizes: tuple[int, ...]
    activations: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if len(self.sizes) < 2:
            raise ConfigError(f"a network needs at least input and output sizes, got {self.sizes}")
        if any(int(s) < 1 for s in self.sizes):
            raise ConfigError(f"layer sizes must be positive, got {self.sizes}")
        if len(self.activations) != len(self.sizes) - 2:
            raise ConfigError(
                f"{len(self.sizes) - 2} hidden layer(s) need as many activations, "
                f"got {list(self.activations)}"
            )
        for act in self.activations:
            if act not in HIDDEN_ACTIVATIONS:
                raise ConfigError(f"unknown activation {act!r}; use one of {HIDDEN_ACTIVATIONS}")

    @classmethod
    def parse(cls, text: str, activation: str = "sigmoid") -> NetworkSpec:
        """Parse Quicknet-style ``"117:512:10"`` with one activation for all hidden layers."""
        try:
            sizes = tuple(int(part) for part in text.split(":"))
        except ValueError as exc:
            raise ConfigError(f"network {text!r} is not colon-separated sizes") from exc
        return cls(sizes, (activation,) * max(len(sizes) - 2, 0))

    @property
    def input_size(self) -> int:
        return self.sizes[0]

    @property
    def output_size(self) -> int:
        return self.sizes[-1]

    @property
    def connections(self) -> int:
        """Weights plus biases: the connection count used for MCUPS."""
        return sum(a * b + b for a, b in zip(self.sizes[:-1], self.sizes[1:], strict=False))

    def describe(self) -> str:
        return ":".join(str(s) for s in self.sizes)

    def to_dict(self) -> dict[str, Any]:
        return {"sizes": list(self.sizes), "activations": list(self.activations)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> NetworkSpec:
        try:
            return cls(
                tuple(int(s) for s in data["sizes"]),
                tuple(str(a) for a in data.get("activations", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad network description {data!r}: {exc}") from exc


@dataclass(frozen=True)
class ElementLayout:
    """Where each layer's weight matrix and bias vector sit in an element's flat buffer."""

    shapes: tuple[tuple[int, ...], ...]
    offsets: tuple[int, ...] = field(init=False)
    size: int = field(init=False)

    def __post_init__(self) -> None:
        offsets, position = [], 0
        for shape in self.shapes:
            offsets.append(position)
            position += int(np.prod(shape))
        object.__setattr__(self, "offsets", tuple(offsets))
        object.__setattr__(self, "size", position)

    @classmethod
    def for_network(cls, spec: NetworkSpec) -> ElementLayout:
        shapes: list[tuple[int, ...]] = []
        for fan_in, fan_out in zip(spec.sizes[:-1], spec.sizes[1:], strict=False):
            shapes.extend([(fan_in, fan_out), (fan_out,)])
        return cls(tuple(shapes))

    @property
    def nbytes(self) -> int:
        return self.size * ELEMENT_DTYPE.itemsize

    def views(self, flat: np.ndarray) -> list[np.ndarray]:
        """Arrays (W0, b0, W1, b1, ...) that are views into ``flat`` (no copies)."""
        if flat.shape != (self.size,) or flat.dtype != ELEMENT_DTYPE:
            raise ConfigError(
                f"element buffer has shape {flat.shape} {flat.dtype}, "
                f"layout needs ({self.size},) float32"
            )
        return [
            flat[offset : offset + int(np.prod(shape))].reshape(shape)
            for offset, shape in zip(self.offsets, self.shapes, strict=True)
        ]

    def allocate(self) -> np.ndarray:
        return np.zeros(self.size, dtype=ELEMENT_DTYPE)


def initial_weights(spec: NetworkSpec, seed: int) -> np.ndarray:
    """A deterministic starting element: scaled-uniform weights, zero biases.

    Weights are drawn from U(-r, r) with r = sqrt(6 / (fan_in + fan_out)) (Glorot), a
    choice that trains sigmoid, tanh and relu layers alike from the same seed.
    """
    layout = ElementLayout.for_network(spec)
    flat = layout.allocate()
    rng = np.random.default_rng(seed)
    for array in layout.views(flat):
        if array.ndim == 2:
            limit = np.sqrt(6.0 / (array.shape[0] + array.shape[1]))
            array[...] = rng.uniform(-limit, limit, size=array.shape)
    return flat


def split_views(spec: NetworkSpec, flat: np.ndarray) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """The weight matrices and the bias vectors of ``flat`` as two lists of views."""
    views = ElementLayout.for_network(spec).views(flat)
    return views[0::2], views[1::2]
