"""``Slow``: numpy's arithmetic with each bunch taking a set time of the clock (a slow
machine, or an emulated board with a large network: the time is slept, not computed).

For lab tests whose subject is what the server and workers do while time passes (a rate,
a deadline, a progress line, an event stream): a worker at full speed would spend the
test's seconds computing bunches nobody looks at, on the cores the other tests share."""

from __future__ import annotations

import threading
import time
from typing import Any

import numpy as np

from snet.client.backend import NumpyBackend


class Slow(NumpyBackend):
    """Each bunch takes ``seconds`` of the clock, at least."""

    def __init__(self, seconds: float, started: threading.Event | None = None) -> None:
        super().__init__("numpy")
        self.models_device_time = True  # slept time: never computed on the event loop
        self.seconds = seconds
        self.started = started  # set: its start-up is over (a slow data load, a compile)

    def prepare(self, job: Any, corpus: Any) -> None:
        if self.started is not None:
            assert self.started.wait(60), "the test never let it start"
        super().prepare(job, corpus)

    def gradient(
        self, weights: np.ndarray, frames: np.ndarray, out: np.ndarray
    ) -> tuple[float, int]:
        time.sleep(self.seconds)
        return super().gradient(weights, frames, out)
