"""Worker compute backends agree with the numpy reference; denormals are flushed."""

from __future__ import annotations

import platform
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from snet.cli.runtime import run
from snet.client.backend import (
    BACKENDS,
    NumpyBackend,
    check_backend,
    make_backend,
    torch_available,
)
from snet.client.config import BACKEND_NAMES, WorkerConfig
from snet.client.data import load_corpus
from snet.protocol import fpu
from snet.protocol.errors import ConfigError
from snet.protocol.fpu import denormals_flushed, flush_denormals
from snet.protocol.job import JobSpec
from snet.protocol.network import ElementLayout, NetworkSpec, initial_weights


def test_flush_denormals_is_per_thread_and_reversible() -> None:
    def in_thread() -> tuple[bool, bool, bool]:
        before = denormals_flushed()
        flush_denormals(True)
        during = denormals_flushed()
        flush_denormals(False)
        return before, during, denormals_flushed()

    with ThreadPoolExecutor(1) as pool:
        before, during, after = pool.submit(in_thread).result()
    assert (before, during, after) == (False, True, False)
    assert not denormals_flushed()  # this thread was never touched


@pytest.mark.skipif(
    platform.machine() != "x86_64" or platform.system() != "Linux",
    reason="the switch is set through libm on x86-64 Linux only",
)
def test_libm_is_found_without_starting_a_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """``find_library`` runs ``ldconfig -p``: every server and worker (each forked worker
    too) started that process to find glibc's libm, whose soname is known."""

    def no_process(name: str) -> str:
        raise AssertionError(f"find_library({name!r}) started a process")

    monkeypatch.setattr(fpu.ctypes.util, "find_library", no_process)
    fpu._libm.cache_clear()
    try:
        assert fpu._libm() is not None  # x86-64 Linux: the switch is set through it
    finally:
        fpu._libm.cache_clear()


def test_the_event_loop_s_thread_flushes_denormals_as_the_compute_threads_do() -> None:
    """Short steps and bunches run on the loop's thread (transport/inline.py): a step's
    velocity must not keep denormals there that the step thread flushes to zero."""

    async def flushed() -> bool:
        return denormals_flushed()

    def in_thread() -> tuple[bool, bool]:
        flush_denormals(False)  # a thread inherits its creator's setting: start from none
        return run(flushed()), denormals_flushed()

    with ThreadPoolExecutor(1) as pool:  # a thread of its own: this one is left as it is
        during, after = pool.submit(in_thread).result()
    assert during and not after  # flushed while the loop ran, and left as it was found
    assert not denormals_flushed()


def test_unknown_backend_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match="unknown backend 'gpu'"):
        make_backend("gpu")
    with pytest.raises(ConfigError, match="unknown backend 'gpu'"):
        check_backend("gpu")  # before any worker starts
    with pytest.raises(ConfigError, match="unknown backend 'gpu'"):
        WorkerConfig(backend="gpu")
    expected = "torch" if torch_available() else "numpy"
    assert make_backend("auto").name == expected


@pytest.mark.skipif(not torch_available(), reason="torch is not installed (the bench extra)")
@pytest.mark.parametrize("activation", ["sigmoid", "tanh", "relu"])
def test_torch_backend_matches_numpy(activation: str) -> None:
    network = NetworkSpec((117, 48, 32, 10), (activation, activation))
    job = JobSpec(network=network, bunch_size=64)
    corpus = load_corpus(job.data, 10)
    reference, torch_backend = NumpyBackend(), make_backend("torch")
    reference.prepare(job, corpus)
    torch_backend.prepare(job, corpus)
    weights = initial_weights(network, seed=3)
    layout = ElementLayout.for_network(network)
    expected, got = layout.allocate(), layout.allocate()
    frames = corpus.train_frames[:64]
    loss_a, correct_a = reference.gradient(weights, frames, expected)
    loss_b, correct_b = torch_backend.gradient(weights, frames, got)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    assert loss_b == pytest.approx(loss_a, rel=1e-5) and correct_a == correct_b
    assert reference.evaluate(weights)[:2] == torch_backend.evaluate(weights)[:2]


def test_the_settings_know_every_backend_by_name() -> None:
    """A setting is checked against ``BACKEND_NAMES`` before the backends' code loads."""
    assert ("auto", *BACKENDS) == BACKEND_NAMES
