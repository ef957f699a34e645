"""Pure tests of the job description: JobSpec, DataSpec and the utterance split."""

from __future__ import annotations

import math
import re
from dataclasses import fields
from typing import Any

import msgpack
import numpy as np
import pytest

from snet.protocol.decoder import FrameDecoder
from snet.protocol.errors import (
    ConfigError,
)
from snet.protocol.framing import (
    encode_bytes,
)
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.messages import (
    Welcome,
)
from snet.protocol.modes import MODE_SETTINGS
from snet.protocol.network import NetworkSpec
from snet.protocol.splits import frames_of, split_utterances

# ---------------------------------------------------------------- job


def test_jobspec_round_trip() -> None:
    job = JobSpec(
        network=NetworkSpec((117, 32, 16, 10), ("relu", "tanh")),
        data=DataSpec(context=4, cv_fraction=0.2, split_seed=5),
        mode="async",  # the mode whose own settings below differ from their defaults
        bunch_size=32,
        learning_rates=(0.5, 0.25),
        momentum=0.5,
        epochs=3,
        updates_per_step=2,
        max_in_flight=4,
        chunk_frames=256,
        seed=9,
    )
    assert JobSpec.from_dict(job.to_dict()) == job
    # through msgpack, as it travels in Welcome
    wire = msgpack.unpackb(msgpack.packb(job.to_dict(), use_bin_type=True), raw=False)
    assert JobSpec.from_dict(wire) == job
    assert JobSpec.from_dict(JobSpec().to_dict()) == JobSpec()
    welcome = Welcome(1, job.to_dict())
    decoded = FrameDecoder().feed(encode_bytes(welcome))[0]
    assert isinstance(decoded, Welcome)
    assert JobSpec.from_dict(decoded.job) == job


def test_jobspec_learning_rate_schedule() -> None:
    job = JobSpec(learning_rates=(0.4, 0.2, 0.1))
    assert [job.learning_rate(e) for e in range(5)] == [0.4, 0.2, 0.1, 0.1, 0.1]


@pytest.mark.parametrize(
    "changes",
    [
        {"mode": "bsp"},
        {"bunch_size": 0},
        {"epochs": 0},
        {"learning_rates": ()},
        {"learning_rates": (0.1, 0.0)},
        {"learning_rates": (-0.1,)},
        {"learning_rates": (0.1, 1e308)},  # past float32: every step would be inf
        {"momentum": 1.0},
        {"momentum": -0.1},
        {"chunk_frames": 64, "bunch_size": 128},
        {"max_in_flight": 0},
        {"updates_per_step": -1},
        {"network": NetworkSpec((100, 10), ())},  # fsdd with context 4 needs 117 inputs
        {"data": DataSpec(context=2)},
    ],
)
def test_jobspec_bad_values(changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        JobSpec(**changes)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"epochs": 10**23}, "epochs must be at most 1,000,000"),
        ({"epochs": 1_000_001}, "epochs must be at most 1,000,000"),
        ({"seed": -1}, "seed must be >= 0"),
        ({"seed": 2**63}, "seed must be at most"),
        ({"bunch_size": 2**31}, "bunch_size must be at most 2,147,483,647"),
        ({"chunk_frames": 2**40}, "chunk_frames must be at most"),
        # a peer's job with no whole number where one belongs: refused where it is read,
        # not taken as far as the frames' shuffle (a float seed) or a bunch of True
        ({"seed": 1.5}, "seed must be an integer, got 1.5"),
        ({"bunch_size": True}, "bunch_size must be an integer, got True"),
        ({"epochs": 3.0}, "epochs must be an integer, got 3.0"),
        ({"data": {"context": 4.5}}, "context must be an integer, got 4.5"),
    ],
)
def test_jobspec_whole_numbers_are_bounded(changes: dict[str, Any], message: str) -> None:
    """Past these a job could not travel (msgpack's 64 bits: a huge epoch count once made
    every handshake fail with an OverflowError) or be planned; refused in one line."""
    with pytest.raises(ConfigError, match=message):
        data = {**JobSpec().to_dict(), **changes}
        JobSpec.from_dict(data)  # as a worker reads a welcome's job


