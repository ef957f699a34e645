"""The compiled step (client/kernels.py, client/fused.py) against plain references: each
kernel against a straightforward numpy version of what it computes, and whole steps
against ``BunchNetwork``'s numpy passes (themselves checked against finite differences in
tests/test_network.py) on every arithmetic path."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np
import pytest

from snet.client.network import BunchNetwork
from snet.data.corpus import Corpus, DenseStore, InlineStore
from snet.data.windows import UtteranceBounds
from snet.protocol.network import ElementLayout, NetworkSpec, initial_weights

from helpers import run_process

pytest.importorskip("numba", reason="the compiled step needs numba (the fast extra)")

from snet.client import kernels

rng = np.random.default_rng(7)


def f32(*shape: int) -> np.ndarray:
    return rng.standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize("n", [0, 1, 5, 12])
def test_products_match_numpy(n: int) -> None:
    a, b, bt = f32(16, 7), f32(7, 9), f32(9, 7)
    c = np.full((16, 9), np.nan, np.float32)
    kernels.matmul(a, b, c, n, 0.5)
    np.testing.assert_allclose(c[:n], 0.5 * a[:n] @ b, rtol=1e-5, atol=1e-6)
    kernels.matmul_bt(a, bt, c, n, 2.0)
    np.testing.assert_allclose(c[:n], 2.0 * a[:n] @ bt.T, rtol=1e-5, atol=1e-6)
    rows = f32(16, 9)
    gradient = np.full((7, 9), np.nan, np.float32)
    kernels.matmul_at(a, rows, gradient, n, 0.25)
    np.testing.assert_allclose(gradient, 0.25 * a[:n].T @ rows[:n], rtol=1e-5, atol=1e-6)


def test_windows_are_cut_as_the_corpus_cuts_them() -> None:
    lengths = np.array([3, 1, 6, 2])
    bounds = UtteranceBounds(lengths)
    frames = f32(int(lengths.sum()), 4)
    centres = np.array([0, 2, 3, 4, 9, 10, 11, 5])
    context = 2
    expected = np.take(frames, bounds.window_rows(centres, context), axis=0).reshape(8, -1)
    inputs = np.full((10, 21), np.nan, np.float32)
    kernels.load_windows(frames, bounds.starts, centres, context, 0.5, inputs)
    np.testing.assert_array_equal(inputs[:8, :20], 0.5 * expected)
    assert np.isnan(inputs[:, 20]).all() and np.isnan(inputs[8:]).all()  # nothing else written


@pytest.mark.parametrize("delta", [True, False])
def test_softmax_loss_accuracy_and_delta(delta: bool) -> None:
    z = f32(6, 5) * 4
    z[0, :] = 1.0  # a tie: the label counts as correct
    z[1, 3] = 80.0  # exponents clipped below -30 elsewhere
    labels = np.array([2, 0, 4, 1, 1, 3])
    shifted = z.astype(np.float64) - z.max(axis=1, keepdims=True)
    probabilities = np.exp(np.maximum(shifted, -30.0))
    probabilities /= probabilities.sum(axis=1, keepdims=True)
    rows = np.arange(6)
    expected_loss = -np.log(probabilities[rows, labels]).sum()
    expected_correct = int((shifted[rows, labels] == 0.0).sum())
    out = np.vstack([z, np.full((2, 5), np.nan, np.float32)])
    loss, correct = kernels.softmax_delta(out, 6, labels, -30.0, delta)
    assert correct == expected_correct
    assert shifted[0, labels[0]] == 0.0 and shifted[1, labels[1]] < -30.0  # the tie counts
    assert loss == pytest.approx(expected_loss, rel=1e-6)
    if delta:
        probabilities[rows, labels] -= 1.0
    np.testing.assert_allclose(out[:6], probabilities, rtol=1e-5, atol=1e-7)
    assert np.isnan(out[6:]).all()


@pytest.mark.parametrize("use_plain", [True, False])
def test_forward_layer_folds_the_stored_inputs(use_plain: bool) -> None:
    below, w, b = f32(8, 6), f32(6, 3), f32(3)
    out, plain, bias = (np.empty(s, np.float32) for s in ((8, 3), (8, 6), 3))
    kernels.forward_layer(below, 5, w, b, out, plain, use_plain, 0.5, 0.5, 0.5, bias)
    true_inputs = 0.5 * below[:5].astype(np.float64) + 0.5
    np.testing.assert_allclose(out[:5], 0.5 * (true_inputs @ w + b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("relu", [True, False])
def test_backward_layer(relu: bool) -> None:
    n = 5
    delta, below, w = f32(8, 3), f32(8, 6), f32(6, 3)
    stored = np.tanh(f32(8, 6))
    gw, gb, delta_below = np.empty((6, 3), np.float32), np.empty(3, np.float32), f32(8, 6)
    kernels.backward_layer(delta, n, below, w, gw, gb, 0.5, 0.5, 2.0, delta_below, stored, relu)
    d, x = delta[:n].astype(np.float64), below[:n].astype(np.float64)
    np.testing.assert_allclose(gb, d.sum(axis=0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(gw, (0.5 * x + 0.5).T @ d, rtol=1e-5, atol=1e-5)
    slope = (stored[:n] > 0) if relu else 1 - stored[:n].astype(np.float64) ** 2
    np.testing.assert_allclose(delta_below[:n], 2.0 * (d @ w.T) * slope, rtol=1e-5, atol=1e-6)


# Every arithmetic path: depths, activations, bunches smaller than a layer (true inputs)
# and larger (column sums), the numpy path's transposed gradient from 128 on.
CASES = [
    ((5, 3), (), 7),
    ((5, 4, 3), ("sigmoid",), 7),
    ((5, 4, 4, 4, 3), ("relu", "tanh", "sigmoid"), 7),
    *(((5, 4, 12), (kind,), 6) for kind in ("sigmoid", "tanh", "relu")),
    *(((5, 6, 4, 3), (kind, kind), 130) for kind in ("sigmoid", "tanh", "relu")),
    ((39, 50, 42), ("sigmoid",), 12),
]


def problem(sizes: tuple[int, ...], activations: tuple[str, ...], n: int) -> tuple:
    spec = NetworkSpec(sizes, activations)
    weights = initial_weights(spec, seed=3)
    weights += rng.normal(0.0, 0.3, size=weights.shape).astype(np.float32)
    x = f32(n, sizes[0])
    labels = rng.integers(0, sizes[-1], size=n)
    return spec, weights, x, labels


@pytest.mark.parametrize(("sizes", "activations", "n"), CASES)
def test_compiled_step_equals_numpy_passes(
    sizes: tuple[int, ...], activations: tuple[str, ...], n: int
) -> None:
    spec, weights, x, labels = problem(sizes, activations, n)
    numpy_net = BunchNetwork(spec, 256, kernels="numpy")
    compiled = BunchNetwork(spec, 256, kernels="numba")
    assert (numpy_net.kernels, compiled.kernels) == ("numpy", "numba")
    expected, got = (np.full(numpy_net.layout.size, np.nan, np.float32) for _ in range(2))
    loss, correct = numpy_net.gradient(weights, x, labels, expected)
    assert compiled.gradient(weights, x, labels, got) == (pytest.approx(loss, rel=1e-5), correct)
    scale = np.abs(expected).max()
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5 * scale)
    small = BunchNetwork(spec, 4, kernels="numba")  # evaluated in bunches of 4
    assert small.evaluate(weights, x, labels) == (pytest.approx(loss, rel=1e-5), correct)


def corpus_of(store: DenseStore | InlineStore, lengths: np.ndarray, context: int) -> Corpus:
    everything = np.arange(int(lengths.sum()))
    return Corpus(store, UtteranceBounds(lengths), everything, everything[:4], 3, context)


def test_gradient_of_frames_cuts_the_same_windows_from_any_store() -> None:
    lengths = np.array([4, 9, 2, 7])
    frames, labels = f32(22, 3), rng.integers(0, 4, size=22)
    inline = InlineStore(22, 3)
    inline.add(np.arange(22), frames, labels)
    spec = NetworkSpec((15, 6, 4), ("sigmoid",))
    weights = initial_weights(spec, seed=2)
    centres = np.array([0, 3, 4, 12, 13, 14, 21, 8])
    results = []
    for store in (DenseStore(frames, labels), inline):
        corpus = corpus_of(store, lengths, context=2)
        for kernel in ("numba", "numpy"):
            out = np.full(ElementLayout.for_network(spec).size, np.nan, np.float32)
            net = BunchNetwork(spec, 16, kernels=kernel)
            loss, correct = net.gradient_of_frames(weights, corpus, centres, out)
            results.append((loss, correct, out))
    direct = np.empty_like(results[0][2])
    x = corpus_of(DenseStore(frames, labels), lengths, 2).windows(centres)
    BunchNetwork(spec, 16, kernels="numpy").gradient(weights, x, labels[centres], direct)
    for loss, correct, out in results:
        assert (loss, correct) == (pytest.approx(results[0][0], rel=1e-6), results[0][1])
        np.testing.assert_allclose(out, direct, rtol=1e-5, atol=1e-6)


def test_bad_requests_are_clear_errors() -> None:
    spec = NetworkSpec((6, 4, 3), ("tanh",))
    with pytest.raises(ValueError, match="unknown kernels 'fortran'"):
        BunchNetwork(spec, 8, kernels="fortran")
    net = BunchNetwork(spec, 8, kernels="numba")
    weights, out = initial_weights(spec, seed=1), ElementLayout.for_network(spec).allocate()
    with pytest.raises(ValueError, match="bunch of 9 is larger than the 8 prepared"):
        net.gradient(weights, f32(9, 6), np.zeros(9, np.int64), out)
    corpus = corpus_of(DenseStore(f32(10, 3), np.zeros(10, np.int64)), np.array([10]), 2)
    with pytest.raises(ValueError, match="windows of 3 features do not fit"):
        net.gradient_of_frames(weights, corpus, np.arange(4), out)


def test_the_numpy_passes_are_kept_on_request(monkeypatch: pytest.MonkeyPatch) -> None:
    spec = NetworkSpec((6, 4, 3), ("tanh",))
    monkeypatch.delenv("SNET_KERNELS", raising=False)
    assert BunchNetwork(spec, 8).kernels == "numba"  # numba is installed here
    monkeypatch.setenv("SNET_KERNELS", "numpy")
    assert BunchNetwork(spec, 8).kernels == "numpy"
    replaced = BunchNetwork(spec, 8, matmul=lambda a, b, out: np.matmul(a, b, out=out))
    monkeypatch.delenv("SNET_KERNELS")
    assert replaced.kernels == "numpy"  # another backend's products: its own passes


def test_a_job_too_small_to_pay_for_the_compiled_step_trains_with_numpy(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """ "auto" is decided by the job's connection updates (epochs x training frames x
    connections) against the load the compiled step costs; an explicit choice stands."""
    from snet.client.backend import NumpyBackend
    from snet.client.kernel_choice import COMPILED_STEP_PAYS_FROM, job_kernels
    from snet.protocol.job import DataSpec, JobSpec

    monkeypatch.delenv("SNET_KERNELS", raising=False)
    spec = NetworkSpec((15, 2000, 4), ("sigmoid",))  # wide: a few thousand epochs pay
    frames = 22
    paying = int(np.ceil(COMPILED_STEP_PAYS_FROM / (frames * spec.connections)))
    data = DataSpec(source="frames.npz", context=2)  # the corpus below: 3 features

    def job(epochs: int) -> JobSpec:
        return JobSpec(network=spec, epochs=epochs, data=data)

    big, small = job(paying), job(paying - 1)
    assert (job_kernels("auto", big, frames), job_kernels("auto", small, frames)) == (
        "auto",
        "numpy",
    )
    assert job_kernels("numba", small, frames) == "numba"  # asked for: taken as given
    assert job_kernels("numpy", big, frames) == "numpy"
    with pytest.raises(ValueError, match="unknown kernels 'fortran'"):
        job_kernels("fortran", big, frames)
    store = DenseStore(f32(frames, 3), np.zeros(frames, np.int64))
    corpus = corpus_of(store, np.array([frames]), 2)

    def prepared(backend: NumpyBackend, job: JobSpec) -> str:
        backend.prepare(job, corpus)
        return backend.kernels

    assert NumpyBackend().kernels == "numpy"  # nothing loaded before the job is known
    assert prepared(NumpyBackend(), big) == "numba"  # numba is installed here
    assert prepared(NumpyBackend(), small) == "numpy"
    assert prepared(NumpyBackend(kernels="numba"), small) == "numba"
    assert prepared(NumpyBackend(kernels="numpy"), big) == "numpy"
    monkeypatch.setenv("SNET_KERNELS", "numpy")
    assert prepared(NumpyBackend(), big) == "numpy"
    monkeypatch.setenv("SNET_KERNELS", "numba")
    assert prepared(NumpyBackend(), small) == "numba"


@pytest.mark.system
def test_snet_train_of_a_small_job_never_imports_numba(tmp_path: Path) -> None:
    # One epoch of the default job is well short of paying for the compiled step's load.
    probe = (
        "import sys; from snet.cli.main import main;"
        f"code = main(['train', '--epochs', '1', '--out-dir', {str(tmp_path)!r}]);"
        "print('numba' in sys.modules, code)"
    )
    env = {k: v for k, v in os.environ.items() if k != "SNET_KERNELS"}  # the default: auto
    output = run_process([sys.executable, "-c", probe], check=True, timeout=120, env=env).stdout
    assert output.splitlines()[-1] == "False 0"
    assert (tmp_path / "weights.npz").is_file()
