"""The constants that let both compute backends skip arithmetic passes over hidden layers.

A sigmoid unit is computed as ``h = (1 + t) / 2`` with ``t = tanh(z / 2)``: one
vectorised ``tanh`` pass instead of four passes over the (bunch x hidden) array, and never
an overflow or a denormal. The backends store ``t`` instead of ``h`` and fold the affine
maps into places where they cost almost nothing:

- the halving of ``z`` goes into the inputs: the first layer's inputs are copied scaled by
  ``pre`` together with a column of ``pre`` that multiplies the bias row (the element
  stores each layer's weights and then its bias, i.e. a ``(fan_in + 1, fan_out)``
  matrix), so one matrix product yields ``pre * (x W + b)`` and the bias gradient comes out
  of the weight-gradient product;
- the ``(1 + t) / 2`` of a layer's input goes into the (small) pre-activations and bias
  sums of the next layer: ``z = (s W) * p + (b + q colsum(W))`` with ``h = p s + q``;
- the ``1/4`` of the sigmoid's derivative ``h (1 - h) = (1 - t^2) / 4`` and the ``1/pre``
  that the first layer's folded gradient needs go into one scaling of the (smaller)
  delta of the layer above, so the derivative is ``delta * (1 - t^2)``.

Everything here is a scalar per layer; tests/test_network.py checks the resulting
gradients against finite differences for every activation and depth.
"""

from __future__ import annotations

from dataclasses import dataclass

from snet.protocol.network import NetworkSpec


@dataclass(frozen=True)
class LayerScales:
    """How layer ``l``'s stored values relate to the true ones.

    ``pre``: the layer computes ``pre * z`` (0.5 for sigmoid units, whose stored output is
    ``tanh(z / 2)``). ``in_mul``, ``in_add``: the true input is ``in_mul * stored + in_add``
    (layers above the first; the first layer's inputs are folded as described above).
    ``back``: what the delta of this layer is multiplied by, once its own gradient is
    written, before it is propagated into the layer below (1.0 for the first layer).
    """

    pre: float
    in_mul: float
    in_add: float
    back: float


DERIVATIVE_SCALE = {"sigmoid": 0.25, "tanh": 1.0, "relu": 1.0}


def layer_scales(spec: NetworkSpec) -> list[LayerScales]:
    """One ``LayerScales`` per weight layer of ``spec`` (the last one is softmax)."""
    kinds = [*spec.activations, "softmax"]
    pre = [0.5 if kind == "sigmoid" else 1.0 for kind in kinds]
    scales = []
    for layer in range(len(kinds)):
        below = kinds[layer - 1] if layer > 0 else None
        sigmoid_below = below == "sigmoid"
        back = 1.0
        if below is not None:
            # delta' below = m * (derivative scale) * (delta @ W.T) * g(stored), where m is
            # 1/pre for the first layer (its gradient product uses inputs scaled by pre).
            m = 1.0 / pre[0] if layer == 1 else 1.0
            back = m * DERIVATIVE_SCALE[below]
        scales.append(
            LayerScales(
                pre=pre[layer],
                in_mul=0.5 if sigmoid_below else 1.0,
                in_add=0.5 if sigmoid_below else 0.0,
                back=back,
            )
        )
    return scales
