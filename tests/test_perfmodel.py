"""The performance models' formulas against worked values (`snet plan` and the modelled
backend: test_plan.py).

Every expected number here is worked out by hand in the comments (and, for the BSP table,
in docs/performance-model.md); nothing is timed.
"""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest

from bench.processes import best_rate
from snet.perf.bsp import (
    BspMachine,
    bsp_epoch_flops,
    bsp_epoch_seconds,
    bsp_exemplar_batch_cost,
    bsp_server_batch_cost,
)
from snet.perf.model import (
    DEFAULT_CONSTANTS,
    Constants,
    Phases,
    multispert_round_seconds,
    network_parallel_phases,
    overlapped_round_seconds,
    pattern_parallel_phases,
    per_pattern_coefficients,
    predict,
    serial_round_seconds,
    update_bytes,
)
from snet.perf.plan import smallest_block
from snet.protocol.errors import ConfigError
from snet.protocol.network import NetworkSpec

from hand_constants import HAND, TINY

# ------------------------------------------------------------------ BSP (Rogers & Skillicorn)


def test_bsp_exemplar_parallel_costs_match_the_worked_example() -> None:
    # W = 1000 weights, 25 exemplars per processor, p = 4, 6 flops per weight and exemplar.
    total = bsp_exemplar_batch_cost(1000, 25, 4)
    assert (total.w, total.h, total.supersteps) == (155_000, 3_000, 1)  # 1000*(150+3+2)
    server = bsp_server_batch_cost(1000, 25, 4)
    assert (server.w, server.h, server.supersteps) == (155_000, 8_000, 2)  # h = 2*4*1000
    machine = BspMachine("example", s=1e9, g=10.0, l=1000.0)
    assert total.flops(machine) == 186_000  # 155,000 + 3,000*10 + 1,000
    assert server.flops(machine) == 237_000  # 155,000 + 8,000*10 + 2*1,000
    # An epoch of 10,000 exemplars is 100 batches of 4 x 25.
    assert bsp_epoch_flops(total, machine, 10_000, 25, 4) == 18_600_000
    assert bsp_epoch_flops(server, machine, 10_000, 25, 4) == 23_700_000
    # One processor: no exchange, 400 batches of 152,000 + 1,000 flops.
    alone = bsp_exemplar_batch_cost(1000, 25, 1)
    assert bsp_epoch_flops(alone, machine, 10_000, 25, 1) == 61_200_000


WORKSTATIONS = BspMachine("workstations", s=20e6, g=400.0, l=100_000.0)
POWER_CHALLENGE = BspMachine("power challenge", s=75e6, g=10.0, l=1_000.0)
T3E = BspMachine("t3e", s=45e6, g=2.0, l=300.0)


@pytest.mark.parametrize(
    ("machine", "p", "exchange", "expected"),
    [  # the per-epoch table of docs/performance-model.md (351:1262:45, b = 100, E = 1e6)
        # p = 1: 10,000 batches of 501,059 * 602 flops + l = 301,737,518 flops; / 20e6
        (WORKSTATIONS, 1, "total", 150_868.8),
        (WORKSTATIONS, 8, "total", 106_763.1),
        (WORKSTATIONS, 8, "server", 219_507.7),
        # p = 8: 1,250 batches of 501,059 * 609 + 7 * 501,059 * 10 + 1,000 flops; / 75e6
        (POWER_CHALLENGE, 8, "total", 5_670.3),
        (POWER_CHALLENGE, 8, "server", 6_421.9),
        (T3E, 1, "total", 67_030.6),
        (T3E, 8, "total", 8_671.1),
    ],
)
def test_bsp_epoch_seconds_table(
    machine: BspMachine, p: int, exchange: str, expected: float
) -> None:
    weights = NetworkSpec.parse("351:1262:45").connections
    assert weights == 501_059
    seconds = bsp_epoch_seconds(weights, 1_000_000, 100, p, machine, exchange)
    assert seconds == pytest.approx(expected, abs=0.05)


# ------------------------------------------------------------------ Quicknet on MultiSpert


def test_multispert_rule_in_both_regimes() -> None:
    # (P-1) T_d + T_h = 3*1 + 0.5 < T_c = 10: compute-bound, T_d + T_c.
    assert multispert_round_seconds(t_d=1.0, t_h=0.5, t_c=10.0, workers=4) == 11.0
    # 19*1 + 0.5 >= 10: the host's link is the bottleneck, P * T_d.
    assert multispert_round_seconds(t_d=1.0, t_h=0.5, t_c=10.0, workers=20) == 20.0


