"""The job's test file, scored once with the final weights when training ends.

The CV set steers training (newbob, the epochs' records); a test set must not, so it is
scored only once, by the server itself, after the last epoch: it holds the final weights
and the data plan, and one forward pass over a test set is small beside training. The
result goes into /status (``test``), status.json and the log.

The forward pass is the plain one (``x W + b`` per layer, the hidden activation, a
log-softmax at the output whose exponents are clipped at the workers' SOFTMAX_FLOOR, so
that a frame's loss is at most about 30 + ln K, as theirs), in float64 so that the loss
is not rounded twice; it reads the test frames a block at a time and cuts their context
windows like the workers do. A CV referee scores with it too (server/cv_referee.py).
"""

from __future__ import annotations

import numpy as np

from snet.data.norms import Norms
from snet.data.sources import FrameSource, total_frames
from snet.data.windows import UtteranceBounds
from snet.protocol.network import SOFTMAX_FLOOR, ElementLayout, NetworkSpec

BLOCK_FRAMES = 4096


def _hidden(kind: str, z: np.ndarray) -> np.ndarray:
    out: np.ndarray
    if kind == "relu":
        out = np.maximum(z, 0.0)
    elif kind == "tanh":
        out = np.tanh(z)
    else:
        out = 0.5 * (1.0 + np.tanh(0.5 * z))  # sigmoid without overflow in exp
    return out


def score_patterns(
    network: NetworkSpec, flat: np.ndarray, patterns: np.ndarray, labels: np.ndarray
) -> tuple[int, float]:
    """(correct, summed cross-entropy) of the weights ``flat`` on ``patterns``."""
    views = ElementLayout.for_network(network).views(flat)
    below = patterns.astype(np.float64)
    layers = len(views) // 2
    for layer in range(layers):
        z = below @ views[2 * layer] + views[2 * layer + 1]
        below = z if layer == layers - 1 else _hidden(network.activations[layer], z)
    shifted = np.maximum(below - below.max(axis=1, keepdims=True), SOFTMAX_FLOOR)
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))  # as the workers
    rows = np.arange(len(labels))
    correct = int((below.argmax(axis=1) == labels).sum())
    return correct, float(-log_p[rows, labels].sum())


def score_frames(
    network: NetworkSpec,
    flat: np.ndarray,
    source: FrameSource,
    centres: np.ndarray,
    norms: Norms,
    context: int,
) -> tuple[int, float]:
    """(correct, summed loss) of the weights ``flat`` on the patterns centred on the frames
    ``centres`` of ``source`` (the test file, or the CV frames: server/cv_referee.py)."""
    bounds = UtteranceBounds(source.lengths)
    correct, loss = 0, 0.0
    for start in range(0, len(centres), BLOCK_FRAMES):
        block = np.asarray(centres[start : start + BLOCK_FRAMES], dtype=np.int64)
        rows = bounds.window_rows(block, context)
        unique, inverse = np.unique(rows, return_inverse=True)
        frames = norms.apply(source.read(unique))[inverse.reshape(rows.shape)]
        part_correct, part_loss = score_patterns(
            network, flat, frames.reshape(len(block), -1), source.labels[block]
        )
        correct, loss = correct + part_correct, loss + part_loss
    return correct, loss


def score_test_set(
    network: NetworkSpec, flat: np.ndarray, source: FrameSource, norms: Norms, context: int
) -> dict[str, float | int | str]:
    """The test file's frame accuracy and mean loss with the weights ``flat``."""
    count = total_frames(source)
    centres = np.arange(count, dtype=np.int64)
    correct, loss = score_frames(network, flat, source, centres, norms, context)
    return {
        "data": source.description,
        "frames": count,
        "accuracy": round(correct / max(count, 1), 6),
        "loss": round(loss / max(count, 1), 6),
    }


def describe_test_result(result: dict[str, float | int | str]) -> str:
    """The line the server logs and ``snet train`` prints for a scored test file."""
    return (
        f"test set {result['data']}: frame accuracy {100 * float(result['accuracy']):.2f}% "
        f"of {result['frames']} frames, loss {float(result['loss']):.4f}"
    )