def test_jobspec_at_its_bounds_travels_through_msgpack() -> None:
    job = JobSpec(epochs=1_000_000, seed=2**63 - 1, data=DataSpec(split_seed=2**63 - 1))
    wire = msgpack.unpackb(msgpack.packb(job.to_dict(), use_bin_type=True), raw=False)
    assert JobSpec.from_dict(wire) == job


def test_jobspec_input_size_not_checked_for_npz_sources() -> None:
    job = JobSpec(network=NetworkSpec((20, 4), ()), data=DataSpec(source="/data/x.npz"))
    assert job.network.input_size == 20


@pytest.mark.parametrize(
    "mutate",
    [
        lambda d: d.pop("network"),
        lambda d: d.update(unknown_field=1),
        lambda d: d.update(network={"sizes": [117]}),
        lambda d: d.update(network="117:512:10"),
        lambda d: d.update(data={"context": -1}),
        lambda d: d.update(data={"nonsense": 1}),
        lambda d: d.update(learning_rates=None),
        lambda d: d.update(mode="turbo"),
        lambda d: d.update(bunch_size="128"),
    ],
    ids=[
        "no-network", "unknown", "short", "net-str", "context", "data-key", "lr-none", "mode",
        "bunch-str",
    ],
)  # fmt: skip
def test_jobspec_from_bad_dict(mutate: Any) -> None:
    data = JobSpec().to_dict()
    mutate(data)
    with pytest.raises(ConfigError):
        JobSpec.from_dict(data)


def test_jobspec_from_dict_non_numeric_rate_is_config_error() -> None:
    data = JobSpec().to_dict()
    data["learning_rates"] = ["fast"]
    with pytest.raises(ConfigError):
        JobSpec.from_dict(data)


def test_jobspec_nan_learning_rate_is_config_error() -> None:
    with pytest.raises(ConfigError):
        JobSpec(learning_rates=(math.nan,))


@pytest.mark.parametrize(
    "changes",
    [
        {"context": -1},
        {"context": 2**31},
        {"cv_fraction": 0.0},
        {"cv_fraction": 1.0},
        {"split_seed": -1},
        {"split_seed": 2**63},
    ],
)
def test_dataspec_bad_values(changes: dict[str, Any]) -> None:
    with pytest.raises(ConfigError):
        DataSpec(**changes)


def test_dataspec_window() -> None:
    assert DataSpec(context=4).window == 9
    assert DataSpec(context=0).window == 1


@pytest.mark.parametrize(("utterances", "fraction"), [(2, 0.1), (10, 0.5), (3000, 0.1), (7, 0.99)])
def test_split_utterances_deterministic_disjoint_covering(utterances: int, fraction: float) -> None:
    train, cv = split_utterances(utterances, fraction, seed=3)
    train2, cv2 = split_utterances(utterances, fraction, seed=3)
    np.testing.assert_array_equal(train, train2)
    np.testing.assert_array_equal(cv, cv2)
    assert len(np.intersect1d(train, cv)) == 0
    np.testing.assert_array_equal(np.sort(np.concatenate([train, cv])), np.arange(utterances))
    assert len(train) >= 1 and len(cv) >= 1
    assert len(cv) == min(max(1, round(utterances * fraction)), utterances - 1)
    assert np.all(np.diff(train) > 0) and np.all(np.diff(cv) > 0)


def test_split_utterances_depends_on_seed() -> None:
    a, _ = split_utterances(100, 0.3, seed=0)
    b, _ = split_utterances(100, 0.3, seed=1)
    assert not np.array_equal(a, b)


def test_split_utterances_needs_two() -> None:
    with pytest.raises(ConfigError):
        split_utterances(1, 0.5, seed=0)


def test_frames_of() -> None:
    lengths = np.array([2, 3, 4, 1])
    np.testing.assert_array_equal(frames_of(np.array([0, 2]), lengths), [0, 1, 5, 6, 7, 8])
    np.testing.assert_array_equal(frames_of(np.array([3, 1]), lengths), [9, 2, 3, 4])
    everything = frames_of(np.arange(4), lengths)
    np.testing.assert_array_equal(everything, np.arange(10))
    empty = frames_of(np.zeros(0, dtype=np.int64), lengths)
    assert empty.shape == (0,)
    assert empty.dtype == np.int64
    assert frames_of(np.array([1]), lengths).dtype == np.int64