@pytest.mark.parametrize(
    ("workers", "paper", "snet"),
    # T_c = 10, T_d = 1, T_h = 0.5, L = 3. The paper: T_d + T_c = 11 while (P-1) + 0.5 < 10,
    # else P. snet: max(10 + 3/2, P + 0.5): a worker waits only for sending its update.
    [(1, 11.0, 11.5), (9, 11.0, 11.5), (11, 11.0, 11.5), (12, 12.0, 12.5), (20, 20.0, 20.5)],
)
def test_snet_overlap_against_the_multispert_rule(workers: int, paper: float, snet: float) -> None:
    assert multispert_round_seconds(t_d=1.0, t_h=0.5, t_c=10.0, workers=workers) == paper
    phases = Phases(compute=10.0, transfer=1.0, host=0.5, latency=3.0, patterns=1)
    assert overlapped_round_seconds(phases, workers) == snet


@pytest.mark.parametrize(("workers", "expected"), [(1, 14.5), (4, 17.5), (40, 53.5)])
def test_sync_rounds_queue_every_transfer(workers: int, expected: float) -> None:
    # T_c = 10, T_d = 1, T_h = 0.5, L = 3: compute, the worker's end, P transfers, the
    # step, one after the other: 13.5 + P.
    phases = Phases(compute=10.0, transfer=1.0, host=0.5, latency=3.0, patterns=1)
    assert serial_round_seconds(phases, workers) == expected


def test_per_pattern_cost_is_c1_nh_plus_c2() -> None:
    c1, c2 = per_pattern_coefficients(NetworkSpec.parse("351:1262:45"), 1.0)
    assert (c1, c2) == (351 + 45 + 1, 45)  # c1 = (I + O + 1) t, c2 = O t
    c1, c2 = per_pattern_coefficients(TINY, 2.0)
    assert c1 * 3 + c2 == 13 * 2.0  # every connection once
    deep = NetworkSpec.parse("10:4:6:2")  # 44 + 30 + 14 = 88 connections
    c1, c2 = per_pattern_coefficients(deep, 1.0)
    assert c1 * 10 + c2 == pytest.approx(88)


def test_pattern_parallel_phases_worked_by_hand() -> None:
    phases = pattern_parallel_phases(TINY, bunch=10, workers=2, constants=HAND)
    assert phases.compute == pytest.approx(10 * 13e-6)  # bunch x 13 connections x 1 us
    assert phases.transfer == pytest.approx(2 * (52e-9 + 1e-4))  # 52 bytes each way
    assert phases.latency == pytest.approx(2 * (104e-9 + 5e-5))  # the worker's end
    assert phases.host == pytest.approx(52 * (2 * 1e-10 + 2e-10) + 3e-6)  # 2 updates, a step
    assert phases.patterns == 20
    sync = predict(TINY, 10, 2, HAND, "pattern", "sync")
    # 130 us compute + 100.208 us latency + 2 x 200.104 us + the step: the transfers,
    # not the 130 us of compute, are most of the round
    assert sync.round_seconds == pytest.approx(1.3e-4 + 1.00208e-4 + 2 * 2.00104e-4 + 3.0208e-6)
    assert sync.mcups == pytest.approx(13 * 20 / sync.round_seconds / 1e6)
    assert sync.speedup == pytest.approx(sync.mcups / 1.0)  # one worker alone: 1 MCUPS
    assert sync.bound == "link"
    assert predict(TINY, 10, 1, HAND, "pattern", "sync").bound == "link"  # even alone
    assert predict(TINY, 100, 2, HAND, "pattern", "sync").bound == "compute"  # 1.3 of 1.7 ms
    crowded = predict(TINY, 10, 6, HAND, "pattern", "sync")
    assert crowded.bound == "link"
    assert crowded.round_seconds == pytest.approx(
        1.3e-4 + 1.00208e-4 + 6 * 2.00104e-4 + 52 * 8e-10 + 3e-6
    )
    overlapped = predict(TINY, 10, 2, HAND, "pattern", "async")
    assert overlapped.round_seconds == pytest.approx(2 * 2.00104e-4 + 3.0208e-6)  # link-bound


def test_network_parallel_phases_worked_by_hand() -> None:
    phases = network_parallel_phases(TINY, bunch=10, workers=3, constants=HAND)
    # one bunch of 10 patterns through every worker, each 1 of the 3 hidden units:
    # c1 = 4 us (I+O+1), c2 = 1 us.
    assert phases.compute == pytest.approx(10 * (4e-6 * 1 + 1e-6))
    assert phases.patterns == 10
    # partial output sums up (10 patterns x 1 output x 4 bytes), output errors and the
    # frame indices (8 bytes each) down: 40 + 120 bytes, two messages
    assert phases.transfer == pytest.approx(160e-9 + 2 * 1e-4)
    assert phases.latency == pytest.approx(320e-9 + 2 * 5e-5)
    assert phases.host == pytest.approx(40 * 3 * 1e-10 + 3e-6)  # adding the sums, a step


