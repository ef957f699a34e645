"""BunchNetwork's math against independent references: finite differences and a float64
re-implementation of the forward pass (and PyTorch autograd when it is installed)."""

from __future__ import annotations

import numpy as np
import pytest

from snet.client.network import BunchNetwork
from snet.protocol.network import ElementLayout, NetworkSpec, initial_weights

ACTIVATION_CASES = [("sigmoid", "sigmoid"), ("tanh", "tanh"), ("relu", "relu"), ("tanh", "relu")]


def tiny(activations: tuple[str, ...]) -> NetworkSpec:
    return NetworkSpec((5, 4, 3, 3), activations)


def problem(spec: NetworkSpec, n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Weights (float32 element, non-zero biases), a bunch of inputs and labels."""
    rng = np.random.default_rng(seed)
    weights = initial_weights(spec, seed=seed + 1)
    weights += rng.normal(0.0, 0.3, size=weights.shape).astype(np.float32)
    x = rng.normal(0.0, 1.0, size=(n, spec.input_size)).astype(np.float32)
    labels = rng.integers(0, spec.output_size, size=n).astype(np.int64)
    return weights, x, labels


def reference_scores(
    spec: NetworkSpec, flat: np.ndarray, x: np.ndarray, labels: np.ndarray
) -> tuple[float, np.ndarray]:
    """Summed cross-entropy and per-pattern predictions, in float64, written independently."""
    loss, predicted, _ = reference_forward(spec, flat, x, labels)
    return loss, predicted


def reference_forward(
    spec: NetworkSpec, flat: np.ndarray, x: np.ndarray, labels: np.ndarray
) -> tuple[float, np.ndarray, list[np.ndarray]]:
    """``reference_scores`` plus which relu units are active (where the loss has kinks)."""
    layout = ElementLayout.for_network(spec)
    flat = np.asarray(flat, dtype=np.float64)
    params = [
        flat[offset : offset + int(np.prod(shape))].reshape(shape)
        for offset, shape in zip(layout.offsets, layout.shapes, strict=True)
    ]
    h = np.asarray(x, dtype=np.float64)
    active: list[np.ndarray] = []
    layers = len(params) // 2
    for layer in range(layers):
        z = h @ params[2 * layer] + params[2 * layer + 1]
        if layer == layers - 1:
            z = z - z.max(axis=1, keepdims=True)
            log_probs = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
            loss = -float(log_probs[np.arange(len(labels)), labels].sum())
            return loss, log_probs.argmax(axis=1), active
        kind = spec.activations[layer]
        if kind == "sigmoid":
            h = 1.0 / (1.0 + np.exp(-z))
        elif kind == "tanh":
            h = np.tanh(z)
        else:
            active.append(z > 0)
            h = np.maximum(z, 0.0)
    raise AssertionError("unreachable")


def analytic_gradient(
    spec: NetworkSpec, weights: np.ndarray, x: np.ndarray, labels: np.ndarray, max_bunch: int
) -> tuple[np.ndarray, float, int]:
    net = BunchNetwork(spec, max_bunch)
    out = np.full(net.layout.size, np.nan, dtype=np.float32)  # every entry must be written
    loss, correct = net.gradient(weights, x, labels, out)
    return out, loss, correct


def numeric_gradient(
    spec: NetworkSpec, weights: np.ndarray, x: np.ndarray, labels: np.ndarray
) -> np.ndarray:
    """Central finite differences (step 1e-6) of the float64 reference loss."""
    base = weights.astype(np.float64)
    numeric = np.empty(base.size)
    for i in range(base.size):
        plus, minus = base.copy(), base.copy()
        plus[i] += 1e-6
        minus[i] -= 1e-6
        lp, _ = reference_scores(spec, plus, x, labels)
        lm, _ = reference_scores(spec, minus, x, labels)
        numeric[i] = (lp - lm) / 2e-6
    return numeric


@pytest.mark.parametrize("activations", ACTIVATION_CASES, ids="-".join)
def test_gradient_matches_float64_finite_differences(activations: tuple[str, str]) -> None:
    spec = tiny(activations)
    weights, x, labels = problem(spec, n=8)
    grad, _, _ = analytic_gradient(spec, weights, x, labels, max_bunch=8)
    assert np.isfinite(grad).all()
    numeric = numeric_gradient(spec, weights, x, labels)
    scale = np.abs(numeric).max()
    assert scale > 0.1  # the problem is not degenerate
    np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-4 * scale)


@pytest.mark.parametrize("activations", ACTIVATION_CASES, ids="-".join)
def test_gradient_matches_finite_differences_of_evaluate(activations: tuple[str, str]) -> None:
    """The same check with the network's own float32 ``evaluate`` as the loss.

    A step of 1e-2 can move a relu unit across its kink, where a finite difference means
    nothing; such coordinates (found with the reference forward pass) are left out.
    """
    spec = tiny(activations)
    weights, x, labels = problem(spec, n=6, seed=4)
    grad, _, _ = analytic_gradient(spec, weights, x, labels, max_bunch=6)
    net = BunchNetwork(spec, max_bunch=6)
    eps = np.float32(1e-2)
    numeric = np.empty(weights.size)
    smooth = np.ones(weights.size, dtype=bool)
    for i in range(weights.size):
        plus, minus = weights.copy(), weights.copy()
        plus[i] += eps
        minus[i] -= eps
        lp, _ = net.evaluate(plus, x, labels)
        lm, _ = net.evaluate(minus, x, labels)
        numeric[i] = (lp - lm) / (float(plus[i]) - float(minus[i]))
        kinks_plus = reference_forward(spec, plus, x, labels)[2]
        kinks_minus = reference_forward(spec, minus, x, labels)[2]
        smooth[i] = all(np.array_equal(a, b) for a, b in zip(kinks_plus, kinks_minus, strict=True))
    assert smooth.mean() > 0.7
    scale = np.abs(numeric).max()
    np.testing.assert_allclose(grad[smooth], numeric[smooth], rtol=2e-2, atol=2e-3 * scale)


# Other depths; and every arithmetic path of the step: bunches smaller than the softmax
# layer multiply true activations, bunches of 128 and more compute its gradient transposed.
DEPTH_AND_PATH_CASES = [
    ((5, 3), (), 7),
    ((5, 4, 3), ("sigmoid",), 7),
    ((5, 4, 4, 4, 3), ("relu", "tanh", "sigmoid"), 7),
    *(((5, 4, 12), (kind,), 6) for kind in ("sigmoid", "tanh", "relu")),
    *(((5, 4, 3), (kind,), 130) for kind in ("sigmoid", "tanh", "relu")),
    *(((5, 6, 4, 3), (kind, kind), 130) for kind in ("sigmoid", "tanh", "relu")),
]


@pytest.mark.parametrize(("sizes", "activations", "n"), DEPTH_AND_PATH_CASES)
def test_gradient_other_depths_and_paths(
    sizes: tuple[int, ...], activations: tuple[str, ...], n: int
) -> None:
    spec = NetworkSpec(sizes, activations)
    weights, x, labels = problem(spec, n=n, seed=2)
    grad, loss, correct = analytic_gradient(spec, weights, x, labels, max_bunch=n)
    numeric = numeric_gradient(spec, weights, x, labels)
    np.testing.assert_allclose(grad, numeric, rtol=1e-3, atol=1e-4 * np.abs(numeric).max())
    ref_loss, predicted = reference_scores(spec, weights, x, labels)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert correct == int((predicted == labels).sum())


def test_gradient_returns_loss_and_correct_of_the_weights_before() -> None:
    spec = tiny(("tanh", "sigmoid"))
    weights, x, labels = problem(spec, n=32, seed=5)
    before = weights.copy()
    x_before = x.copy()
    _, loss, correct = analytic_gradient(spec, weights, x, labels, max_bunch=32)
    ref_loss, predicted = reference_scores(spec, weights, x, labels)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert correct == int((predicted == labels).sum())
    assert 0 < correct < 32
    np.testing.assert_array_equal(weights, before)  # inputs are not modified
    np.testing.assert_array_equal(x, x_before)


def test_gradient_is_a_sum_over_the_bunch() -> None:
    spec = tiny(("sigmoid", "tanh"))
    weights, x, labels = problem(spec, n=10, seed=6)
    whole, loss, correct = analytic_gradient(spec, weights, x, labels, max_bunch=10)
    first, loss1, correct1 = analytic_gradient(spec, weights, x[:4], labels[:4], max_bunch=10)
    second, loss2, correct2 = analytic_gradient(spec, weights, x[4:], labels[4:], max_bunch=10)
    np.testing.assert_allclose(whole, first + second, rtol=1e-5, atol=1e-6)
    assert loss == pytest.approx(loss1 + loss2, rel=1e-6)
    assert correct == correct1 + correct2


@pytest.mark.parametrize("activations", ACTIVATION_CASES, ids="-".join)
def test_bunch_smaller_than_max(activations: tuple[str, str]) -> None:
    spec = tiny(activations)
    weights, x, labels = problem(spec, n=16, seed=7)
    net = BunchNetwork(spec, max_bunch=16)
    full = np.empty(net.layout.size, dtype=np.float32)
    net.gradient(weights, x, labels, full)  # fill the work buffers with a full bunch first
    small = np.full(net.layout.size, np.nan, dtype=np.float32)
    loss, correct = net.gradient(weights, x[:5], labels[:5], small)
    exact, loss_exact, correct_exact = analytic_gradient(
        spec, weights, x[:5], labels[:5], max_bunch=5
    )
    np.testing.assert_allclose(small, exact, rtol=1e-6, atol=1e-7)
    assert loss == pytest.approx(loss_exact, rel=1e-7)
    assert correct == correct_exact
    assert not np.allclose(small, full)
    single = np.empty(net.layout.size, dtype=np.float32)
    net.gradient(weights, x[3:4], labels[3:4], single)
    exact1, _, _ = analytic_gradient(spec, weights, x[3:4], labels[3:4], max_bunch=1)
    np.testing.assert_allclose(single, exact1, rtol=1e-6, atol=1e-7)


def test_evaluate_equals_gradient_scores() -> None:
    # evaluate always scores with numpy's passes (client/network.py): the same forward
    # as their gradient's, to the bit
    spec = tiny(("relu", "tanh"))
    weights, x, labels = problem(spec, n=21, seed=8)
    net = BunchNetwork(spec, max_bunch=8, kernels="numpy")
    loss, correct = net.evaluate(weights, x, labels)
    out = np.empty(net.layout.size, dtype=np.float32)
    total_loss, total_correct = 0.0, 0
    for start in range(0, 21, 8):  # 8 + 8 + 5
        part_loss, part_correct = net.gradient(
            weights, x[start : start + 8], labels[start : start + 8], out
        )
        total_loss += part_loss
        total_correct += part_correct
    assert loss == pytest.approx(total_loss, rel=1e-12)
    assert correct == total_correct
    ref_loss, predicted = reference_scores(spec, weights, x, labels)
    assert loss == pytest.approx(ref_loss, rel=1e-5)
    assert correct == int((predicted == labels).sum())


def test_evaluate_scores_alike_whichever_step_trains() -> None:
    """A network on the compiled step scores with numpy's passes, bit for bit: CV figures
    agree across workers, `snet train` and `snet eval` whatever step each took."""
    pytest.importorskip("numba", reason="the compiled step needs numba (the fast extra)")
    spec = tiny(("sigmoid", "relu"))
    weights, x, labels = problem(spec, n=21, seed=9)
    compiled = BunchNetwork(spec, max_bunch=8, kernels="numba")
    assert compiled.kernels == "numba"
    numpy_passes = BunchNetwork(spec, max_bunch=8, kernels="numpy")
    assert compiled.evaluate(weights, x, labels) == numpy_passes.evaluate(weights, x, labels)


def test_evaluate_empty_set() -> None:
    spec = tiny(("tanh", "tanh"))
    weights, x, labels = problem(spec, n=3)
    assert BunchNetwork(spec, 4).evaluate(weights, x[:0], labels[:0]) == (0.0, 0)


def test_bigger_than_max_bunch_raises() -> None:
    spec = tiny(("sigmoid", "sigmoid"))
    weights, x, labels = problem(spec, n=9)
    net = BunchNetwork(spec, max_bunch=8)
    out = np.zeros(net.layout.size, dtype=np.float32)
    with pytest.raises(ValueError, match="larger"):
        net.gradient(weights, x, labels, out)
    assert not out.any()  # nothing was written


def test_saturated_units_stay_finite() -> None:
    spec = tiny(("sigmoid", "tanh"))
    weights, x, labels = problem(spec, n=4)
    weights *= 200.0  # pre-activations far beyond the +-40 clip and the softmax floor
    net = BunchNetwork(spec, max_bunch=4)
    out = np.empty(net.layout.size, dtype=np.float32)
    loss, _ = net.gradient(weights, x * 10, labels, out)
    assert np.isfinite(out).all()
    assert np.isfinite(loss)
    assert loss >= 0.0


def test_matches_torch_autograd() -> None:
    torch = pytest.importorskip("torch")
    spec = tiny(("tanh", "sigmoid"))
    weights, x, labels = problem(spec, n=8, seed=9)
    grad, loss, _ = analytic_gradient(spec, weights, x, labels, max_bunch=8)
    layout = ElementLayout.for_network(spec)
    flat = torch.tensor(weights.astype(np.float64), requires_grad=True)
    params = [
        flat[offset : offset + int(np.prod(shape))].reshape(shape)
        for offset, shape in zip(layout.offsets, layout.shapes, strict=True)
    ]
    h = torch.tensor(x.astype(np.float64))
    h = torch.tanh(h @ params[0] + params[1])
    h = torch.sigmoid(h @ params[2] + params[3])
    logits = h @ params[4] + params[5]
    ref = torch.nn.functional.cross_entropy(logits, torch.tensor(labels), reduction="sum")
    ref.backward()
    assert loss == pytest.approx(float(ref.detach()), rel=1e-5)
    np.testing.assert_allclose(grad, flat.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_layer_scales_of_a_sigmoid_network() -> None:
    """Sigmoid units store tanh(z/2): halved first-layer inputs, (1 + t)/2 folded into the
    softmax layer, and the 1/4 of the derivative times the 2 of the halved inputs."""
    from snet.client.layer_scales import LayerScales, layer_scales

    first, softmax = layer_scales(NetworkSpec.parse("351:1262:45"))
    assert first == LayerScales(pre=0.5, in_mul=1.0, in_add=0.0, back=1.0)
    assert softmax == LayerScales(pre=1.0, in_mul=0.5, in_add=0.5, back=0.5)
    tanh_first, tanh_softmax = layer_scales(NetworkSpec.parse("5:4:3", activation="tanh"))
    assert tanh_first.pre == 1.0 and tanh_softmax == LayerScales(1.0, 1.0, 0.0, 1.0)


def test_the_servers_score_has_the_workers_loss_where_the_network_is_sure() -> None:
    """The workers clip softmax exponents at -30 (a probability never underflows); the
    server's score did not, so where a frame's label was less likely than e^-30 the two
    losses parted (the server's 7185 against a worker's 6369 at epoch 1 of the default
    job) and --verify-cv refused honest workers' results (a probe). Same floor now."""
    from snet.client.network import BunchNetwork
    from snet.protocol.network import ElementLayout, NetworkSpec
    from snet.server.evaluations import CV_LOSS_TOLERANCE
    from snet.server.testset import score_patterns

    spec = NetworkSpec.parse("13:8:3")
    rng = np.random.default_rng(4)
    weights = (rng.standard_normal(ElementLayout.for_network(spec).size) * 40).astype(np.float32)
    x = rng.standard_normal((300, 13)).astype(np.float32)
    labels = rng.integers(0, 3, 300)
    loss, correct = BunchNetwork(spec, 64, kernels="numpy").evaluate(weights, x, labels)
    served_correct, served_loss = score_patterns(spec, weights, x, labels)
    assert loss > 300 * 5  # saturated: many frames' labels far below e^-30
    assert served_correct == correct
    assert abs(served_loss - loss) <= CV_LOSS_TOLERANCE * loss
