"""Which step trains a job: the compiled kernels (numba, client/fused.py) or numpy's passes.

Both compute the same step (to float32 rounding: tests/test_kernels.py). The compiled one is
faster per bunch, but loading it (numba's import and its cached kernels) costs a process
about 0.6 s of CPU, which a small job never earns back. So ``"auto"`` means the compiled
step only for a job large enough to pay for it (``COMPILED_STEP_PAYS_FROM``), and the
choice is a function of the job alone: every worker of a run and ``snet train`` on the
same job take the same step, and a job trains the same way however many workers share it.
``"numba"`` and ``"numpy"`` are taken as given; ``SNET_KERNELS`` (a developer's switch)
sets ``"auto"`` to either.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from snet.protocol.job import JobSpec
from snet.protocol.network import NetworkSpec

if TYPE_CHECKING:
    from .fused import FusedSteps

KERNEL_CHOICES = ("auto", "numba", "numpy")

# Connection updates (epochs x training frames x connections) from which the compiled step
# pays for its load. The default job (117:512:10, bunch 128, 10 epochs of 48,600 frames:
# 3.2e10) is about where it breaks even: `snet train` took 7.20 s with it and 7.42 s
# without (2026-11-27), and 6.18-8.34 s against 5.48-7.62 s in three alternated pairs
# (2026-11-28), within this machine's noise. Below this a process trains with numpy's
# passes and never imports numba: a job of a few epochs on the default data starts 0.6 s
# sooner. (The saving is in truth more per bunch than per connection: about 39 us a bunch
# plus 0.8 ns a pattern and unit, fitted to docs/benchmarks.md, so a small network on
# small bunches gains the step's worth sooner than this rule says.)
COMPILED_STEP_PAYS_FROM = 2e10


def job_kernels(kernels: str, job: JobSpec, train_frames: int) -> str:
    """``kernels`` for ``job`` on ``train_frames`` training frames: ``"auto"`` becomes
    ``"numpy"`` when the job is too small for the compiled step to pay for its load
    (unless ``SNET_KERNELS=numba``); anything else is returned as it is."""
    check_kernels(kernels)
    if kernels != "auto" or os.environ.get("SNET_KERNELS") == "numba":
        return kernels
    work = float(job.epochs) * train_frames * job.network.connections
    return "auto" if work >= COMPILED_STEP_PAYS_FROM else "numpy"


def check_kernels(kernels: str) -> None:
    if kernels not in KERNEL_CHOICES:
        raise ValueError(f"unknown kernels {kernels!r}; known: {', '.join(KERNEL_CHOICES)}")


def compiled_kernels(kernels: str, replaced: object = None) -> bool:
    """Whether ``kernels`` ("numba", "numpy" or "auto", see BunchNetwork) means the
    compiled step; ``replaced``: another backend's products or derivative, if any.
    ValueError for another name, ImportError when "numba" is asked for and cannot be had."""
    check_kernels(kernels)
    if kernels == "numpy":
        return False
    if kernels == "auto" and (
        replaced is not None or os.environ.get("SNET_KERNELS", "auto") == "numpy"
    ):
        return False
    try:
        from . import fused  # noqa: F401  (numba and numpy's OpenBLAS, or ImportError)
    except ImportError:
        if kernels == "numba":
            raise
        return False  # numba not installed: numpy alone computes the same
    return True


def fused_steps(
    spec: NetworkSpec, max_bunch: int, kernels: str, replaced: object = None
) -> FusedSteps | None:
    """The compiled step for ``kernels`` (``compiled_kernels``), or None for numpy's passes."""
    if not compiled_kernels(kernels, replaced):
        return None
    from .fused import FusedSteps

    return FusedSteps(spec, max_bunch)


def load_kernels(kernels: str = "auto") -> bool:
    """Load the compiled step now if ``kernels`` means it (``fused.warm_up`` says why);
    True when it will be used."""
    if not compiled_kernels(kernels):
        return False
    from snet.protocol.heap import settle

    from .fused import warm_up

    warm_up()
    settle()  # numba and its kernels, kept to the end: never walked by a collection
    return True
