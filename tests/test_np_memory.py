"""np mode's slices fit their holders' memory: a worker states its memory when it joins
(protocol/memory.py), the server cuts it no more units than that holds and shares the
rest by speed, and says so clearly when the workers together cannot hold the network
(the daemon test is in test_np_training.py)."""

from __future__ import annotations

import itertools

import pytest

from snet.client.backend import NumpyBackend
from snet.client.slice_work import memory_capabilities
from snet.client.spert.backend import SpertBackend
from snet.client.spert.board import BoardMemoryError, SpertBoard
from snet.client.spert.config import BoardConfig
from snet.protocol.errors import ConfigError
from snet.protocol.memory import WorkerMemory, stated_memory
from snet.protocol.network import NetworkSpec, initial_weights
from snet.protocol.slices import HiddenSlice, slice_network, split_hidden
from snet.server.slice_master import SliceMaster

WIDE = NetworkSpec.parse("351:4000:45")  # 16.85 MB on one board: the issue's network


@pytest.mark.parametrize("memory_mb", [0.5, 0.6, 2.0, 8.0])
@pytest.mark.parametrize("network", ["117:256:10", "351:4000:45"])
def test_the_units_a_worker_is_said_to_hold_are_what_its_board_accepts(
    memory_mb: float, network: str
) -> None:
    spec, bunch = NetworkSpec.parse(network), 128
    board = SpertBoard(BoardConfig(memory_mb=memory_mb))
    held = board.memory.units_held(spec, bunch)
    if held > 0:
        board.configure(slice_network(spec, held), bunch)  # fits
    if held < spec.sizes[1]:
        with pytest.raises(BoardMemoryError):
            board.configure(slice_network(spec, held + 1), bunch)


def test_an_8_mb_board_holds_fewer_than_half_of_the_issues_network() -> None:
    held = SpertBoard(BoardConfig()).memory.units_held(WIDE, 128)
    assert 1000 < held < 2000  # three boards hold it, two do not


def test_a_board_states_its_memory_when_it_joins_and_the_server_reads_it() -> None:
    backend = SpertBackend(BoardConfig(memory_mb=0.6, chunk_patterns=512))
    (capability,) = memory_capabilities(backend)
    stated = stated_memory(("compress:none", capability, "follows_policy"))
    assert stated == backend.board.memory
    assert stated is not None and stated.total == int(0.6 * 2**20) and stated.chunk == 512
    assert memory_capabilities(NumpyBackend()) == ()  # states nothing: holds any slice
    assert stated_memory(("compress:none",)) is None


TOO_LONG = "memory:" + "9" * 20 + ":1:1"


@pytest.mark.parametrize("bad", ["memory:", "memory:1:2", "memory:x:1:2", "memory:1:0:2",
                                 "memory:-1:2:3", "memory:1:2:3:4", TOO_LONG])  # fmt: skip
def test_a_malformed_memory_statement_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ConfigError, match="memory capability"):
        stated_memory((bad,))


def test_slices_are_capped_by_memory_and_the_rest_shared_by_speed() -> None:
    equal = split_hidden(256, [1.0] * 4)
    assert split_hidden(256, [1.0] * 4, [None] * 4) == equal  # nothing capped: as before
    assert split_hidden(256, [1.0] * 4, [64] * 4) == equal  # caps that are not reached
    sizes = [p.units for p in split_hidden(256, [1.0, 1.0, 1.0], [40, None, None])]
    assert sizes == [40, 108, 108]  # the capped board's surplus goes to the others
    sizes = [p.units for p in split_hidden(300, [4.0, 1.0, 1.0], [100, 150, 150])]
    assert sizes == [100, 100, 100]  # the fast worker is held to its memory
    sizes = [p.units for p in split_hidden(300, [4.0, 2.0, 1.0], [100, 300, 300])]
    assert sizes == [100, 133, 67]  # the rest by speed, 2:1
    sizes = [p.units for p in split_hidden(10, [1.0, 1.0, 1.0], [0, 10, 10])]
    assert sizes == [0, 5, 5]  # holds not one unit: gets none
    for caps in ([7, 9, 300], [1, 1, 298], [150, 150, 0]):
        parts = split_hidden(300, [3.0, 1.0, 2.0], caps)
        assert parts[0].start == 0 and parts[-1].stop == 300
        assert all(a.stop == b.start for a, b in itertools.pairwise(parts))
        assert all(p.units <= c for p, c in zip(parts, caps, strict=True)), (caps, parts)


def test_a_network_the_workers_cannot_hold_together_is_a_clear_error() -> None:
    with pytest.raises(ConfigError, match=r"256 hidden units do not fit the 2 workers: "
                                          r"their memory holds at most 96 \(48, 48\)"):  # fmt: skip
        split_hidden(256, [1.0, 1.0], [48, 48])


def test_the_master_cuts_within_memory_or_says_why_it_cannot() -> None:
    spec = NetworkSpec.parse("117:256:10")
    master = SliceMaster(spec, 0.9, initial_weights(spec, 1))
    grants = master.reslice({1: 1.0, 2: 1.0, 3: 1.0}, {1: 48, 2: None, 3: 200})
    assert master.holders == {1: HiddenSlice(0, 48), 2: HiddenSlice(48, 152),
                              3: HiddenSlice(152, 256)}  # fmt: skip
    assert grants[1].weights.size == (117 + 1 + 10) * 48 and master.memory_short == ""
    # they cannot hold it: nobody is cut a slice (a cut by speed alone was refused)
    assert master.reslice({1: 1.0, 2: 1.0}, {1: 48, 2: 48}) == {} and master.holders == {}
    assert "do not fit the 2 workers" in master.memory_short
    assert set(master.reslice({1: 1.0, 2: 1.0}, {1: 48, 2: 208})) == {1, 2}
    assert master.memory_short == ""  # and it clears once they can
    assert master.holders == {1: HiddenSlice(0, 48), 2: HiddenSlice(48, 256)}


def test_worker_memory_is_the_boards_plan() -> None:
    memory = WorkerMemory(8 << 20, 1024, 4096)
    spec = slice_network(WIDE, 1000)
    assert memory.plan(spec, 128).total < memory.total
    assert memory.capability() == f"memory:{8 << 20}:1024:4096"
