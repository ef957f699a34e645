"""``ModelledBackend``: a compute-free worker whose compute time follows a model.

It stands in for a worker whose arithmetic costs what Quicknet's performance model says a
pattern costs, ``c1 * N_h + c2`` seconds (N_h hidden units; c1 the time per hidden unit
and pattern, c2 the fixed time per pattern), scaled by ``time_scale``. It sleeps that
long per bunch and returns a tiny constant gradient, so the networking, the server and the flow
control are real while the compute is not: many emulated workers fit on a small machine
and their compute never competes with the communication for the CPU. This is what the
scaling benchmark (``bench/scaling.py``) measures against the model.

Its parameters come from the environment, because a worker process gets nothing but the
server's address on its command line (``snet worker --backend modelled``):

- ``SNET_MODELLED_C1``: seconds per hidden unit and pattern (default: from
  ``SNET_MODELLED_CU_SECONDS`` below and the job's network);
- ``SNET_MODELLED_C2``: seconds per pattern (default: the output layer's share, likewise);
- ``SNET_MODELLED_CU_SECONDS``: seconds per connection update used for those defaults
  (default 6.25e-11, i.e. 16,000 MCUPS);
- ``SNET_MODELLED_TIME_SCALE``: multiplies the modelled time (default 1).

Cross-validation scores nothing and takes no time (it reports no correct frames), so the
end of an epoch does not disturb a throughput measurement.
"""

from __future__ import annotations

import math
import os
import time
from typing import Any

import numpy as np

from snet.perf.model import per_pattern_coefficients
from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec

from .data import Corpus

DEFAULT_CU_SECONDS = 1.0 / 16_000e6  # 16,000 MCUPS: numpy on 351:1262:45 here, FTZ on


def _env_float(name: str, default: float | None) -> float | None:
    text = os.environ.get(name)
    if text is None or text == "":
        return default
    try:
        value = float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {text!r}") from None
    if not value >= 0.0:
        raise ConfigError(f"{name} must be >= 0, got {text!r}")
    return value


MODELLED_GRADIENT = 1e-6  # per pattern and weight


class ModelledBackend:
    """Sleeps ``time_scale * bunch * (c1 * N_h + c2)`` per bunch; returns a tiny constant
    gradient (not zeros: the server refuses an all-zero update as implausible)."""

    name = "modelled"
    models_device_time = True  # sleeps the modelled time

    def __init__(
        self,
        c1: float | None = None,
        c2: float | None = None,
        time_scale: float = 1.0,
        cu_seconds: float = DEFAULT_CU_SECONDS,
    ) -> None:
        if not (math.isfinite(time_scale) and time_scale > 0):  # nan passed "<= 0"
            raise ConfigError(f"the modelled time scale must be > 0, got {time_scale}")
        self._given = (c1, c2)
        self.cu_seconds = cu_seconds
        self.time_scale = time_scale
        self.c1 = c1 or 0.0
        self.c2 = c2 or 0.0
        self.hidden_units = 0
        self._cv_frames = 0
        self.bunches = 0
        self.patterns = 0
        self.modelled_seconds = 0.0  # what the model says the bunches cost (scaled)
        self.real_seconds = 0.0  # what gradient() really took, sleeping included
        # A bunch that ended late (a sleep's overshoot, a wake-up late for a busy core)
        # makes the next one, begun straight after it, shorter: a run of bunches then
        # ends when the model says, as a device computing them back to back would.
        self._late = 0.0
        self._last_end = -math.inf

    @classmethod
    def from_environment(cls) -> ModelledBackend:
        """A backend configured by the ``SNET_MODELLED_*`` variables (see the module doc)."""
        cu = _env_float("SNET_MODELLED_CU_SECONDS", DEFAULT_CU_SECONDS)
        scale = _env_float("SNET_MODELLED_TIME_SCALE", 1.0)
        assert cu is not None and scale is not None
        return cls(
            _env_float("SNET_MODELLED_C1", None), _env_float("SNET_MODELLED_C2", None), scale, cu
        )

    def prepare(self, job: JobSpec, corpus: Corpus) -> None:
        derived = per_pattern_coefficients(job.network, self.cu_seconds)
        given_c1, given_c2 = self._given
        self.c1 = derived[0] if given_c1 is None else given_c1
        self.c2 = derived[1] if given_c2 is None else given_c2
        self.hidden_units = sum(job.network.sizes[1:-1])
        self._cv_frames = len(corpus.cv_frames)

    def bunch_seconds(self, patterns: int) -> float:
        """The modelled (scaled) compute time of a bunch of ``patterns`` patterns."""
        return self.time_scale * patterns * (self.c1 * self.hidden_units + self.c2)

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        started = time.perf_counter()
        target = self.bunch_seconds(len(frames))
        # The send buffers are reused, so each update is filled anew; the weights drift by
        # lr * MODELLED_GRADIENT per step, far below anything the timing depends on.
        out.fill(MODELLED_GRADIENT * len(frames))
        # Sleep to a deadline rather than for a duration, so that the filling above and the
        # sleep's own overshoot do not add up to more than the modelled time; a bunch that
        # follows a late one at once (within half a bunch: the local step between a
        # block's bunches) makes up for it, by at most its own time.
        follows = started - self._last_end < target / 2
        owed = min(self._late, target) if follows else 0.0
        deadline = started + target - owed
        while (remaining := deadline - time.perf_counter()) > 0:
            time.sleep(remaining)
        self._last_end = ended = time.perf_counter()
        late = max(ended - deadline, 0.0) + (self._late - owed if follows else 0.0)
        self._late = min(late, target)  # behind by more: a burst, not a device's pace
        self.bunches += 1
        self.patterns += len(frames)
        self.modelled_seconds += target
        self.real_seconds += ended - started
        return 0.0, 0

    def evaluate(self, weights: np.ndarray) -> tuple[int, int, float]:
        return self._cv_frames, 0, 0.0

    def report(self) -> dict[str, Any] | None:
        """Modelled against real compute time, for /status (the worker row's "report")."""
        return {
            "c1_seconds": self.c1,
            "c2_seconds": self.c2,
            "hidden_units": self.hidden_units,
            "time_scale": self.time_scale,
            "bunches": self.bunches,
            "patterns": self.patterns,
            "modelled_seconds": round(self.modelled_seconds, 6),
            "real_seconds": round(self.real_seconds, 6),
        }
