"""The fault switch's rules (transport/faults.py): parsed from ``--faults`` with their
direction inferred from the side, refused clearly when wrong (in the settings too), and
each firing once, on its nth message or byte. The switch at work on real sockets:
test_transport.py; with real processes: test_fault_switch.py."""

from __future__ import annotations

import pytest

from snet.client.config import WorkerConfig
from snet.protocol.conversation import Role
from snet.protocol.errors import ConfigError
from snet.server.config import ServerConfig
from snet.transport.faults import FaultRule, FaultSwitch, parse_faults


def test_fault_rules_parse_with_their_direction_inferred() -> None:
    rules = parse_faults("drop:update:5; corrupt:weights:9;delay:lease:2:0.25", Role.WORKER)
    assert rules == (
        FaultRule("drop", "send", "update", 5),
        FaultRule("corrupt", "receive", "weights", 9),
        FaultRule("delay", "receive", "lease", 2, 0.25),
    )
    assert parse_faults("drop:update:5", Role.SERVER) == (
        FaultRule("drop", "receive", "update", 5),
    )
    assert parse_faults("duplicate:send:heartbeat:3;cut:receive:4096", Role.SERVER) == (
        FaultRule("duplicate", "send", "heartbeat", 3),
        FaultRule("cut", "receive", "", 4096),
    )
    assert parse_faults(" ; ", Role.SERVER) == ()
    assert FaultSwitch.from_text("", Role.WORKER) is None  # off: no switch at all


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("lose:update:5", "unknown action 'lose'"),
        ("drop:updates:5", "unknown message kind 'updates'"),
        ("drop:update:0", "count '0' is not a whole number"),
        ("drop:update:five", "count 'five'"),
        ("drop:update", "expected a message kind and a count"),
        ("drop:update:5:1.0", "expected a message kind and a count"),
        ("drop:heartbeat:2", "both sends and receives heartbeat"),
        ("drop:send:weights:2", "a worker never sends weights"),
        ("delay:weights:2:soon", "delay seconds 'soon' is not a number"),
        ("cut:update:100", "cut takes a direction"),
    ],
)
def test_bad_fault_rules_are_refused_clearly(text: str, why: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_faults(f"drop:update:1;{text}", Role.WORKER)
    assert why in str(caught.value) and repr(text) in str(caught.value)


def test_the_settings_refuse_a_bad_fault_rule() -> None:
    assert ServerConfig(faults="drop:update:5").faults == "drop:update:5"
    assert WorkerConfig(faults="drop:update:5;corrupt:weights:9").faults
    with pytest.raises(ConfigError, match="a server never sends update"):
        ServerConfig(faults="drop:send:update:5")
    with pytest.raises(ConfigError, match="unknown action 'lose'"):
        WorkerConfig(faults="lose:update:5")


def test_each_rule_fires_once_on_its_nth_message() -> None:
    switch = FaultSwitch(parse_faults("drop:update:3;cut:send:100", Role.WORKER))
    hits = [switch.message("send", "update") for _ in range(5)]
    assert [rule is not None for rule in hits] == [False, False, True, False, False]
    assert switch.message("receive", "weights") is None
    assert switch.passing("send", 60) is None
    assert switch.passing("send", 60) == 40  # the 100th byte is the last one through
    assert switch.passing("send", 60) is None
    assert switch.injected == ["drop:send:update:3", "cut:send:100"]
