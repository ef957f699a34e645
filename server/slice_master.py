"""``SliceMaster``: the server's part of network-parallel (``np``) training, without I/O.

Quicknet on MultiSpert (Färber, ICSI TR-97-047) split the hidden units across the boards;
so does ``np`` mode (docs/network-parallel.md). The master

- cuts the hidden layer into contiguous slices, one per worker, sized by their measured
  speed (``reslice``), and hands each its slice's weights and momentum;
- for each bunch sums the workers' partial output pre-activations, adds the output
  biases (which live here, with their momentum), applies softmax and cross-entropy and
  returns the error ``softmax - one-hot`` every worker applies to its own slice
  (``combine``, ``step_output``);
- keeps the last copy of every slice it was sent (``take_report``), from which the whole
  element (for /weights, CV, checkpoints, ``snet eval``) is assembled, and from which a
  departed worker's slice is handed to the others at the next ``reslice``.

What a departed worker's units lose: the updates since its last report (the server asks
for reports every ``COLLECT_EVERY`` bunches, at epoch ends and before re-slicing), counted
in ``units_rolled_back`` for /status.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from snet.protocol.errors import ConfigError, RejectedUpdate
from snet.protocol.job import JobSpec
from snet.protocol.network import ELEMENT_DTYPE, SOFTMAX_FLOOR, NetworkSpec
from snet.protocol.slices import (
    HiddenSlice,
    cut_slice,
    output_bias,
    put_slice,
    slice_size,
    split_hidden,
)

from .update_rule import UpdateRule

COLLECT_EVERY = 64  # bunches between slice reports (bounds what a lost worker costs)


@dataclass(frozen=True)
class SliceGrant:
    """A slice handed to a worker: its units and their weights and momentum."""

    part: HiddenSlice
    weights: np.ndarray
    velocity: np.ndarray


class SliceMaster:
    """The whole network as last reported, the output biases live, and who holds what."""

    def __init__(self, spec: NetworkSpec, momentum: float, element: np.ndarray) -> None:
        self.spec = spec
        self.momentum = np.float32(momentum)
        self.element = np.array(element, dtype=ELEMENT_DTYPE)  # slices as last reported
        self.velocity = np.zeros_like(self.element)  # the slices' momentum, as reported
        # Views of the output biases and their momentum, taken once: every bunch uses them
        # (a layout's views cost more than the bunch's softmax), and both arrays are only
        # ever written in place.
        self._bias = output_bias(spec, self.element)
        self._bias_speed = output_bias(spec, self.velocity)
        self.holders: dict[int, HiddenSlice] = {}  # worker id -> its slice
        self.reported: set[int] = set()  # holders whose report came since the last request
        self.units_rolled_back = 0  # hidden units handed over from a stale copy
        self.memory_short = ""  # why the last cut could not respect the workers' memory
        self.bunches = 0  # completed, for /status
        self.slowest_compute_seconds = 0.0  # summed over them: each one's slowest holder

    # ------------------------------------------------------------ slices

    def reslice(
        self, speeds: dict[int, float], caps: dict[int, int | None] | None = None
    ) -> dict[int, SliceGrant]:
        """Cut the hidden units among the workers of ``speeds`` (id -> patterns/s), in
        worker-id order, no slice larger than its worker's ``caps`` (the units its memory
        holds, None: any), from the copies held here; returns each worker's grant.
        When the caps together hold too few units nobody is cut a slice (no grants, no
        holders) and ``memory_short`` says why: training waits for more workers."""
        ids = sorted(speeds)
        hidden, shares = self.spec.sizes[1], [speeds[i] for i in ids]
        self.reported.clear()
        try:
            parts = split_hidden(
                hidden, shares, None if caps is None else [caps.get(i) for i in ids]
            )
        except ConfigError as exc:
            self.holders, self.memory_short = {}, str(exc)
            return {}
        self.holders, self.memory_short = dict(zip(ids, parts, strict=True)), ""
        return {
            worker: SliceGrant(
                part,
                cut_slice(self.spec, self.element, part),
                cut_slice(self.spec, self.velocity, part),
            )
            for worker, part in self.holders.items()
        }

    def depart(self, worker_id: int) -> None:
        """A holder left: its units stay as last reported until the next ``reslice``."""
        part = self.holders.pop(worker_id, None)
        if part is not None:
            self.units_rolled_back += part.units
        self.reported.discard(worker_id)

    def take_report(
        self, worker_id: int, part: HiddenSlice, weights: np.ndarray, velocity: np.ndarray
    ) -> None:
        """A worker's copy of its slice (weights and momentum); RejectedUpdate if it is not
        the slice it holds or not of that slice's size, or not finite."""
        held = self.holders.get(worker_id)
        if held != part:
            raise RejectedUpdate(f"slice {part.start}:{part.stop} is not the one this worker holds")
        size = slice_size(self.spec, part)
        if weights.shape != (size,) or velocity.shape != (size,):
            raise RejectedUpdate(f"slice {part.start}:{part.stop} needs {size} values")
        if not (np.isfinite(weights).all() and np.isfinite(velocity).all()):
            raise RejectedUpdate("slice report with NaN or Inf", numeric=True)
        put_slice(self.spec, self.element, part, weights)
        put_slice(self.spec, self.velocity, part, velocity)
        self.reported.add(worker_id)

    @property
    def all_reported(self) -> bool:
        return set(self.holders) <= self.reported

    # ------------------------------------------------------------ bunches

    def check_partial(self, worker_id: int, partial: np.ndarray, patterns: int) -> None:
        """RejectedUpdate unless ``partial`` is a finite (patterns, outputs) float32 array
        from a holder."""
        if worker_id not in self.holders:
            raise RejectedUpdate("partial outputs from a worker that holds no slice")
        expected = (patterns, self.spec.sizes[2])
        if partial.shape != expected or partial.dtype != ELEMENT_DTYPE:
            raise RejectedUpdate(f"partial outputs of shape {partial.shape}, expected {expected}")
        if not np.isfinite(partial).all():
            raise RejectedUpdate("partial outputs with NaN or Inf", numeric=True)

    def combine(
        self, partials: list[np.ndarray], labels: np.ndarray, bunch: int = -1
    ) -> tuple[np.ndarray, float, int]:
        """(error ``softmax - one-hot`` per pattern, summed loss, correct) of one bunch
        (number ``bunch``); RejectedUpdate (numeric) when the holders' finite outputs sum
        beyond float32."""
        with np.errstate(over="ignore", invalid="ignore"):  # checked: said below, not warned
            z = np.add.reduce(partials) if len(partials) > 1 else partials[0].copy()
            z += self._bias
        if not np.isfinite(z).all():  # else NaN in every output bias, and every checkpoint
            raise RejectedUpdate(f"every holder's partial outputs for bunch {bunch} sum to NaN or "
                                 "Inf", numeric=True)  # fmt: skip
        rows = np.arange(len(labels))
        z -= z.max(axis=1, keepdims=True)
        correct = int(np.count_nonzero(z[rows, labels] == 0.0))  # ties count, as the workers
        np.maximum(z, SOFTMAX_FLOOR, out=z)
        np.exp(z, out=z)
        z /= z.sum(axis=1, keepdims=True)
        loss = float(-np.log(z[rows, labels], dtype=np.float64).sum())
        z[rows, labels] -= 1.0
        return z.astype(ELEMENT_DTYPE, copy=False), loss, correct

    def step_output(self, delta: np.ndarray, patterns: int, rate: float) -> None:
        """The output biases' momentum step, as the workers step their slices."""
        bias, speed = self._bias, self._bias_speed
        gradient = np.add.reduce(delta, axis=0) * np.float32(rate / max(patterns, 1))
        speed *= self.momentum
        speed -= gradient.astype(ELEMENT_DTYPE)
        bias += speed

    def bunch_done(self, slowest_seconds: float) -> None:
        """A bunch completed; its slowest holder computed for ``slowest_seconds`` (what a
        round waits for: bench/np_vs_pp.py gives the model this compute)."""
        self.bunches += 1
        self.slowest_compute_seconds += slowest_seconds

    def load(self, element: np.ndarray, velocity: np.ndarray | None = None) -> None:
        """Start over from ``element`` and ``velocity`` (none: a roll-back, no momentum);
        call ``reslice`` next."""
        self.element[...] = element
        self.velocity[...] = 0.0 if velocity is None else velocity