# ---------------------------------------------------------------- a mode's own settings

# Which kinds of job read each setting that not every mode reads, as the code does (the
# worker's and the server's policies, server/block_filter.py, server/slice_rounds.py),
# written out here apart from protocol/modes.py's table, which it pins down; bmuf by its
# blocks: "bmuf-async" is bmuf with block_sync false.
READ_BY = {
    "updates_per_step": {"async"},
    "max_in_flight": {"async"},
    "staleness": {"async", "bmuf-async"},
    "compress": {"sync", "async", "bmuf", "bmuf-async"},
    "block_bunches": {"bmuf", "bmuf-async"},
    "block_seconds": {"bmuf", "bmuf-async"},
    "block_filter": {"bmuf", "bmuf-async"},
    "block_momentum": {"bmuf", "bmuf-async"},
    "block_lr": {"bmuf", "bmuf-async"},
    "block_sync": {"bmuf", "bmuf-async"},
    "block_overlap": {"bmuf", "bmuf-async"},
    "np_pipeline": {"np"},
}
# a value other than its default for each, as it is shown in a message
OTHER_VALUE: dict[str, tuple[Any, str]] = {
    "updates_per_step": (3, "3"),
    "max_in_flight": (4, "4"),
    "staleness": ("rate", "rate"),
    "compress": ("fp16", "fp16"),
    "block_bunches": (8, "8"),
    "block_seconds": (2.5, "2.5"),
    "block_filter": ("average", "average"),
    "block_momentum": (0.5, "0.5"),
    "block_lr": (0.5, "0.5"),
    "block_sync": (False, "false"),
    "block_overlap": (True, "true"),
    "np_pipeline": (True, "true"),
}
KINDS = {
    "sync": {"mode": "sync"},
    "async": {"mode": "async"},
    "bmuf": {"mode": "bmuf"},
    "bmuf-async": {"mode": "bmuf", "block_sync": False},
    "np": {"mode": "np"},
}


def test_the_table_names_every_setting_only_some_modes_read() -> None:
    assert {name: set(modes) for name, modes in MODE_SETTINGS.items()} == READ_BY
    # their flags say which modes, and snet train (no mode of its own) offers none of them
    for item in fields(JobSpec):
        said = item.metadata.get("help", "").split(":")[0]
        named = set(re.findall(r"(?<![-\w])(sync|async|bmuf|np)\b", said))
        assert named == {kind.split("-")[0] for kind in READ_BY.get(item.name, ())}, item.name
        assert item.name not in READ_BY or item.metadata["parallel"], item.name


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("name", list(READ_BY))
def test_a_modes_own_setting_is_refused_where_its_mode_would_ignore_it(
    kind: str, name: str
) -> None:
    """``--mode sync --block-bunches 8`` trained plain sync without a word: a setting a
    mode does not read, away from its default, is refused where the job is made."""
    value, shown = OTHER_VALUE[name]
    changes = {**KINDS[kind], name: value}
    read = kind in READ_BY[name] or (name == "block_sync" and kind == "bmuf")  # -> async blocks
    if read:
        assert getattr(JobSpec(**changes), name) == value
    else:
        with pytest.raises(ConfigError, match=rf"^{name} {re.escape(shown)} applies to .* only, "
                           rf"and this job is in {KINDS[kind]['mode']} mode.*, which would "
                           r"ignore it \(leave it at its default, "):  # fmt: skip
            JobSpec(**changes)
    assert JobSpec(**{**KINDS[kind], name: getattr(JobSpec(), name)})  # at its default: any


