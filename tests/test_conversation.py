"""The conversation table (protocol/conversation.py): its rules, the Channel enforcing
them on send and on receive, and protocol/README.md's tables against it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from snet.protocol.channel import HANDSHAKE_PAYLOAD_BYTES, Channel
from snet.protocol.conversation import (
    FATAL_ERROR,
    PEER_MOVES,
    SENDS,
    Conversation,
    Role,
    State,
    senders,
)
from snet.protocol.errors import FrameTooLarge, LocalProtocolError, OutOfTurn, ProtocolError
from snet.protocol.framing import MAGIC, PREFIX, ArrayInfo, FrameLimits, encode_bytes
from snet.protocol.messages import (
    MESSAGE_TYPES,
    DataInfo,
    ErrorMessage,
    EvalResult,
    Evaluate,
    Goodbye,
    Heartbeat,
    Hello,
    Lease,
    Message,
    ServerHello,
    Update,
    Weights,
    Welcome,
)

from wire_samples import readme_text, table_cells

SERVER_HELLO = ServerHello(1, "s", b"n" * 32, False)
HELLO = Hello(1, "w", "numpy", (), b"")
WELCOME = Welcome(1, {})
DATA_INFO = DataInfo(3, 10)
WEIGHTS = Weights(0, 0, 0.1, 0)
UPDATE = Update(0, 1, 0, 4, 1.0, 2, 0.01)
EVALUATE = Evaluate(0, 0)
EVAL_RESULT = EvalResult(0, 0, 10, 9, 1.5)

# The conversation of a worker that joins, trains, is asked to evaluate and leaves.
JOURNEY: list[tuple[Role, Message]] = [
    (Role.SERVER, SERVER_HELLO),
    (Role.WORKER, HELLO),
    (Role.SERVER, WELCOME),
    (Role.SERVER, DATA_INFO),
    (Role.SERVER, WEIGHTS),
    (Role.SERVER, Lease(1, 0)),
    (Role.WORKER, UPDATE),
    (Role.SERVER, ErrorMessage("update_rejected", "NaN", False, 1, 0)),
    (Role.SERVER, EVALUATE),
    (Role.SERVER, EVALUATE),
    (Role.WORKER, EVAL_RESULT),
    (Role.WORKER, UPDATE),
    (Role.WORKER, EVAL_RESULT),
    (Role.WORKER, Heartbeat(1.0)),
    (Role.SERVER, Goodbye("training complete")),
    (Role.WORKER, UPDATE),  # sent before it read the goodbye: still in turn
    (Role.WORKER, Goodbye("bye")),
]


def test_both_ends_follow_a_whole_conversation() -> None:
    ends = {role: Conversation(role) for role in Role}
    for sender, message in JOURNEY:
        ends[sender].sent(message)
        ends[sender.peer].received(message)
        assert ends[Role.SERVER].states == ends[Role.WORKER].states
    assert ends[Role.SERVER].states == {Role.SERVER: State.CLOSED, Role.WORKER: State.CLOSED}


def test_evaluations_are_owed_one_answer_each() -> None:
    server = Conversation(Role.SERVER)
    for sender, message in JOURNEY[:9]:  # up to and including the first evaluate
        (server.sent if sender is Role.SERVER else server.received)(message)
    assert server.states[Role.WORKER] is State.EVALUATING
    server.received(EVAL_RESULT)
    assert server.states[Role.WORKER] is State.TRAINING
    with pytest.raises(OutOfTurn):
        server.received(EVAL_RESULT)  # nobody asked for a second one


@pytest.mark.parametrize(
    ("history", "message"),
    [
        ([], UPDATE),  # anything but hello first
        ([], WEIGHTS),  # a server-only message from a worker
        ([(Role.SERVER, SERVER_HELLO)], UPDATE),
        ([(Role.SERVER, SERVER_HELLO), (Role.WORKER, HELLO)], HELLO),  # hello twice
        (
            [(Role.SERVER, SERVER_HELLO), (Role.WORKER, HELLO), (Role.SERVER, WELCOME)],
            EVAL_RESULT,
        ),
    ],
)
def test_a_worker_out_of_turn_is_the_peers_fault(
    history: list[tuple[Role, Message]], message: Message
) -> None:
    server = Conversation(Role.SERVER)
    for sender, earlier in history:
        (server.sent if sender is Role.SERVER else server.received)(earlier)
    with pytest.raises(OutOfTurn) as caught:
        server.received(message)
    assert caught.value.code == "protocol" and isinstance(caught.value, ProtocolError)
    assert message.TYPE in str(caught.value)


def test_a_workers_non_fatal_error_is_named_so() -> None:
    """A worker may send a fatal error only: the refusal said "may not send error", as if
    it might send none."""
    server = Conversation(Role.SERVER)
    for sender, earlier in JOURNEY[:3]:  # server_hello, hello, welcome
        (server.sent if sender is Role.SERVER else server.received)(earlier)
    with pytest.raises(OutOfTurn, match="a worker may not send a non-fatal error in state"):
        server.received(ErrorMessage("busy", "later", False))
    server.received(ErrorMessage("out_of_memory", "gone", True))  # allowed: it ends the worker


def test_out_of_turn_on_our_side_is_a_bug_not_a_protocol_error() -> None:
    server = Conversation(Role.SERVER)
    with pytest.raises(LocalProtocolError) as caught:
        server.sent(WEIGHTS)  # before server_hello
    assert not isinstance(caught.value, ProtocolError)
    server.sent(SERVER_HELLO)
    with pytest.raises(LocalProtocolError):
        server.sent(WELCOME)  # before the worker said hello
    worker = Conversation(Role.WORKER)
    worker.received(SERVER_HELLO)
    worker.sent(HELLO)
    with pytest.raises(LocalProtocolError):
        worker.sent(UPDATE)  # before welcome
    worker.received(WELCOME)
    worker.received(DATA_INFO)
    worker.sent(UPDATE)
    with pytest.raises(LocalProtocolError):
        worker.sent(ErrorMessage("update_rejected", "x", False))  # non-fatal: the server's


def test_goodbye_or_fatal_error_closes_the_sender_only() -> None:
    for leaving in (Goodbye("x"), ErrorMessage("timeout", "quiet", True)):
        worker = Conversation(Role.WORKER)
        worker.received(SERVER_HELLO)
        worker.received(leaving)
        assert worker.states[Role.SERVER] is State.CLOSED
        assert worker.state is State.HELLO and not worker.closed
        with pytest.raises(OutOfTurn):
            worker.received(Heartbeat(0.0))
        worker.sent(Goodbye("me too"))
        assert worker.closed and not worker.may_send(Heartbeat(0.0))


# ---------------------------------------------------------------- the Channel enforces it


class Wire:
    def __init__(self) -> None:
        self.data = bytearray()

    def write(self, piece: bytes | memoryview) -> None:
        self.data += piece


def test_channel_checks_what_it_sends() -> None:
    wire = Wire()
    channel = Channel(wire.write, conversation=Conversation(Role.SERVER))
    with pytest.raises(LocalProtocolError):
        channel.send(WELCOME)
    assert not wire.data  # nothing left the channel
    channel.send(SERVER_HELLO)
    assert bytes(wire.data) == encode_bytes(SERVER_HELLO)


class OneSlotSink:
    def __init__(self) -> None:
        self.given: list[object] = []

    def payload_target(
        self, message_type: str, arrays: tuple[ArrayInfo, ...], payload_bytes: int
    ) -> tuple[memoryview, object] | None:
        token = f"slot-{len(self.given)}"
        self.given.append(token)
        return memoryview(bytearray(payload_bytes)), token


def test_channel_refuses_a_message_out_of_turn_before_lending_it_anything() -> None:
    sink = OneSlotSink()
    channel = Channel(Wire().write, sink=sink, conversation=Conversation(Role.SERVER))
    channel.send(SERVER_HELLO)
    update = Update(0, 1, 0, 4, 1.0, 2, 0.01, element=np.ones(4, np.float32))
    with pytest.raises(OutOfTurn):
        channel.feed(encode_bytes(update))  # an update before hello
    assert sink.given == []  # refused on its header: no pooled element was lent to it
    assert channel.abandon() == []


def test_until_the_handshake_is_done_a_peer_may_send_only_small_frames() -> None:
    channel = Channel(Wire().write, conversation=Conversation(Role.SERVER))
    channel.send(SERVER_HELLO)
    declared = PREFIX.pack(MAGIC, 1, 0, 177, 512 << 20) + b"\x80" * 177  # 512 MiB declared
    with pytest.raises(FrameTooLarge, match=f"limit {HANDSHAKE_PAYLOAD_BYTES}"):
        channel.feed(declared)
    trusted = Channel(Wire().write, conversation=Conversation(Role.SERVER))
    trusted.send(SERVER_HELLO)
    trusted.feed(encode_bytes(HELLO))
    trusted.send(WELCOME)  # the server welcomes a worker only after its token proof
    assert trusted.decoder.limits == FrameLimits()  # the full limits from now on


def test_channel_hands_in_turn_messages_out_with_their_tokens() -> None:
    sink = OneSlotSink()
    channel = Channel(Wire().write, sink=sink, conversation=Conversation(Role.WORKER))
    frames = b"".join(
        encode_bytes(m)
        for m in (SERVER_HELLO, Weights(0, 0, 0.1, 0, element=np.ones(3, np.float32)))
    )
    decoded = channel.feed(frames[: len(encode_bytes(SERVER_HELLO))])
    assert [d.message for d in decoded] == [SERVER_HELLO]
    with pytest.raises(OutOfTurn):  # weights before welcome
        channel.feed(frames[len(encode_bytes(SERVER_HELLO)) :])
    assert sink.given == [] and channel.abandon() == []  # refused before anything was lent


# ---------------------------------------------------------------- protocol/README.md


def test_readme_message_directions_are_the_tables() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `\w+` \| ([^|]+) \|", readme_text(), flags=re.MULTILINE)
    directions = {name: cell.strip() for name, cell in rows}
    assert set(directions) == set(MESSAGE_TYPES)
    spelled = {"S -> W": {Role.SERVER}, "W -> S": {Role.WORKER}, "both": set(Role)}
    for name, direction in directions.items():
        assert senders(name) == spelled[direction], name
        heading = re.search(rf"^### `{name}` — \w+ \(([^)]+)\)", readme_text(), re.MULTILINE)
        assert heading is not None and heading.group(1) == direction, name


def _readme_table(marker: str) -> list[list[str]]:
    block = readme_text().split(f"<!-- {marker} -->\n", 1)[1].split("\n\n", 1)[0]
    return [table_cells(line) for line in block.splitlines()[2:]]


def _names(cell: str) -> list[str]:
    return re.findall(r"`(\w+)`", cell)


def test_readme_conversation_table_is_the_codes() -> None:
    leaving = {"goodbye", FATAL_ERROR}
    expected = []
    for role, states in SENDS.items():
        for state, allowed in states.items():
            if state is State.CLOSED:
                assert allowed == {}
                continue
            assert {k: v for k, v in allowed.items() if k in leaving} == dict.fromkeys(
                leaving, State.CLOSED
            ), (role, state)
            stay = [e for e, n in allowed.items() if n is state and e not in leaving]
            move = [
                name
                for e, n in allowed.items()
                if n is not state and e not in leaving
                for name in (e, n.value)
            ]
            expected.append([role.value, state.value, stay, move])
    found = [
        [c[0], *_names(c[1]), _names(c[2]), _names(c[3])] for c in _readme_table("conversation")
    ]
    assert found == expected


def test_readme_moves_table_is_the_codes() -> None:
    found = {
        (Role(cells[0]), _names(cells[1])[0]): _names(cells[2])
        for cells in _readme_table("conversation-moves")
    }
    expected = {
        key: [name for a, b in moves.items() for name in (a.value, b.value)]
        for key, moves in PEER_MOVES.items()
    }
    assert found == expected
