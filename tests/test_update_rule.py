"""The server's update rule: the formula, snapshots, and fused steps equal to single ones."""

from __future__ import annotations

import numpy as np
import pytest

from snet.server.update_rule import BLOCK, UpdateRule


def test_update_rule_step_follows_the_formula() -> None:
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal(50).astype(np.float32)
    rule = UpdateRule(w0, momentum=0.9)
    g1 = [rng.standard_normal(50).astype(np.float32) for _ in range(3)]
    g2 = [rng.standard_normal(50).astype(np.float32) for _ in range(2)]
    g1_before = [g.copy() for g in g1]

    snap1 = rule.step(g1, patterns=48, learning_rate=0.2)
    w = w0.astype(np.float64)
    v = -0.2 * np.sum(g1, axis=0, dtype=np.float64) / 48
    w = w + v
    np.testing.assert_allclose(snap1, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rule.velocity, v, rtol=1e-5, atol=1e-7)
    for g, before in zip(g1, g1_before, strict=True):
        np.testing.assert_array_equal(g, before)  # the gradients are not modified

    snap2 = rule.step(g2, patterns=32, learning_rate=0.1)
    v = 0.9 * v - 0.1 * np.sum(g2, axis=0, dtype=np.float64) / 32
    w = w + v
    np.testing.assert_allclose(snap2, w, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(rule.weights, w, rtol=1e-5, atol=1e-6)
    # the first snapshot is a copy: later steps do not change it
    np.testing.assert_allclose(snap1, w0 - 0.2 * np.sum(g1, axis=0) / 48, rtol=1e-5, atol=1e-6)


def test_sync_step_equals_one_sequential_bunch() -> None:
    """N workers' summed gradients over b patterns each = one step on N*b patterns."""
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal(20).astype(np.float32)
    per_worker = [rng.standard_normal(20).astype(np.float32) for _ in range(4)]
    split = UpdateRule(w0, 0.5).step(per_worker, patterns=64, learning_rate=0.3)
    whole = UpdateRule(w0, 0.5).step([np.sum(per_worker, axis=0)], 64, 0.3)
    np.testing.assert_allclose(split, whole, rtol=1e-6, atol=1e-7)


def test_update_rule_snapshots_are_read_only_copies() -> None:
    w0 = np.ones(8, dtype=np.float32)
    rule = UpdateRule(w0, momentum=0.0)
    assert not rule.snapshot.flags.writeable
    np.testing.assert_array_equal(rule.snapshot, w0)
    assert not np.shares_memory(rule.weights, w0)  # the caller's array is not adopted
    snap = rule.step([np.ones(8, dtype=np.float32)], patterns=2, learning_rate=1.0)
    assert not snap.flags.writeable
    with pytest.raises(ValueError):
        snap[0] = 5.0
    assert snap is rule.weights  # the new weights are the snapshot: no extra copy
    np.testing.assert_allclose(snap, 0.5)
    rule.step([np.ones(8, dtype=np.float32)], patterns=2, learning_rate=1.0)
    np.testing.assert_allclose(snap, 0.5)  # unchanged by the next step
    np.testing.assert_allclose(rule.weights, 0.0)
    np.testing.assert_array_equal(w0, 1.0)
    assert snap.dtype == np.float32


def test_update_rule_refuses_non_finite_sums_and_changes_nothing() -> None:
    rule = UpdateRule(np.ones(4, dtype=np.float32), momentum=0.9)
    rule.step([np.ones(4, dtype=np.float32)], patterns=1, learning_rate=0.1)
    weights, velocity = rule.weights.copy(), rule.velocity.copy()
    poisoned = np.ones(4, dtype=np.float32)
    poisoned[2] = np.nan
    assert rule.step([np.ones(4, dtype=np.float32), poisoned], 2, 0.1) is None
    huge = np.full(4, 3e38, dtype=np.float32)
    assert rule.step([huge, huge], 2, 0.1) is None  # each finite, the sum overflows
    np.testing.assert_array_equal(rule.weights, weights)
    np.testing.assert_array_equal(rule.velocity, velocity)


def test_update_rule_refuses_empty_steps() -> None:
    rule = UpdateRule(np.zeros(4, dtype=np.float32), momentum=0.9)
    with pytest.raises(ValueError, match="at least one gradient"):
        rule.step([], patterns=4, learning_rate=0.1)
    with pytest.raises(ValueError, match="at least one pattern"):
        rule.step([np.ones(4, dtype=np.float32)], patterns=0, learning_rate=0.1)
    np.testing.assert_array_equal(rule.weights, 0.0)


def test_update_rule_load_resets_momentum() -> None:
    rule = UpdateRule(np.zeros(4, dtype=np.float32), momentum=0.9)
    rule.step([np.ones(4, dtype=np.float32)], patterns=1, learning_rate=1.0)
    assert rule.velocity.any()
    rule.load(np.full(4, 2.0, dtype=np.float32))
    assert not rule.velocity.any()
    np.testing.assert_array_equal(rule.snapshot, 2.0)
    assert not rule.snapshot.flags.writeable
    snap = rule.step([np.ones(4, dtype=np.float32)], patterns=1, learning_rate=1.0)
    np.testing.assert_allclose(snap, 1.0)  # no momentum carried over from before load


def _random_steps(
    rng: np.random.Generator, size: int, counts: list[int]
) -> tuple[list[list[np.ndarray]], list[int]]:
    groups = [[rng.standard_normal(size).astype(np.float32) for _ in range(n)] for n in counts]
    patterns = [int(rng.integers(1, 100)) for _ in counts]
    return groups, patterns


@pytest.mark.parametrize("lanes", [1, 2, 3])
def test_fused_steps_equal_the_same_steps_one_by_one(lanes: int) -> None:
    """Bit for bit, over several cache blocks and a ragged last one, in one thread or
    split across several."""
    rng = np.random.default_rng(2)
    size = 6 * BLOCK + 12_345
    w0 = rng.standard_normal(size).astype(np.float32)
    groups, patterns = _random_steps(rng, size, [1, 3, 2, 1, 4])
    one_by_one, fused = UpdateRule(w0, 0.9, lanes=1), UpdateRule(w0, 0.9, lanes=lanes)
    assert fused.lanes == lanes
    for group, count in zip(groups, patterns, strict=True):
        one_by_one.step(group, count, 0.05)
    result = fused.steps(groups, patterns, 0.05)
    assert result is fused.weights and not result.flags.writeable
    np.testing.assert_array_equal(result, one_by_one.weights)
    np.testing.assert_array_equal(fused.velocity, one_by_one.velocity)
    # and the momentum carries on identically afterwards
    more, count = _random_steps(rng, size, [2])
    np.testing.assert_array_equal(
        fused.step(more[0], count[0], 0.05), one_by_one.step(more[0], count[0], 0.05)
    )


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("lanes", [1, 2])
def test_a_non_finite_gradient_anywhere_changes_nothing(bad: float, lanes: int) -> None:
    rng = np.random.default_rng(3)
    size = 4 * BLOCK + 777
    rule = UpdateRule(rng.standard_normal(size).astype(np.float32), 0.9, lanes=lanes)
    assert rule.lanes == lanes
    rule.step([rng.standard_normal(size).astype(np.float32)], 10, 0.1)  # non-zero velocity
    weights, velocity = rule.weights.copy(), rule.velocity.copy()
    groups, patterns = _random_steps(rng, size, [2, 1, 3])
    groups[2][1][size - 5] = bad  # last group, last block: found only at the very end
    assert rule.steps(groups, patterns, 0.1) is None
    np.testing.assert_array_equal(rule.weights, weights)
    np.testing.assert_array_equal(rule.velocity, velocity)
    # the rule still works, and as if the refused steps had never been tried
    reference = UpdateRule(weights, 0.9, lanes=1)
    reference.velocity[...] = velocity
    good, count = _random_steps(rng, size, [1])
    np.testing.assert_array_equal(rule.step(good[0], count[0], 0.1),
                                  reference.step(good[0], count[0], 0.1))  # fmt: skip


def test_small_networks_are_stepped_in_one_lane() -> None:
    assert UpdateRule(np.zeros(BLOCK, dtype=np.float32), 0.9, lanes=4).lanes == 1
    assert UpdateRule(np.zeros(8 * BLOCK, dtype=np.float32), 0.9, lanes=4).lanes == 4


@pytest.mark.parametrize(
    ("size", "block"),
    [
        (65_546, 65_546),
        (BLOCK, BLOCK),
        (2 * BLOCK + 10, BLOCK + 5),
        (9 * BLOCK, BLOCK),
        (2 * BLOCK + BLOCK // 2, (5 * BLOCK // 2 + 2) // 3),
        (7, 7),
        (0, 1),
    ],
)
def test_a_network_just_over_whole_blocks_takes_no_block_of_its_own(size: int, block: int) -> None:
    """The default job's 117:512:10 (65,546 values) in one pass, not a second for 10."""
    assert UpdateRule(np.zeros(size, dtype=np.float32), 0.9).block == block


def test_load_replaces_weights_and_refuses_another_shape() -> None:
    rule = UpdateRule(np.zeros(6, dtype=np.float32), 0.9)
    rule.step([np.ones(6, dtype=np.float32)], 1, 0.5)
    rule.load(np.full(6, 2.0))
    np.testing.assert_array_equal(rule.snapshot, 2.0)
    np.testing.assert_array_equal(rule.velocity, 0.0)
    with pytest.raises(ValueError, match="shape"):
        rule.load(np.zeros(7, dtype=np.float32))
    np.testing.assert_array_equal(rule.weights, 2.0)  # unchanged by the refusal


def test_steps_refuses_inconsistent_arguments() -> None:
    rule = UpdateRule(np.zeros(4, dtype=np.float32), 0.0)
    g = np.ones(4, dtype=np.float32)
    with pytest.raises(ValueError):
        rule.steps([[g]], [1, 2], 0.1)
    with pytest.raises(ValueError):
        rule.steps([[g], []], [1, 1], 0.1)
    with pytest.raises(ValueError):
        rule.steps([[g]], [0], 0.1)


def test_direct_updates_bypass_the_velocity() -> None:
    """Momentum-corrected updates: w = w + v - lr g_direct / patterns, v untouched by them;
    fused with other steps they still give the one-by-one result."""
    rng = np.random.default_rng(4)
    size = 4 * BLOCK + 3
    w0 = rng.standard_normal(size).astype(np.float32)
    rule = UpdateRule(w0, 0.5, lanes=2)
    g = rng.standard_normal(size).astype(np.float32)
    d = rng.standard_normal(size).astype(np.float32)
    result = rule.step([g], 10, 0.2, direct=[d])
    v = -0.2 * g.astype(np.float64) / 10
    np.testing.assert_allclose(rule.velocity, v, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(result, w0 + v - 0.2 * d / 10, rtol=1e-5, atol=1e-6)
    only_direct = rule.step([], 5, 0.2, direct=[d])  # the velocity still decays
    np.testing.assert_allclose(rule.velocity, 0.5 * v, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(only_direct, result + 0.5 * v - 0.2 * d / 5, rtol=1e-5, atol=1e-6)
    groups, patterns = _random_steps(rng, size, [1, 0, 2])
    bypass = [[d], [d, g], []]
    one_by_one, fused = UpdateRule(w0, 0.9, lanes=1), UpdateRule(w0, 0.9, lanes=2)
    for group, extra, count in zip(groups, bypass, patterns, strict=True):
        one_by_one.step(group, count, 0.05, direct=extra)
    np.testing.assert_array_equal(fused.steps(groups, patterns, 0.05, bypass), one_by_one.weights)
    np.testing.assert_array_equal(fused.velocity, one_by_one.velocity)
    with pytest.raises(ValueError):
        rule.step([], 5, 0.2)