class AssembledElement(UpdateRule):
    """np mode's rule: no step ever runs through it (the slices step on the workers); it
    holds the element and momentum assembled from the last reports (what /weights, the
    checkpoints and the CV see) and the ``SliceMaster``, whose figures /status shows."""

    def __init__(self, weights: np.ndarray, job: JobSpec) -> None:
        super().__init__(weights, job.momentum)
        self.master = SliceMaster(job.network, job.momentum, weights)

    def assemble(self) -> None:
        """Publish the element and its momentum as last reported: what /weights, the CV
        and a checkpoint see from now on."""
        self.load(self.master.element)
        self.velocity[...] = self.master.velocity

    def restore_checkpoint(self, state: dict[str, np.ndarray]) -> None:
        """A resumed run's slices start from the saved element and momentum."""
        super().restore_checkpoint(state)
        self.master.load(self.weights, self.velocity)

    def figures(self) -> dict[str, float | int | str]:
        holders = self.master.holders
        return {
            "rule": "np slices",
            "slices": " ".join(f"{w}:{p.start}-{p.stop}" for w, p in sorted(holders.items())),
            "units_rolled_back": self.master.units_rolled_back,
            "memory_short": self.master.memory_short,
            "bunches": self.master.bunches,
            "slowest_compute_seconds": round(self.master.slowest_compute_seconds, 6),
        }