@pytest.mark.parametrize(
    ("changes", "said"),
    [
        (
            {"mode": "sync", "block_bunches": 8, "np_pipeline": True},
            "block_bunches 8 applies to bmuf mode only, and this job is in sync mode, which "
            "would ignore it (leave it at its default, 16; np_pipeline true is ignored there "
            "too)",
        ),
        (
            {"mode": "bmuf", "staleness": "bounded:2"},
            "staleness bounded:2 applies to async mode and bmuf mode with asynchronous blocks "
            "(block_sync false) only, and this job is in bmuf mode with synchronous blocks, "
            "which would ignore it (leave it at its default, none)",
        ),
        (
            {"mode": "np", "compress": "int8"},
            "compress int8 applies to sync mode, async mode and bmuf mode only, and this job "
            "is in np mode, which would ignore it (leave it at its default, none)",
        ),
    ],
)
def test_the_refusal_names_the_setting_the_modes_that_read_it_and_the_jobs(
    changes: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigError) as refused:
        JobSpec(**changes)
    assert str(refused.value) == said


def test_the_mode_a_setting_is_for_takes_it() -> None:
    assert JobSpec(mode="bmuf", block_bunches=8).block_bunches == 8
    assert JobSpec(mode="bmuf", block_sync=False, staleness="bounded:2").staleness == "bounded:2"
    assert JobSpec(mode="np", np_pipeline=True).np_pipeline


def test_a_job_an_older_snet_ran_is_read_with_what_its_mode_ignored_at_the_defaults() -> None:
    """An older server welcomed workers with such a job (it trained as if at the defaults):
    a worker reads it so, rather than refusing a job it can run."""
    older = {**JobSpec(mode="sync").to_dict(), "block_bunches": 8, "np_pipeline": True,
             "max_in_flight": 5, "block_sync": False}  # fmt: skip
    assert JobSpec.from_dict(older) == JobSpec(mode="sync")
    welcome = FrameDecoder().feed(encode_bytes(Welcome(1, older)))[0]
    assert isinstance(welcome, Welcome) and JobSpec.from_dict(welcome.job) == JobSpec(mode="sync")
    # what its mode reads is kept as it was
    blocks = {**JobSpec(mode="bmuf").to_dict(), "block_bunches": 8, "updates_per_step": 2}
    assert JobSpec.from_dict(blocks) == JobSpec(mode="bmuf", block_bunches=8)
    # a value its mode reads is still checked
    with pytest.raises(ConfigError, match="block_bunches must be >= 1"):
        JobSpec.from_dict({**JobSpec(mode="bmuf").to_dict(), "block_bunches": 0})


def test_blocks_of_seconds_refuse_a_count_of_bunches_they_would_ignore() -> None:
    """A block of seconds ends by the clock or at its lease's end (client/blocks.py): its
    block_bunches did nothing, without a word."""
    with pytest.raises(ConfigError) as refused:
        JobSpec(mode="bmuf", block_bunches=8, block_seconds=0.5)
    assert str(refused.value) == (
        "block_bunches 8 is ignored when block_seconds is set (block_seconds 0.5: a block "
        "ends by the clock, or at its lease's end); give one of them (leave it at its "
        "default, 16)"
    )
    assert JobSpec(mode="bmuf", block_seconds=0.5).block_seconds == 0.5
    assert JobSpec(mode="bmuf", block_bunches=8).block_bunches == 8
    # a job an older snet ran with both trained by the clock: it is read so, and resumes
    both = {**JobSpec(mode="bmuf", block_seconds=0.5).to_dict(), "block_bunches": 8}
    assert JobSpec.from_dict(both) == JobSpec(mode="bmuf", block_seconds=0.5)


def test_a_job_needs_a_network_of_at_least_two_outputs() -> None:
    """`snet train --network 4:8:1` trained, and reported 100 % of training and CV frames
    right, from a softmax over one unit (always 1); the data's check of two classes ran
    only for networks of two outputs and more."""
    with pytest.raises(ConfigError, match=r"^network 4:8:1: a classifier needs at least 2"):
        JobSpec(network=NetworkSpec.parse("4:8:1"), data=DataSpec(source="x.npz", context=0))
    two = JobSpec(network=NetworkSpec.parse("4:8:2"), data=DataSpec(source="x.npz", context=0))
    assert two.network.output_size == 2
