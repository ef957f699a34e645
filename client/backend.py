"""Compute backends: what turns (weights, frames) into a gradient on a worker.

The worker's networking, flow control and leases are the same whatever computes the
bunches; a backend only does the arithmetic. ``NumpyBackend`` is the reference; other
backends (``torch``; ``spert``, the emulated Spert-II board of ``client/spert``) implement
the same ``ComputeBackend`` protocol and are chosen with ``snet worker --backend``. The
server cannot tell them apart except by the name each reports in its Hello.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from snet.protocol.job import JobSpec

from .data import Corpus
from .kernel_choice import check_kernels, job_kernels, load_kernels
from .network import MIN_ROWS, BunchNetwork, Derivative, MatMul


class ComputeBackend(Protocol):
    """The arithmetic of one worker. Every method runs in the worker's compute thread."""

    name: str
    # True when a bunch's time is mostly a modelled device's, slept: it must never be
    # computed on the event loop, whose inline choice sees only CPU time
    # (transport/inline.py) and would take a sleeping bunch for a short one
    models_device_time: bool

    def prepare(self, job: JobSpec, corpus: Corpus) -> None:
        """Set up for ``job`` on ``corpus`` (allocate buffers, load the board, ...)."""

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        """Write the summed gradient over the patterns centred on ``frames`` into ``out``;
        return (summed loss, correctly classified patterns)."""

    def evaluate(self, weights: np.ndarray) -> tuple[int, int, float]:
        """Score ``weights`` on the CV frames: (frames, correct, summed loss)."""

    def report(self) -> dict[str, Any] | None:
        """Figures for /status (sent as a WorkerReport), or None when there are none."""


class NumpyBackend:
    """float32 bunch-mode training with numpy (the reference backend)."""

    name = "numpy"
    models_device_time = False
    matmul: MatMul | None = None  # numpy's (OpenBLAS); the torch backend brings MKL's
    derivative: Derivative | None = None  # numpy's blocked passes; torch brings fused ones

    def __init__(self, kernels: str = "auto") -> None:
        """``kernels``: see ``BunchNetwork``; for ``"auto"`` the job decides, when the
        backend is prepared for it (client/kernel_choice.py), and the compiled step is
        loaded then, in the compute thread, before the first bunch (``fused.warm_up``)."""
        check_kernels(kernels)
        self.asked = kernels
        self.kernels = "numpy"  # what the prepared job trains with
        self._corpus: Corpus | None = None
        self._network: BunchNetwork | None = None
        self._cv_x: np.ndarray | None = None

    def prepare(self, job: JobSpec, corpus: Corpus) -> None:
        self._corpus = corpus
        kernels = job_kernels(self.asked, job, len(corpus.train_frames))
        self.kernels = "numba" if load_kernels(kernels) else "numpy"
        self._network = BunchNetwork(
            job.network, max(job.bunch_size, MIN_ROWS), self.matmul, self.derivative, self.kernels
        )
        self._cv_x = None  # cut at the first evaluation (inline frames arrive late)

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        assert self._corpus is not None and self._network is not None
        # The network copies the patterns into its own input buffer (scaled as it needs).
        return self._network.gradient_of_frames(weights, self._corpus, frames, out)

    def evaluate(self, weights: np.ndarray) -> tuple[int, int, float]:
        assert self._corpus is not None and self._network is not None
        if self._cv_x is None:
            self._cv_x = self._corpus.windows(self._corpus.cv_frames)
        labels = self._corpus.labels_of(self._corpus.cv_frames)
        loss, correct = self._network.evaluate(weights, self._cv_x, labels)
        return len(labels), correct, loss

    def report(self) -> dict[str, Any] | None:
        return None


def _torch_backend(threads: int) -> ComputeBackend:
    from .torch_backend import TorchBackend

    return TorchBackend(threads)


def torch_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def kernels_available() -> bool:
    """Whether the compiled step (numba, client/kernels.py) can be used."""
    import importlib.util

    return importlib.util.find_spec("numba") is not None


def _spert_backend(threads: int) -> ComputeBackend:
    from .spert.backend import SpertBackend  # the board's emulator, for its workers only

    return SpertBackend()  # an emulated Spert-II board, default settings


def _modelled_backend(threads: int) -> ComputeBackend:
    from .modelled_backend import ModelledBackend

    return ModelledBackend.from_environment()


BACKENDS: dict[str, Any] = {
    "numpy": lambda threads: NumpyBackend(),
    "torch": _torch_backend,
    "spert": _spert_backend,
    "modelled": _modelled_backend,  # compute-free, for scaling benchmarks
}


def check_backend(name: str) -> None:
    """Refuse a backend this machine cannot make, before any worker starts (``snet worker
    --processes N``: once, not in each of N forked workers; ``snet demo``): an unknown
    name, or torch when it is not installed (``make_backend`` would find out later)."""
    from snet.protocol.errors import ConfigError

    if name != "auto" and name not in BACKENDS:
        raise ConfigError(f"unknown backend {name!r}; known: auto, {', '.join(sorted(BACKENDS))}")
    if name == "torch" and not torch_available():
        raise ConfigError("backend 'torch' needs a package that is missing: torch")


def make_backend(name: str, threads: int = 1) -> ComputeBackend:
    """The backend called ``name`` (``snet worker --backend``).

    ``auto`` picks torch when it is installed (its MKL kernels measured faster here at
    every bunch size) and numpy otherwise; numpy alone always works.
    """
    from snet.protocol.errors import ConfigError

    if name == "auto":
        name = "torch" if torch_available() else "numpy"
    factory = BACKENDS.get(name)
    if factory is None:
        raise ConfigError(f"unknown backend {name!r}; known: auto, {', '.join(sorted(BACKENDS))}")
    try:
        backend: ComputeBackend = factory(threads)
    except ImportError as exc:
        raise ConfigError(f"backend {name!r} needs a package that is missing: {exc}") from exc
    return backend