def test_network_parallel_phases_with_np_constants_worked_by_hand() -> None:
    # np's own constants (bench/np_calibrate.py) replace the pattern-parallel message costs.
    measured = replace(HAND, np_worker_seconds=2e-4, np_bunch_seconds=1e-4,
                       np_bunch_seconds_per_byte=1e-8, np_latency_seconds=3e-4,
                       np_latency_seconds_per_byte=2e-8, np_pattern_seconds=5e-7)  # fmt: skip
    phases = network_parallel_phases(TINY, bunch=10, workers=3, constants=measured)
    # every worker pays 0.5 us a pattern beyond its unit's connection updates
    assert phases.compute == pytest.approx(10 * (4e-6 * 1 + 1e-6 + 5e-7))
    # the 160 bytes of the pair of messages at the link's and the worker's rates
    assert phases.transfer == pytest.approx(2e-4 + 160e-9)
    assert phases.latency == pytest.approx(3e-4 + 320e-9 + 52 * 2e-8)  # + 13 x 4 bytes
    assert phases.host == pytest.approx(1e-4 + 52 * 1e-8)
    older = {k: v for k, v in measured.to_dict().items() if not k.startswith("np_")}
    assert Constants.from_dict(older, "old.json").np_worker_seconds == 0.0  # the old costs


def test_a_bmuf_round_is_a_block_of_compute_and_one_exchange() -> None:
    # TINY, bunch 10, 2 workers, blocks of 4 bunches: 4 x 130 us of compute, then the
    # same transfers and step as one per-bunch round (worked above), for 2 x 40 patterns.
    phases = pattern_parallel_phases(TINY, 10, 2, HAND, block_bunches=4)
    assert phases.compute == pytest.approx(4 * 130e-6)
    assert phases.transfer == pytest.approx(2 * (52e-9 + 1e-4))
    assert phases.patterns == 80
    block = predict(TINY, 10, 2, HAND, "pattern", "bmuf", block_bunches=4)
    assert block.round_seconds == pytest.approx(5.2e-4 + 1.00208e-4 + 2 * 2.00104e-4 + 3.0208e-6)
    assert block.speedup == pytest.approx(13 * 80 / block.round_seconds / 1e6)
    assert block.bound == "compute"  # 520 us of 1023 us
    # one bunch a block is per-bunch exchange, in either mode
    for blocks, bunches in (("bmuf", "sync"), ("bmuf-async", "async")):
        one = predict(TINY, 10, 2, HAND, "pattern", blocks, block_bunches=1)
        assert one.round_seconds == predict(TINY, 10, 2, HAND, "pattern", bunches).round_seconds
    # async blocks overlap the exchange: max(520 us + L/2, 2 T_d + T_h), compute-bound
    loose = predict(TINY, 10, 2, HAND, "pattern", "bmuf-async", block_bunches=4)
    assert loose.round_seconds == pytest.approx(5.2e-4 + 1.00208e-4 / 2)
    # so do sync blocks whose workers train the next block meanwhile (block_overlap)...
    ahead = predict(TINY, 10, 2, HAND, "pattern", "bmuf-overlap", block_bunches=4)
    assert ahead.round_seconds == loose.round_seconds < block.round_seconds
    assert ahead.bound == "compute"
    # ...while the whole exchange, L + 2 T_d + T_h = 503.6 us, fits in a block; with
    # blocks of one bunch (130 us) it does not, and they wait for it (async blocks do not)
    short = predict(TINY, 10, 2, HAND, "pattern", "bmuf-overlap", block_bunches=1)
    assert short.round_seconds == pytest.approx(1.00208e-4 + 2 * 2.00104e-4 + 3.0208e-6)
    assert short.bound == "link"
    assert predict(TINY, 10, 2, HAND, "pattern", "bmuf-async", block_bunches=1).round_seconds == (
        pytest.approx(2 * 2.00104e-4 + 3.0208e-6)
    )


def test_compressed_updates_shrink_only_the_way_to_the_server() -> None:
    # TINY's segments hold 6, 3, 3 and 1 values: int8 sends them as bytes plus one
    # float32 scale per segment (a block of 256 values or fewer), fp16 as 2 bytes each.
    assert update_bytes(TINY) == 52
    assert update_bytes(TINY, "int8") == 13 + 4 * 4
    assert update_bytes(TINY, "fp16") == 26
    phases = predict(TINY, 10, 2, HAND, "pattern", "bmuf", codec="int8").phases
    assert phases.transfer == pytest.approx((29 + 52) * 1e-9 + 2e-4)  # the weights come back whole
    assert phases.latency == pytest.approx((29 + 52) * 2e-9 + 1e-4)
    with pytest.raises(ConfigError, match="fixed size"):
        update_bytes(TINY, "topk:0.01")


