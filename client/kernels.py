"""Compiled kernels (numba) for the fused bunch step of ``client/fused.py``.

Optional: imported only when numba is installed (``pip install 'snet-train[fast]'``).
At the bunch sizes speech training uses (12-256) a numpy step is as much Python and
per-call dispatch as arithmetic: each numpy call costs about a microsecond, and a bunch
of 12 on 39:500:42 has only ~33 us of matrix products in it. These kernels do the same
arithmetic as ``BunchNetwork``'s numpy passes, each fused into one loop, and call the
matrix products straight into numpy's own OpenBLAS (``cblas_sgemm``), without numpy's
dispatch; the scalar factors of the layer folding (client/layer_scales.py, powers of two)
ride in the products' ``alpha``, where they cost nothing and round the same.

Every kernel takes whole preallocated buffers and the bunch size ``n``; buffers are
C-contiguous float32 with their rows at a stride of their width. The ``tanh`` passes stay
with numpy: its vectorised ``tanh`` is ten times faster than a compiled scalar loop here.
Compiled code is cached on disk (numba's ``cache=True``), so a process pays the
compilation once per machine, not once per start.
"""

from __future__ import annotations

import glob
import os
from typing import Any

import llvmlite.binding
import numba
import numpy as np
from numba import types

_ROW_MAJOR, _PLAIN, _TRANSPOSED = 101, 111, 112


def _openblas_sgemm() -> Any:
    """numpy's bundled OpenBLAS ``cblas_sgemm`` (64-bit integers), the library numpy's
    own matrix products (and the benchmark's GEMM ceiling) use."""
    libs = os.path.join(os.path.dirname(np.__file__), os.pardir, "numpy.libs")
    found = sorted(glob.glob(os.path.join(libs, "libscipy_openblas64_*.so")))
    if not found:
        raise ImportError("numpy's bundled OpenBLAS (numpy.libs/libscipy_openblas64_*.so)")
    llvmlite.binding.load_library_permanently(found[0])
    i32, i64, f32, pointer = types.int32, types.int64, types.float32, types.voidptr
    signature = types.void(i32, i32, i32, i64, i64, i64, f32, pointer, i64, pointer, i64, f32)
    signature = types.void(*signature.args, pointer, i64)
    return types.ExternalFunction("scipy_cblas_sgemm64_", signature)


_sgemm: Any = _openblas_sgemm()  # called from compiled code only
_jit = numba.njit(cache=True, nogil=True)


@_jit
def _sgemm_rows(
    transpose_a: bool,
    transpose_b: bool,
    m: int,
    n: int,
    k: int,
    alpha: float,
    a: np.ndarray,
    b: np.ndarray,
    c: np.ndarray,
) -> None:
    """c = alpha * op(a) @ op(b) for row-major operands, (m, k) @ (k, n) after op."""
    _sgemm(
        _ROW_MAJOR,
        _TRANSPOSED if transpose_a else _PLAIN,
        _TRANSPOSED if transpose_b else _PLAIN,
        m,
        n,
        k,
        np.float32(alpha),
        a.ctypes.data,
        a.shape[1],
        b.ctypes.data,
        b.shape[1],
        np.float32(0.0),
        c.ctypes.data,
        c.shape[1],
    )


@_jit
def matmul(a: np.ndarray, b: np.ndarray, c: np.ndarray, n: int, alpha: float) -> None:
    """c[:n] = alpha * a[:n] @ b."""
    if n > 0:
        _sgemm_rows(False, False, n, b.shape[1], b.shape[0], alpha, a, b, c)


@_jit
def matmul_bt(a: np.ndarray, b: np.ndarray, c: np.ndarray, n: int, alpha: float) -> None:
    """c[:n] = alpha * a[:n] @ b.T."""
    if n > 0:
        _sgemm_rows(False, True, n, b.shape[0], b.shape[1], alpha, a, b, c)


@_jit
def matmul_at(a: np.ndarray, b: np.ndarray, c: np.ndarray, n: int, alpha: float) -> None:
    """c = alpha * a[:n].T @ b[:n] (a weight gradient: zero for an empty bunch)."""
    if n > 0:
        _sgemm_rows(True, False, a.shape[1], b.shape[1], n, alpha, a, b, c)
    else:
        c[:] = 0.0


@_jit
def load_windows(
    frames: np.ndarray,
    starts: np.ndarray,
    centres: np.ndarray,
    context: int,
    pre: float,
    inputs: np.ndarray,
) -> None:
    """inputs[i, :-1] = pre * the context window of frame centres[i], read straight from
    the (frames, features) array: the rows ``centre - context .. centre + context``,
    each clipped to the centre's utterance (``starts``: the first frame of every
    utterance, then the total), as ``UtteranceBounds.window_rows`` cuts them."""
    features = frames.shape[1]
    scale = np.float32(pre)
    last_utterance = len(starts) - 2
    for i in range(len(centres)):
        centre = centres[i]
        utterance = np.searchsorted(starts, centre, side="right") - 1
        utterance = min(max(utterance, 0), last_utterance)
        first, last = starts[utterance], starts[utterance + 1] - 1
        for offset in range(2 * context + 1):
            row = min(max(centre - context + offset, first), last)
            base = offset * features
            for f in range(features):
                inputs[i, base + f] = frames[row, f] * scale


@_jit
def load_patterns(x: np.ndarray, pre: float, inputs: np.ndarray) -> None:
    """inputs[:n, :-1] = pre * x (patterns cut elsewhere)."""
    scale = np.float32(pre)
    width = x.shape[1]
    for i in range(x.shape[0]):
        for j in range(width):
            inputs[i, j] = x[i, j] * scale


