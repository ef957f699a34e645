"""Staleness policies on their own: parsing, the bound, the gradient rules (hand-computed),
the worker's wait, lease sizes and idle workers, the control endpoint's loopback rule.
Through real servers: tests/test_staleness_server.py."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from snet.client.policies import AsyncCompute, ComputeState, follow_change, make_compute_policy
from snet.protocol.codecs.handshake import agree_codecs
from snet.protocol.errors import ConfigError, MalformedFrame
from snet.protocol.job import JobSpec
from snet.protocol.messages import FOLLOWS_POLICY, PolicyChange
from snet.protocol.modes import MODE_SETTINGS, kind
from snet.protocol.staleness import StalenessSetting
from snet.server.compensation import (
    StepSizes,
    WeightHistory,
    delay_compensated,
    gap_penalised,
    staleness_scaled,
)
from snet.server.http import make_app
from snet.server.idleness import IdleWatch
from snet.server.leases import LEASES_PER_WORKER, TAIL_ROUNDS, LeaseBook, lease_size
from snet.server.policies import make_step_policy
from snet.server.session import WorkerSession
from snet.server.staleness import StalenessControl
from snet.server.staleness_report import staleness_metrics

from wire_samples import decode_one, hand_frame

# where a policy applies, as the job's rule says it (protocol/modes.py)
NOTHING_STALE = (
    r"applies to async mode and bmuf mode with asynchronous blocks \(block_sync false\) only,"
)
# as the command line says it: every setting named by its flag, given or not
NOTHING_STALE_FLAGS = NOTHING_STALE.replace("block_sync", "--block-sync")


def test_policies_parse_to_canonical_text_and_bad_ones_are_refused() -> None:
    assert StalenessSetting.parse("none").describe() == "none"
    assert StalenessSetting.parse(" Bounded:3 ") == StalenessSetting("bounded", bound=3)
    assert StalenessSetting.parse("dcasgd").dc_lambda == pytest.approx(0.04)
    assert StalenessSetting.parse("dcasgd:0.5").describe() == "dcasgd:0.5"
    assert StalenessSetting.parse("gap").needs_base_weights
    assert not StalenessSetting.parse("rate").needs_base_weights
    assert not StalenessSetting.parse("none").changes_gradients
    for bad in ("fast", "bounded", "bounded:x", "bounded:-1", "rate:2", "dcasgd:x", "gap:1",
                # int() and float() took these: bounded:1_0 ran as bounded:10 (a probe)
                "bounded:1_0", "bounded:\u0663", "bounded:", "dcasgd:1_0", "dcasgd:nan",
                "dcasgd:", "rate:", "none:"):  # fmt: skip
        with pytest.raises(ConfigError):
            StalenessSetting.parse(bad)
    assert JobSpec(staleness="BOUNDED:2").staleness == "bounded:2"
    with pytest.raises(ConfigError, match="staleness policy must be one of"):
        JobSpec(staleness="ssp")


def test_bounded_staleness_refuses_what_would_lag_more_than_the_bound() -> None:
    control = StalenessControl(JobSpec(mode="async", staleness="bounded:1"))
    bases = [5, 3, 4, 4, 2]
    # version 5: step 0 is taken on 5, step 1 on 6
    refused = control.over_bound([[0, 1], [2, 3, 4]], bases, version=5)
    assert refused == {1: 2, 3: 2, 2: 2, 4: 4}
    # a step whose every update is refused takes no version: the next is still on 5
    assert control.over_bound([[0], [1]], [2, 4], version=5) == {0: 3}
    assert StalenessControl(JobSpec(mode="async")).over_bound([[0]], [0], version=99) == {}


def test_a_policy_change_is_recorded_and_sync_accepts_only_none() -> None:
    control = StalenessControl(JobSpec(mode="async"))
    record = control.change("dcasgd:0.1", version=7, epoch=1, by="127.0.0.1", workers=())
    assert (record["from"], record["to"], record["version"], record["epoch"]) == (
        "none", "dcasgd:0.1", 7, 1,
    )  # fmt: skip
    assert control.figures()["policy"] == "dcasgd:0.1"
    assert control.figures()["changes"] == [record]
    with pytest.raises(ConfigError):
        control.change("nonsense", 8, 1, "x", ())
    assert control.name == "dcasgd:0.1"  # a refused change changes nothing
    # the job's own rule (protocol/modes.py), as at start-up: said, and nothing changed
    sync = StalenessControl(JobSpec(mode="sync"))
    with pytest.raises(
        ConfigError, match=f"^staleness rate {NOTHING_STALE} and this job is in sync mode, "
    ):
        sync.change("rate", 0, 0, "x", ())
    assert (sync.name, sync.changes) == ("none", [])
    blocks = StalenessControl(JobSpec(mode="bmuf"))
    with pytest.raises(ConfigError, match="this job is in bmuf mode with synchronous blocks"):
        blocks.change("gap", 0, 0, "x", ())
    StalenessControl(JobSpec(mode="bmuf", block_sync=False)).change("gap", 0, 0, "x", ())


def test_only_modes_that_apply_stale_updates_take_a_staleness_policy() -> None:
    # sync rounds and sync bmuf blocks apply every update on its own version; np sends
    # none: a policy there would have nothing to act on
    def stale(**fields: object) -> bool:
        return make_step_policy(JobSpec(**fields)).stale_updates  # type: ignore[arg-type]

    assert stale(mode="async") and stale(mode="bmuf", block_sync=False)
    assert not stale(mode="sync") and not stale(mode="bmuf", block_sync=True)
    assert not stale(mode="np")
    # the job's rule (protocol/modes.py), which refuses a policy elsewhere, says the same
    jobs = [("async", True), ("bmuf", False), ("sync", True), ("bmuf", True), ("np", True)]
    for mode, block_sync in jobs:
        applies = kind(mode, block_sync) in MODE_SETTINGS["staleness"]
        assert applies == stale(mode=mode, block_sync=block_sync), (mode, block_sync)


def test_a_policy_change_is_sent_to_the_workers_that_follow_changes() -> None:
    control = StalenessControl(JobSpec(mode="async"))
    inboxes: dict[str, list[object]] = {"new": [], "old": [], "other": []}
    workers = [
        SimpleNamespace(capabilities=("codec:fp16", FOLLOWS_POLICY), send=inboxes["new"].append),
        SimpleNamespace(capabilities=("codec:fp16",), send=inboxes["old"].append),  # older peer
        SimpleNamespace(capabilities=(FOLLOWS_POLICY,), send=inboxes["other"].append),
    ]
    record = control.change("bounded:3", 12, 2, "127.0.0.1", workers)  # type: ignore[arg-type]
    assert (record["workers_told"], record["workers_not_told"]) == (2, 1)
    assert inboxes == {"new": [PolicyChange(12, "bounded:3")], "old": [],
                       "other": [PolicyChange(12, "bounded:3")]}  # fmt: skip
    with pytest.raises(ConfigError):  # a refused change tells nobody anything
        control.change("bounded:x", 13, 2, "127.0.0.1", workers)  # type: ignore[arg-type]
    assert len(inboxes["new"]) == 1
    # a server that knows nothing of it agrees the codecs as if it was not asked
    plain = ("codec:fp16", "compress:fp16")
    assert agree_codecs((*plain, FOLLOWS_POLICY), "none") == agree_codecs(plain, "none")
    # a worker joining now is welcomed with the policy in force
    job = JobSpec(mode="async", staleness="none")
    assert control.job_in_force(job)["staleness"] == "bounded:3"
    assert JobSpec.from_dict(control.job_in_force(job)).max_in_flight == job.max_in_flight


def test_a_policy_message_is_checked_when_decoded() -> None:
    message = decode_one(hand_frame("policy", {"version": 3, "staleness": "bounded:2"}))
    assert message == PolicyChange(3, "bounded:2")
    for bad in ("ssp", "bounded:-1", "bounded:" + "1" * 40, ""):
        with pytest.raises(MalformedFrame, match=r"policy\.staleness"):
            decode_one(hand_frame("policy", {"version": 3, "staleness": bad}))


def test_dcasgd_matches_a_hand_computed_example() -> None:
    # Two patterns' gradient sum G = [2, -4, 0]: mean g = [1, -2, 0]; lambda = 0.5;
    # W_now - W_base = [0.5, -1, 3]. g + 0.5 g*g*(dW) = [1 + 0.25, -2 - 2, 0] = [1.25, -4, 0],
    # times the two patterns: [2.5, -8, 0].
    gradient = np.array([2.0, -4.0, 0.0], np.float32)
    now = np.array([1.0, 1.0, 4.0], np.float32)
    base = np.array([0.5, 2.0, 1.0], np.float32)
    got = delay_compensated(gradient, 2, now, base, 0.5)
    np.testing.assert_array_equal(got, np.array([2.5, -8.0, 0.0], np.float32))
    assert got.dtype == np.float32
    np.testing.assert_array_equal(gradient, [2.0, -4.0, 0.0])  # the input is untouched


def test_staleness_aware_rate_and_gap_aware_by_hand() -> None:
    gradient = np.array([3.0, -6.0], np.float32)
    assert staleness_scaled(gradient, 0) is gradient and staleness_scaled(gradient, 1) is gradient
    np.testing.assert_array_equal(staleness_scaled(gradient, 3), [1.0, -2.0])
    # gaps |now - base| = [0.1, 0.8] over mean step sizes [0.2, 0.2]: [0.5, 4] -> [1, 4]
    now = np.array([1.1, 0.2], np.float32)
    base = np.array([1.0, 1.0], np.float32)
    sizes = np.array([0.2, 0.2], np.float32)
    np.testing.assert_allclose(gap_penalised(gradient, now, base, sizes), [3.0, -1.5], rtol=1e-6)
    # a weight that never moved but did now gets no step; one that never moved keeps it
    still = gap_penalised(gradient, np.array([1.0, 0.5], np.float32), base,
                          np.zeros(2, np.float32))  # fmt: skip
    assert still[0] == 3.0 and abs(still[1]) < 1e-30
    steps = StepSizes(decay=0.5)
    steps.observe(np.zeros(2, np.float32), np.array([1.0, -2.0], np.float32))
    steps.observe(np.zeros(2, np.float32), np.array([3.0, 0.0], np.float32))
    assert steps.mean is not None
    np.testing.assert_array_equal(steps.mean, [2.0, 1.0])


def test_the_weight_history_is_bounded() -> None:
    history = WeightHistory(limit=3)
    for version in range(5):
        history.add(version, np.full(2, version, np.float32))
    assert len(history) == 3
    assert history.get(1) is None and history.misses == 1
    got = history.get(4)
    assert got is not None and got[0] == 4.0


def test_bounded_staleness_worker_keeps_at_most_max_s_1_updates_unsettled() -> None:
    policy = make_compute_policy(JobSpec(mode="async", max_in_flight=4, staleness="bounded:2"))
    assert isinstance(policy, AsyncCompute) and policy.max_in_flight == 2
    assert policy.may_compute(ComputeState(9, 9, 1))
    assert not policy.may_compute(ComputeState(9, 9, 2))
    assert (
        make_compute_policy(
            JobSpec(mode="async", max_in_flight=2, staleness="bounded:0")
        ).max_in_flight
        == 1
    )
    assert (
        type(make_compute_policy(JobSpec(mode="async", max_in_flight=2, staleness="dcasgd")))
        is AsyncCompute
    )
    assert make_compute_policy(JobSpec(mode="sync", max_in_flight=2)).name == "sync"


def test_the_worker_bound_follows_a_policy_change() -> None:
    policy = make_compute_policy(JobSpec(mode="async", max_in_flight=4))
    assert policy.max_in_flight == 4
    policy.follow(StalenessSetting.parse("bounded:2"))
    assert policy.max_in_flight == 2 and not policy.may_compute(ComputeState(9, 9, 2))
    policy.follow(StalenessSetting.parse("bounded:0"))
    assert policy.max_in_flight == 1
    policy.follow(StalenessSetting.parse("bounded:9"))  # never above the job's own bound
    assert policy.max_in_flight == 4
    policy.follow(StalenessSetting.parse("gap"))
    assert policy.max_in_flight == 4 and policy.may_compute(ComputeState(9, 9, 3))
    sync = make_compute_policy(JobSpec(mode="sync", max_in_flight=2))
    sync.follow(StalenessSetting.parse("none"))
    assert sync.max_in_flight == 2


def test_the_workers_job_follows_a_policy_change_where_its_mode_reads_one() -> None:
    job = JobSpec(mode="bmuf", block_sync=False)
    policy = make_compute_policy(job)
    assert follow_change(job, policy, PolicyChange(3, "gap")) == job.with_changes(staleness="gap")
    # a policy for a job whose mode reads none (no snet server sends one: /control refuses
    # it) is read as a welcome's job is, at none: not a ConfigError out of the inbox
    sync = JobSpec(mode="sync")
    assert follow_change(sync, make_compute_policy(sync), PolicyChange(3, "rate")) == sync


def test_lease_sizes_follow_the_data_and_the_workers() -> None:
    bunch = 32
    assert lease_size(100_000, 4, bunch, 2048) == 2048  # plenty: the configured chunk
    holders = 4 * LEASES_PER_WORKER
    waiting = 3 * TAIL_ROUNDS * holders * bunch  # above the tail: three bunches per lease
    assert lease_size(waiting, 4, bunch, 2048) == 3 * bunch
    assert lease_size(waiting + bunch, 4, bunch, 2048) == 3 * bunch  # whole bunches
    assert lease_size(2 * TAIL_ROUNDS * holders * bunch - 1, 4, bunch, 2048) == bunch


def test_four_workers_on_eight_chunks_all_get_frames_and_the_tail_is_bunches() -> None:
    bunch, chunk = 16, 256
    train = np.arange(8 * chunk)  # eight chunks of the configured size
    book = LeaseBook(train, len(train), chunk, seed=1, bunch_frames=bunch)
    book.start_epoch(0)
    holding: dict[int, list[int]] = {w: [] for w in range(4)}
    sizes = []
    # the desk's way: each worker tops up to LEASES_PER_WORKER, delivering one at a time
    while True:
        for worker, leases in holding.items():
            while len(leases) < LEASES_PER_WORKER and (lease := book.grant(worker, 4)):
                leases.append(len(lease.indices))
                sizes.append(len(lease.indices))
                book.accept(worker, lease.lease_id, 0, len(lease.indices))
        if not any(holding.values()):
            break
        for leases in holding.values():
            if leases:
                leases.pop(0)
    assert set(book.granted) == {0, 1, 2, 3}  # nobody idles
    assert sum(sizes) == len(train) and all(size % bunch == 0 for size in sizes)
    assert max(sizes) <= chunk
    tail = TAIL_ROUNDS * 4 * LEASES_PER_WORKER * bunch
    assert sum(s for s in sizes if s == bunch) >= tail - bunch  # the tail bunch by bunch
    # a lone worker (and the sequential trainer) keeps the fixed chunks
    alone = LeaseBook(train, len(train), chunk, seed=1, bunch_frames=bunch)
    alone.start_epoch(0)
    assert all(len(lease.indices) == chunk for lease in iter(lambda: alone.grant(0, 1), None))


def _session(worker_id: int) -> WorkerSession:
    return WorkerSession(worker_id, f"w{worker_id}", "", "numpy", (), lambda _: None, print)


def test_a_worker_without_frames_for_a_whole_epoch_is_reported(
    caplog: pytest.LogCaptureFixture,
) -> None:
    workers = [_session(i) for i in range(3)]
    watch = IdleWatch()
    watch.start_epoch(workers[:2])
    watch.joined(workers[2], frames_waiting=False)
    idle = watch.end_epoch(4, workers, {0: 100})
    assert idle == [workers[1]]  # w2 joined when nothing was left to hand out
    assert workers[1].idle_epochs == 1 and watch.idle_worker_epochs == 1
    assert "worker w1 trained on no frames in epoch 5" in caplog.text  # index 4, read from 1
    assert "too few chunks for the workers?" in caplog.text
    workers[1].taken_back([1])  # its leases were taken back: that is why, not the chunks
    watch.start_epoch(workers)
    caplog.clear()
    watch.end_epoch(5, workers, {0: 100, 2: 100})
    assert "its leases were taken back and it has delivered nothing since" in caplog.text


def test_a_worker_that_never_trains_is_logged_sparingly(caplog: pytest.LogCaptureFixture) -> None:
    worker = _session(0)
    watch = IdleWatch()
    for epoch in range(225):  # the audit's run: a line every epoch
        watch.start_epoch([worker])
        assert watch.end_epoch(epoch, [worker], {}) == [worker]
    lines = [r.getMessage() for r in caplog.records]
    lines = [line for line in lines if "trained on no frames" in line]
    assert len(lines) == 8  # its 1st, 2nd, 4th, ..., 128th idle epoch
    assert lines[0].startswith("worker w0 trained on no frames in epoch 1 ")
    assert lines[-1] == "worker w0 trained on no frames in 128 epochs so far, the latest epoch 128"
    assert worker.idle_epochs == 225 and watch.idle_worker_epochs == 225  # /status: every one


def test_staleness_metrics_are_prometheus_histograms() -> None:
    document = {
        "staleness_histogram": {"0": 5, "2": 3},
        "workers": [{"name": 'w"1', "staleness_histogram": {"1": 4}}],
        "staleness": {"policy": "gap", "refused_stale": 0, "idle_worker_epochs": 2},
    }
    lines = staleness_metrics(document)
    assert 'snet_staleness_bucket{le="1"} 5' in lines
    assert 'snet_staleness_bucket{le="+Inf"} 8' in lines
    assert "snet_staleness_sum 6" in lines and "snet_staleness_count 8" in lines
    assert 'snet_staleness_bucket{worker="w\\"1",le="0"} 0' in lines
    assert 'snet_staleness_count{worker="w\\"1"} 4' in lines
    assert 'snet_staleness_policy{policy="gap"} 1' in lines


def _control_request(app: web.Application, peer: str) -> web.Request:
    transport = mock.Mock()
    transport.get_extra_info.side_effect = lambda key, default=None: (
        (peer, 40000) if key == "peername" else default
    )
    return make_mocked_request(
        "POST", "/control", app=app, transport=transport,
        headers={"Content-Length": "24"},
    )  # fmt: skip


def test_without_a_token_control_is_refused_beyond_loopback() -> None:
    server = mock.Mock()
    app = make_app(server, token=None)
    handler = next(r.handler for r in app.router.routes() if r.method == "POST")
    with pytest.raises(web.HTTPForbidden):
        asyncio.run(handler(_control_request(app, "192.0.2.7")))
    server.coordinator.set_staleness.assert_not_called()


@pytest.mark.parametrize(
    "flags",
    [
        ["--mode", "sync", "--staleness", "bounded:1"],
        ["--mode", "bmuf", "--staleness", "gap"],  # sync blocks: every delta is current
    ],
)
def test_a_policy_where_nothing_is_stale_is_refused_at_start_up(flags: list[str]) -> None:
    """/control refused it at run time; at start-up it was taken, shown as in force in
    /control and as none in /metrics."""
    from snet.cli.commands import server_config
    from snet.cli.parser import command_parser
    from snet.protocol.errors import ConfigError
    from snet.server.staleness import StalenessControl

    settings = dict(zip(flags[::2], flags[1::2], strict=True))
    policy = settings["--staleness"]
    with pytest.raises(
        ConfigError, match=f"^--staleness {policy} {NOTHING_STALE_FLAGS} and this job"
    ):
        server_config(command_parser().parse_args(["server", *flags]))  # before anything
    with pytest.raises(ConfigError, match=f"^staleness {policy} {NOTHING_STALE} and this job"):
        JobSpec(mode=settings["--mode"], staleness=policy)  # any job, as it is made
    async_blocks = JobSpec(mode="bmuf", block_sync=False, staleness=settings["--staleness"])
    assert StalenessControl(async_blocks).name == settings["--staleness"]