def test_smallest_block_for_ninety_percent_of_linear() -> None:
    # Sync blocks on TINY with 2 workers: speed-up 2 x 130 tau / (130 tau + 503.436) (us)
    # reaches 1.8 when 26 tau >= 1.8 x 503.436 = 906.2, at tau = 35.
    assert smallest_block(TINY, 10, 2, HAND, "bmuf") == 35
    assert predict(TINY, 10, 2, HAND, "pattern", "bmuf", block_bunches=34).speedup < 1.8
    # async blocks: 2 x 130 tau / max(130 tau + 50.104, 403.2) >= 1.8 needs both
    # 26 tau >= 90.2 and 260 tau >= 725.8: tau = 4 (at 3, 780 / 440.1 = 1.77)
    assert smallest_block(TINY, 10, 2, HAND, "bmuf-async") == 4
    assert smallest_block(TINY, 10, 2, HAND, "bmuf", limit=8) is None
    with pytest.raises(ConfigError, match="block modes"):
        smallest_block(TINY, 10, 2, HAND, "sync")


def test_snets_figure_4_setting_pays_only_with_blocks() -> None:
    # 39:500:42, bunch 1000, gigabit: per-bunch exchange is link-bound below one worker's
    # rate, as issue 15 says; blocks of 16 bunches are compute-bound and grow with P.
    network, gigabit = NetworkSpec.parse("39:500:42"), DEFAULT_CONSTANTS.with_link_mbps(1000)
    per_bunch = [predict(network, 1000, 5, gigabit, "pattern", m) for m in ("sync", "async")]
    assert all(p.speedup < 1 and p.bound == "link" for p in per_bunch)
    blocks = [predict(network, 1000, p, gigabit, "pattern", "bmuf-async") for p in (1, 3, 5)]
    assert all(b.bound == "compute" for b in blocks)
    assert blocks[0].speedup < blocks[1].speedup < blocks[2].speedup
    assert blocks[2].speedup > 4 * max(p.speedup for p in per_bunch)


def test_more_workers_never_lower_the_round_time_of_a_link_bound_model() -> None:
    network = NetworkSpec.parse("351:1262:45")
    slow_link = DEFAULT_CONSTANTS.with_link_mbps(100)
    rounds = [predict(network, 1000, p, slow_link, "pattern", "async") for p in (1, 2, 4, 8)]
    assert all(a.round_seconds <= b.round_seconds for a, b in itertools.pairwise(rounds))
    assert rounds[-1].bound == "link"
    fast = predict(network, 1000, 2, DEFAULT_CONSTANTS, "pattern", "async")
    assert fast.bound == "compute" and fast.speedup == pytest.approx(2, rel=0.05)


def test_bad_model_inputs_are_clear_errors() -> None:
    with pytest.raises(ConfigError, match="strategy must be one of"):
        predict(TINY, 10, 2, HAND, "layer", "sync")
    with pytest.raises(ConfigError, match="mode must be one of"):
        predict(TINY, 10, 2, HAND, "pattern", "eventual")
    with pytest.raises(ConfigError, match="pattern-parallel only"):
        predict(TINY, 10, 2, HAND, "network", "bmuf")
    with pytest.raises(ConfigError, match="block bunches must be >= 1"):
        predict(TINY, 10, 2, HAND, "pattern", "bmuf", block_bunches=0)
    with pytest.raises(ConfigError, match="constants lack pattern_seconds, link_seconds_per_byte"):
        Constants.from_dict({"cu_seconds": 1e-9}, "x.json")
    older = {k: v for k, v in HAND.to_dict().items() if k != "step_fixed_seconds"}
    assert Constants.from_dict(older, "old.json").step_fixed_seconds == 0.0  # written before it
    with pytest.raises(ConfigError, match="link speed must be > 0"):
        HAND.with_link_mbps(0)
    gigabit = HAND.with_link_mbps(1000)
    assert gigabit.link_seconds_per_byte == gigabit.worker_seconds_per_byte == pytest.approx(8e-9)


def test_best_rate_uses_windows_between_changes() -> None:
    # 100 patterns a second, but the last second stalled (a noisy neighbour).
    samples = [(0.0, 0), (1.0, 100), (2.0, 200), (3.0, 300), (4.0, 310)]
    best, mean = best_rate(samples, min_span=2.0)
    assert best == pytest.approx(100.0) and mean == pytest.approx(77.5)
