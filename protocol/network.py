"""The description of a network and the layout of its *element*.

An element is all weights and biases of the network in one contiguous float32 buffer:
for each layer in order, the weight matrix (fan_in x fan_out, row-major) and then the
bias vector (fan_out). The same layout carries a copy of the network (server -> worker)
and an update (worker -> server), so a received payload can land straight in a
preallocated element and be used through views without a copy.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import ConfigError

HIDDEN_ACTIVATIONS = ("sigmoid", "tanh", "relu")
# Softmax exponents (logits minus their maximum) are clipped to at least this before they
# are exponentiated: a probability never underflows, so deltas stay normal and a frame's
# loss is at most about 30. The workers' float backends and the server's scoring (the
# test file, a CV referee) use the same floor, so their losses agree: the server's exact
# loss refused honest workers' CV results under --verify-cv (a probe: 7185 against 6369).
SOFTMAX_FLOOR = -30.0
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
        """From ``{"sizes", "activations"}`` (the wire form) or a CLONES-style
        ``{"layers", "connections"}`` description (``from_layers``)."""
        if "layers" in data:
            return cls.from_layers(data["layers"], data.get("connections"))
        try:
            return cls(
                tuple(int(s) for s in data["sizes"]),
                tuple(str(a) for a in data.get("activations", ())),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad network description {data!r}: {exc}") from exc

    @classmethod
    def from_layers(
        cls, layers: list[dict[str, Any]], connections: list[dict[str, Any]] | None = None
    ) -> NetworkSpec:
        """A network described CLONES-style: named layers and the full connections between
        them, e.g. (TOML)::

            layers = [{name = "in", size = 117},
                      {name = "h1", size = 512, activation = "sigmoid"},
                      {name = "out", size = 10, activation = "softmax"}]
            connections = [{from = "in", to = "h1"}, {from = "h1", to = "out"}]

        The first layer is the input (no activation), the last is softmax, the others
        have sigmoid, tanh or relu units; any depth. Each connection is a full weight
        matrix from one layer to the next (with the bias of the receiving layer): the
        layers must form a chain, in the order listed. Without ``connections`` each
        layer is connected to the next.
        """
        if not isinstance(layers, list) or len(layers) < 2:
            raise ConfigError("a network needs at least an input and an output layer")
        names: list[str] = []
        sizes: list[int] = []
        activations: list[str] = []
        for position, layer in enumerate(layers):
            if not isinstance(layer, dict) or "size" not in layer:
                raise ConfigError(f"layer {position} needs a size: {layer!r}")
            name = str(layer.get("name", f"layer{position}"))
            if name in names:
                raise ConfigError(f"two layers are called {name!r}")
            names.append(name)
            try:
                sizes.append(int(layer["size"]))
            except (TypeError, ValueError) as exc:
                size = layer["size"]
                raise ConfigError(f"layer {name!r}: size {size!r} is not a number") from exc
            kind = layer.get("activation")
            if position == 0:
                if kind not in (None, "input", "linear"):
                    raise ConfigError(f"the input layer {name!r} has no activation, got {kind!r}")
            elif position == len(layers) - 1:
                if kind not in (None, "softmax"):
                    raise ConfigError(
                        f"the output layer {name!r} is softmax (cross-entropy), got {kind!r}"
                    )
            else:
                activations.append(str(kind or "sigmoid"))
        chain = list(itertools.pairwise(names))
        if connections is not None:
            given = []
            for connection in connections:
                if not isinstance(connection, dict) or {"from", "to"} - set(connection):
                    raise ConfigError(f"a connection needs from and to: {connection!r}")
                ends = (str(connection["from"]), str(connection["to"]))
                for end in ends:
                    if end not in names:
                        raise ConfigError(f"connection {ends[0]} -> {ends[1]}: no layer {end!r}")
                given.append(ends)
            if sorted(given) != sorted(chain):
                raise ConfigError(
                    "snet trains chains of full connections, each layer feeding the next as "
                    f"listed ({' -> '.join(names)}); got {[f'{a} -> {b}' for a, b in given]}"
                )
        return cls(tuple(sizes), tuple(activations))


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
