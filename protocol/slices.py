"""Network-parallel training's shared vocabulary: slices of hidden units and their layout.

In ``np`` mode (MultiSpert's network parallelism, docs/network-parallel.md) each worker
holds a contiguous range of the hidden layer's units, ``HiddenSlice(start, stop)``, and
everything attached to them: the input weights and biases of those units and their
outgoing weights to the output layer. The output biases live on the server. A slice's
parameters travel flat (``np_slice`` messages), in this order::

    W1[:, start:stop]   (inputs x units)   the units' input weights
    b1[start:stop]      (units,)           their biases
    W2[start:stop, :]   (units x outputs)  their outgoing weights

This module is pure (no I/O): how the hidden layer is cut by the workers' speeds, how a
slice is cut out of an element and put back, and how large each is, so that both sides
check sizes before they trust a frame.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .errors import ConfigError
from .network import ELEMENT_DTYPE, ElementLayout, NetworkSpec


@dataclass(frozen=True)
class HiddenSlice:
    """Hidden units ``start`` (inclusive) to ``stop`` (exclusive)."""

    start: int
    stop: int

    @property
    def units(self) -> int:
        return self.stop - self.start


def np_problem(spec: NetworkSpec) -> str:
    """Why ``spec`` cannot be trained network-parallel ("" if it can): one hidden layer."""
    if len(spec.sizes) != 3:
        return (
            f"np mode trains networks with one hidden layer (input:hidden:output), got "
            f"{spec.describe()}; a deeper network needs a partial-sum exchange per layer "
            "(docs/network-parallel.md)"
        )
    return ""


def split_hidden(
    hidden: int, speeds: Sequence[float], caps: Sequence[int | None] | None = None
) -> list[HiddenSlice]:
    """Contiguous slices of ``hidden`` units, one per worker, sized by ``speeds`` (each
    worker's measured patterns per second, or 1.0 when not measured yet) and no larger
    than ``caps`` (the most units each worker's memory holds, None: any); every worker
    gets at least one unit while there are units for all. A capped worker's surplus goes
    to the others by their speeds; ConfigError if the caps together hold fewer than
    ``hidden`` units."""
    parts = _split_by_speed(hidden, speeds)
    if caps is None or all(c is None or p.units <= c for p, c in zip(parts, caps, strict=True)):
        return parts
    bounds = [hidden if c is None else min(max(c, 0), hidden) for c in caps]
    if sum(bounds) < hidden:
        raise ConfigError(
            f"the {hidden} hidden units do not fit the {len(bounds)} workers: their memory "
            f"holds at most {sum(bounds)} ({', '.join(map(str, bounds))})"
        )
    sizes = _capped_sizes(hidden, [max(float(s), 1e-9) for s in speeds], bounds)
    edges = np.concatenate([[0], np.cumsum(sizes)]).astype(int)
    return [HiddenSlice(int(a), int(b)) for a, b in itertools.pairwise(edges)]


def _split_by_speed(hidden: int, speeds: Sequence[float]) -> list[HiddenSlice]:
    if not speeds:
        return []
    count = min(len(speeds), hidden)
    weights = np.array([max(float(s), 1e-9) for s in speeds[:count]])
    shares = weights / weights.sum() * hidden
    edges = np.concatenate([[0], np.round(np.cumsum(shares)).astype(int)])
    edges[-1] = hidden
    for i in range(1, count):  # at least one unit each, edges increasing
        edges[i] = max(edges[i], edges[i - 1] + 1)
    for i in range(count - 1, 0, -1):
        edges[i] = min(edges[i], edges[i + 1] - 1)
    slices = [HiddenSlice(int(a), int(b)) for a, b in itertools.pairwise(edges)]
    return slices + [HiddenSlice(hidden, hidden)] * (len(speeds) - count)


def _capped_sizes(hidden: int, speeds: list[float], bounds: list[int]) -> list[int]:
    """Whole unit counts summing to ``hidden``, each within its bound, shared by speed:
    workers whose share exceeds their bound get the bound and the rest is shared again
    among the others (water-filling), then the fractions are rounded by largest
    remainder. The caller checked that the bounds hold ``hidden``."""
    shares = [0.0] * len(speeds)
    free = [i for i in range(len(speeds)) if bounds[i] > 0]
    left = float(hidden)
    while free:
        total = sum(speeds[i] for i in free)
        over = [i for i in free if left * speeds[i] / total > bounds[i]]
        if not over:
            for i in free:
                shares[i] = left * speeds[i] / total
            break
        for i in over:
            shares[i] = float(bounds[i])
            left -= bounds[i]
        free = [i for i in free if i not in over]
    sizes = [min(int(share), bound) for share, bound in zip(shares, bounds, strict=True)]
    by_remainder = sorted(range(len(sizes)), key=lambda i: sizes[i] - shares[i])
    while sum(sizes) < hidden:  # the bounds hold hidden: some worker has room
        i = next(i for i in by_remainder if sizes[i] < bounds[i])
        sizes[i] += 1
        by_remainder.remove(i)
        by_remainder.append(i)
    for i, size in enumerate(sizes):  # one unit each while others have more than one
        if size == 0 and bounds[i] > 0:
            donor = max(range(len(sizes)), key=lambda j: sizes[j])
            if sizes[donor] > 1:
                sizes[donor] -= 1
                sizes[i] = 1
    return sizes


def slice_network(spec: NetworkSpec, units: int) -> NetworkSpec:
    """The network a slice of ``units`` hidden units amounts to on its own (for a
    device's memory plan): inputs, those units, the outputs."""
    return NetworkSpec((spec.sizes[0], max(units, 1), spec.sizes[2]), spec.activations)


def slice_size(spec: NetworkSpec, part: HiddenSlice) -> int:
    """Values in the flat parameters of ``part``."""
    inputs, _, outputs = spec.sizes
    return (inputs + 1 + outputs) * part.units


def slice_bytes(spec: NetworkSpec, part: HiddenSlice, bytes_per_value: int = 4) -> int:
    """Memory the slice's weights take on a worker at ``bytes_per_value``."""
    return slice_size(spec, part) * bytes_per_value


def slice_views(spec: NetworkSpec, part: HiddenSlice, flat: np.ndarray) -> list[np.ndarray]:
    """(W1 slice, b1 slice, W2 slice) as views of a slice's flat parameters."""
    inputs, _, outputs = spec.sizes
    units = part.units
    if flat.shape != (slice_size(spec, part),) or flat.dtype != ELEMENT_DTYPE:
        raise ConfigError(
            f"slice buffer has shape {flat.shape} {flat.dtype}, hidden units "
            f"{part.start}:{part.stop} need ({slice_size(spec, part)},) float32"
        )
    w1 = flat[: inputs * units].reshape(inputs, units)
    b1 = flat[inputs * units : (inputs + 1) * units]
    w2 = flat[(inputs + 1) * units :].reshape(units, outputs)
    return [w1, b1, w2]


def cut_slice(spec: NetworkSpec, element: np.ndarray, part: HiddenSlice) -> np.ndarray:
    """A new flat array: the parameters of ``part`` in ``element`` (a whole network)."""
    w1, b1, w2, _ = ElementLayout.for_network(spec).views(element)
    out = np.empty(slice_size(spec, part), dtype=ELEMENT_DTYPE)
    s1, sb, s2 = slice_views(spec, part, out)
    s1[...] = w1[:, part.start : part.stop]
    sb[...] = b1[part.start : part.stop]
    s2[...] = w2[part.start : part.stop]
    return out


def put_slice(spec: NetworkSpec, element: np.ndarray, part: HiddenSlice, flat: np.ndarray) -> None:
    """Write a slice's flat parameters into their places in ``element``."""
    w1, b1, w2, _ = ElementLayout.for_network(spec).views(element)
    s1, sb, s2 = slice_views(spec, part, flat)
    w1[:, part.start : part.stop] = s1
    b1[part.start : part.stop] = sb
    w2[part.start : part.stop] = s2


def output_bias(spec: NetworkSpec, element: np.ndarray) -> np.ndarray:
    """The output biases of ``element`` (a view): they live on the server in np mode."""
    return ElementLayout.for_network(spec).views(element)[3]
