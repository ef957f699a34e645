"""Worker arithmetic: MCUPS of snet's backends beside PyTorch and the GEMM ceiling.

Run in a fresh process per thread count (BLAS fixes its thread count when loaded):
``python -m bench.worker_compute --network 351:1262:45 --bunch 1000 --threads 1``
prints one JSON object. MCUPS = (weights + biases) x patterns / seconds / 1e6.

- ``numpy`` / ``numba`` / ``torch_backend``: snet's backends computing one bunch's summed
  gradient, context windows cut from frames included (as a worker does); ``numpy`` is the
  numpy backend's pure numpy passes, ``numba`` the same backend with its compiled step
  (client/fused.py, when numba is installed), timed in turns with the former.
- ``torch_autograd``: what a PyTorch user writes: nn.Linear layers, sigmoid, summed
  cross-entropy, ``backward()``; ``torch_autograd_sgd`` adds the optimizer step (SGD with
  momentum), i.e. the whole sequential training step.
- ``torch_hand``: a hand-written PyTorch step with preallocated buffers.
- ``gemm_ceiling_*``: the same five matrix products alone (forward I.H and H.O, back H.O,
  weight gradients I.H and H.O), as MCUPS: the physical limit of this arithmetic with that
  BLAS. All torch figures run with flush-to-zero on.

With one thread all of them are timed in turns within one process
(``interleaved_seconds``), counting the compute thread's CPU time, so that their ratios
hold on a shared machine; with more threads each is timed in one stretch of wall-clock
time.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from snet.cli.runtime import BLAS_VARIABLES


def _synthetic_corpus(inputs: int, classes: int, frames: int = 20000) -> Any:
    import numpy as np

    from snet.data.corpus import Corpus, DenseStore
    from snet.data.windows import UtteranceBounds

    context = 4 if inputs % 9 == 0 and inputs > 39 else 0
    features = inputs // (2 * context + 1)
    rng = np.random.default_rng(0)
    everything = np.arange(frames)
    store = DenseStore(
        rng.standard_normal((frames, features)).astype(np.float32),
        rng.integers(0, classes, frames),
    )
    bounds = UtteranceBounds(np.full(frames // 100, 100))
    return Corpus(store, bounds, everything, everything[:2000], features, context)


def measure(network: str, bunch: int, threads: int, budget: float = 8.0) -> dict[str, Any]:
    import time

    import numpy as np

    from snet.client.backend import NumpyBackend, kernels_available, make_backend, torch_available
    from snet.protocol.fpu import flush_denormals
    from snet.protocol.job import DataSpec, JobSpec
    from snet.protocol.network import ElementLayout, NetworkSpec, initial_weights

    from .timing import interleaved_seconds, seconds_per_call

    flush_denormals(True)
    spec = NetworkSpec.parse(network)
    inputs, hidden, outputs = spec.sizes[0], spec.sizes[1], spec.sizes[-1]
    corpus = _synthetic_corpus(inputs, outputs)
    job = JobSpec(
        network=spec, bunch_size=bunch, data=DataSpec(source="bench", context=corpus.context)
    )
    weights = initial_weights(spec, seed=1)
    out = ElementLayout.for_network(spec).allocate()
    frames = np.random.default_rng(1).choice(corpus.train_frames, bunch, replace=False)
    functions: dict[str, Any] = {}

    backends: dict[str, Any] = {"numpy": NumpyBackend(kernels="numpy")}
    if kernels_available():
        backends["numba"] = NumpyBackend(kernels="numba")  # the same backend, compiled step
    if torch_available():
        backends["torch_backend"] = make_backend("torch", threads)
    for name, backend in backends.items():
        backend.prepare(job, corpus)

        def step(chosen: Any = backend) -> None:
            chosen.gradient(weights, frames, out)

        functions[name] = step

    rng = np.random.default_rng(2)
    x = rng.standard_normal((bunch, inputs)).astype(np.float32)
    w1 = rng.standard_normal((inputs, hidden)).astype(np.float32)
    h = rng.random((bunch, hidden)).astype(np.float32)
    w2 = rng.standard_normal((hidden, outputs)).astype(np.float32)
    d = rng.standard_normal((bunch, outputs)).astype(np.float32)

    def numpy_gemms() -> None:
        x @ w1, h @ w2, d @ w2.T, x.T @ h, h.T @ d

    functions["gemm_ceiling_numpy"] = numpy_gemms
    if torch_available():
        functions.update(_torch_functions(spec, bunch, threads))
    if threads == 1:
        # Timed in turns, as the compute thread's CPU time, which leaves out the time it
        # waited for a core on this shared machine.
        seconds = interleaved_seconds(functions, budget, clock=time.thread_time)
    else:
        # BLAS threads work too, so only wall-clock time says how fast a step is; and each
        # function is timed in one stretch, because OpenBLAS's and PyTorch's thread pools
        # keep spinning for a while after their work and slow each other down when they
        # take turns (30x here).
        seconds = {
            name: seconds_per_call(function, budget / len(functions))
            for name, function in functions.items()
        }
    results: dict[str, Any] = {"network": network, "bunch": bunch, "threads": threads}
    results["clock"] = "thread CPU time, in turns" if threads == 1 else "wall, one at a time"
    for name, value in seconds.items():
        results[name] = round(spec.connections * bunch / value / 1e6, 1)
    return results


def _torch_functions(spec: Any, bunch: int, threads: int) -> dict[str, Any]:
    """PyTorch's steps and its GEMM ceiling, as functions to time."""
    import torch

    torch.set_num_threads(threads)
    torch.set_flush_denormal(True)
    inputs, hidden, outputs = spec.sizes[0], spec.sizes[1], spec.sizes[-1]
    x = torch.randn(bunch, inputs)
    y = torch.randint(0, outputs, (bunch,))
    model = torch.nn.Sequential(
        torch.nn.Linear(inputs, hidden), torch.nn.Sigmoid(), torch.nn.Linear(hidden, outputs)
    )
    loss_function = torch.nn.CrossEntropyLoss(reduction="sum")
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-6, momentum=0.9)

    def autograd() -> None:
        model.zero_grad(set_to_none=True)
        loss_function(model(x), y).backward()

    def autograd_sgd() -> None:
        optimizer.zero_grad(set_to_none=True)
        loss_function(model(x), y).backward()
        optimizer.step()

    w1, b1 = torch.randn(inputs, hidden) * 0.05, torch.zeros(hidden)
    w2, b2 = torch.randn(hidden, outputs) * 0.05, torch.zeros(outputs)
    g1, gb1, g2, gb2 = (
        torch.empty_like(w1),
        torch.empty_like(b1),
        torch.empty_like(w2),
        torch.empty_like(b2),
    )
    hb, zb, dh, slope = (torch.empty(bunch, n) for n in (hidden, outputs, hidden, hidden))
    rows = torch.arange(bunch)

    def hand() -> None:
        with torch.no_grad():
            _hand()

    def _hand() -> None:
        torch.addmm(b1, x, w1, out=hb).sigmoid_()
        torch.addmm(b2, hb, w2, out=zb)
        torch.softmax(zb, dim=1, out=zb)
        zb[rows, y] -= 1.0
        torch.mm(hb.t(), zb, out=g2)
        torch.sum(zb, dim=0, out=gb2)
        torch.mm(zb, w2.t(), out=dh)
        torch.mul(hb, hb, out=slope)
        torch.sub(hb, slope, out=slope)
        dh.mul_(slope)
        torch.mm(x.t(), dh, out=g1)
        torch.sum(dh, dim=0, out=gb1)

    h = torch.rand(bunch, hidden)
    d = torch.randn(bunch, outputs)

    def gemms() -> None:
        x @ w1, h @ w2, d @ w2.t(), x.t() @ h, h.t() @ d

    return {
        "torch_autograd": autograd,
        "torch_autograd_sgd": autograd_sgd,
        "torch_hand": hand,
        "gemm_ceiling_torch": gemms,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--network", default="351:1262:45")
    parser.add_argument("--bunch", type=int, default=1000)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    for variable in BLAS_VARIABLES:
        if os.environ.get(variable) != str(args.threads):
            print(f"set {variable}={args.threads} before starting this process", file=sys.stderr)
            return 2
    print(json.dumps(measure(args.network, args.bunch, args.threads)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