@_jit
def forward_layer(
    below: np.ndarray,
    n: int,
    w: np.ndarray,
    b: np.ndarray,
    out: np.ndarray,
    plain: np.ndarray,
    use_plain: bool,
    in_mul: float,
    in_add: float,
    pre: float,
    bias: np.ndarray,
) -> None:
    """out[:n] = pre * z of a layer above the first, from the stored outputs ``below``
    (true input = in_mul * stored + in_add): with ``use_plain`` from the true inputs
    made in ``plain``, else with in_add folded into the bias through W's column sums
    (``BunchNetwork._pre_activations``)."""
    fan_in, fan_out = w.shape
    if use_plain:
        m, a = np.float32(in_mul), np.float32(in_add)
        for i in range(n):
            for j in range(fan_in):
                plain[i, j] = below[i, j] * m + a
        matmul(plain, w, out, n, pre)
        for j in range(fan_out):
            bias[j] = b[j] * np.float32(pre)
    else:
        matmul(below, w, out, n, pre * in_mul)
        if in_add != 0.0:
            for j in range(fan_out):
                bias[j] = w[0, j]
            for r in range(1, fan_in):
                for j in range(fan_out):
                    bias[j] += w[r, j]
            for j in range(fan_out):
                bias[j] = (bias[j] * np.float32(in_add) + b[j]) * np.float32(pre)
        else:
            for j in range(fan_out):
                bias[j] = b[j] * np.float32(pre)
    for i in range(n):
        for j in range(fan_out):
            out[i, j] += bias[j]


@_jit
def softmax_delta(
    z: np.ndarray, n: int, labels: np.ndarray, floor: float, delta: bool
) -> tuple[float, int]:
    """Logits z[:n] (bunch, outputs) become the softmax probabilities, minus one at each
    pattern's label when ``delta`` (the output delta of the summed cross-entropy);
    returns (summed loss, correct). A pattern counts as correct when its label's logit
    is the maximum (ties included), and exponents are clipped to >= ``floor``, as in
    ``BunchNetwork._softmax_scores``."""
    outputs = z.shape[1]
    lowest = np.float32(floor)
    loss = 0.0
    correct = 0
    for i in range(n):
        label = labels[i]
        top = z[i, 0]
        for j in range(1, outputs):
            top = max(top, z[i, j])
        if z[i, label] - top == 0.0:
            correct += 1
        total = np.float32(0.0)
        for j in range(outputs):
            e = np.float32(np.exp(max(z[i, j] - top, lowest)))
            z[i, j] = e
            total += e
        for j in range(outputs):
            z[i, j] = z[i, j] / total
        loss -= np.log(np.float64(z[i, label]))
        if delta:
            z[i, label] -= np.float32(1.0)
    return loss, correct


@_jit
def backward_layer(
    delta: np.ndarray,
    n: int,
    below: np.ndarray,
    w: np.ndarray,
    gw: np.ndarray,
    gb: np.ndarray,
    in_mul: float,
    in_add: float,
    back: float,
    delta_below: np.ndarray,
    stored_below: np.ndarray,
    relu: bool,
) -> None:
    """One layer above the first, backwards (``BunchNetwork.gradient``'s loop body):
    gw = in_mul * below.T @ delta + in_add * gb, gb = the column sums of delta, then
    delta_below = back * (delta @ w.T) times the derivative at the stored outputs
    below: 1 - stored^2 (sigmoid, tanh) or stored > 0 (relu)."""
    fan_in, fan_out = w.shape
    matmul_at(below, delta, gw, n, in_mul)
    for j in range(fan_out):
        gb[j] = 0.0
    for i in range(n):
        for j in range(fan_out):
            gb[j] += delta[i, j]
    if in_add != 0.0:
        add = np.float32(in_add)
        for r in range(fan_in):
            for j in range(fan_out):
                gw[r, j] += gb[j] * add
    matmul_bt(delta, w, delta_below, n, back)
    one, zero = np.float32(1.0), np.float32(0.0)
    for i in range(n):
        for j in range(fan_in):
            t = stored_below[i, j]
            if relu:
                delta_below[i, j] *= one if t > zero else zero
            else:
                delta_below[i, j] *= one - t * t


@_jit
def output_layer(
    below: np.ndarray,
    n: int,
    w: np.ndarray,
    b: np.ndarray,
    logits: np.ndarray,
    plain: np.ndarray,
    use_plain: bool,
    in_mul: float,
    in_add: float,
    back: float,
    bias: np.ndarray,
    labels: np.ndarray,
    floor: float,
    gw: np.ndarray,
    gb: np.ndarray,
    delta_below: np.ndarray,
    relu: bool,
) -> tuple[float, int]:
    """The softmax layer's whole step in one call: ``forward_layer`` (pre = 1),
    ``softmax_delta`` and ``backward_layer`` (from the true inputs in ``plain`` when
    ``use_plain``); returns (summed loss, correct)."""
    forward_layer(below, n, w, b, logits, plain, use_plain, in_mul, in_add, 1.0, bias)
    loss, correct = softmax_delta(logits, n, labels, floor, True)
    if use_plain:
        backward_layer(logits, n, plain, w, gw, gb, 1.0, 0.0, back, delta_below, below, relu)
    else:
        backward_layer(logits, n, below, w, gw, gb, in_mul, in_add, back, delta_below, below, relu)
    return loss, correct
