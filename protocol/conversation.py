"""``Conversation``: which message each side may send when, as one table.

Each connection has two roles, the server and the worker, and each role is in one state.
A role's state says which messages it may send next (``SENDS``); a message moves the
sender's own state along, and a few messages move the peer's state too (``PEER_MOVES``:
the worker's ``hello`` lets the server welcome it, the server's ``welcome`` lets the worker
train, an ``evaluate`` lets the worker answer with an ``eval_result``). Both ends keep the
same ``Conversation`` and check every message against it, in the manner of h11's
``_state.py``: on receive a message out of turn is the peer's fault (``OutOfTurn``, sent
as the fatal error code ``protocol``; the connection closes); on send it is a bug on this
side (``LocalProtocolError``), never the peer's fault.

States, as the server and the reference worker behave today::

    server  HELLO --server_hello--> WAITING --(worker's hello)--> WELCOMING
            --welcome--> BRIEFING --data_info--> TRAINING
    worker  HELLO --hello--> WAITING --(server's welcome)--> TRAINING
            --(server's evaluate)--> EVALUATING --eval_result (the last one asked)--> TRAINING

A ``goodbye`` or a fatal ``error`` moves its sender to ``CLOSED``, from any state: it
sends nothing more (a connection's transport drops what is sent after it, counted, as it
drops what is sent after the connection closed). The peer's state does not change: what
it sent before it read the goodbye is still in turn. ``eval_result`` is counted: a worker
asked twice answers twice. Non-fatal ``error`` (a refused update) is the server's, while
training.

``Conversation`` is pure: no I/O, no clock. ``Channel`` holds one and calls ``sent`` and
``received``; tests and protocol/README.md's message table are checked against ``SENDS``.
"""

from __future__ import annotations

from enum import Enum

from .errors import LocalProtocolError, OutOfTurn
from .messages import ErrorMessage, Message


class Role(Enum):
    SERVER = "server"
    WORKER = "worker"

    # Enum's own __hash__ is Python code (a call per dict lookup: several per frame on
    # both sides); members are singletons compared by identity, so identity hashes agree.
    __hash__ = object.__hash__

    @property
    def peer(self) -> Role:
        return Role.WORKER if self is Role.SERVER else Role.SERVER


class State(Enum):
    HELLO = "hello"  # the role's first message is still to come
    WAITING = "waiting"  # it said hello; the peer's answer is awaited
    WELCOMING = "welcoming"  # (server) the worker said hello: welcome it, or refuse it
    BRIEFING = "briefing"  # (server) welcomed: the data description comes next
    TRAINING = "training"
    EVALUATING = "evaluating"  # (worker) training, and owes one or more eval_results
    CLOSED = "closed"  # said goodbye or a fatal error: sends nothing more

    __hash__ = object.__hash__  # as Role's: identity, in C


FATAL_ERROR = "error:fatal"  # a fatal ``error`` frame, told apart from a non-fatal one
_LEAVING = {"goodbye": State.CLOSED, FATAL_ERROR: State.CLOSED}  # allowed in every open state

# role -> its state -> {what it may send: its next state}
SENDS: dict[Role, dict[State, dict[str, State]]] = {
    Role.SERVER: {
        State.HELLO: {"server_hello": State.WAITING, **_LEAVING},
        State.WAITING: {**_LEAVING},
        State.WELCOMING: {"welcome": State.BRIEFING, **_LEAVING},
        State.BRIEFING: {"data_info": State.TRAINING, **_LEAVING},
        State.TRAINING: {
            "weights": State.TRAINING,
            "lease": State.TRAINING,
            "evaluate": State.TRAINING,
            "frames": State.TRAINING,
            "heartbeat": State.TRAINING,
            "error": State.TRAINING,
            "np_slice": State.TRAINING,
            "np_bunch": State.TRAINING,
            "policy": State.TRAINING,
            **_LEAVING,
        },
        State.CLOSED: {},
    },
    Role.WORKER: {
        State.HELLO: {"hello": State.WAITING, **_LEAVING},
        State.WAITING: {**_LEAVING},
        State.TRAINING: {
            "update": State.TRAINING,
            "worker_report": State.TRAINING,
            "resync": State.TRAINING,
            "frames_wanted": State.TRAINING,
            "heartbeat": State.TRAINING,
            "np_slice": State.TRAINING,
            "np_partial": State.TRAINING,
            **_LEAVING,
        },
        State.EVALUATING: {
            "update": State.EVALUATING,
            "worker_report": State.EVALUATING,
            "resync": State.EVALUATING,
            "frames_wanted": State.EVALUATING,
            "heartbeat": State.EVALUATING,
            "np_slice": State.EVALUATING,
            "np_partial": State.EVALUATING,
            "eval_result": State.TRAINING,  # or EVALUATING while more are owed
            **_LEAVING,
        },
        State.CLOSED: {},
    },
}

# (sender, what it sent) -> {the peer's state: its next state}
PEER_MOVES: dict[tuple[Role, str], dict[State, State]] = {
    (Role.WORKER, "hello"): {State.WAITING: State.WELCOMING},
    (Role.SERVER, "welcome"): {State.WAITING: State.TRAINING},
    (Role.SERVER, "evaluate"): {State.TRAINING: State.EVALUATING},
}


def event_name(message: Message) -> str:
    """The table's name for a message: its type, with fatal errors told apart."""
    if isinstance(message, ErrorMessage) and message.fatal:
        return FATAL_ERROR
    return message.TYPE


def shown_name(message: Message) -> str:
    """A message as an out-of-turn error names it: an error frame says fatal or not (the
    table allows a worker the fatal one only, and "may not send error" read as if it
    allowed it none)."""
    if isinstance(message, ErrorMessage):
        return f"{'a fatal' if message.fatal else 'a non-fatal'} error"
    return message.TYPE


def senders(message_type: str) -> set[Role]:
    """The roles that may ever send ``message_type`` (protocol/README.md's "dir" column)."""
    return {
        role
        for role, states in SENDS.items()
        for allowed in states.values()
        if message_type in {name.split(":")[0] for name in allowed}
    }


class Conversation:
    """Both roles' states on one connection, seen from ``role``'s end."""

    def __init__(self, role: Role) -> None:
        self.role = role
        self.states = {Role.SERVER: State.HELLO, Role.WORKER: State.HELLO}
        self.evaluations_owed = 0  # evaluate messages the worker has not answered yet

    @property
    def state(self) -> State:
        """This end's own state."""
        return self.states[self.role]

    @property
    def closed(self) -> bool:
        """This end said goodbye or a fatal error: it sends nothing more."""
        return self.state is State.CLOSED

    @property
    def trusted(self) -> bool:
        """The handshake is done: the server welcomed the worker (after checking its
        token proof). Until then a peer may send only small frames (``Channel``)."""
        return self.states[Role.WORKER] in (State.TRAINING, State.EVALUATING)

    def may_receive(self, message_type: str) -> bool:
        """Whether the peer may send a message of ``message_type`` now (checked on a
        frame's header, before its payload is read into anything)."""
        allowed = SENDS[self.role.peer][self.states[self.role.peer]]
        return message_type in allowed or (message_type == "error" and FATAL_ERROR in allowed)

    def may_send(self, message: Message) -> bool:
        return event_name(message) in SENDS[self.role][self.state]

    def sent(self, message: Message) -> None:
        """Record a message this end sends; ``LocalProtocolError`` if it is out of turn."""
        if not self._advance(self.role, message):
            raise LocalProtocolError(
                f"{self.role.value} may not send {shown_name(message)} in state "
                f"{self.state.value} (a bug on this side)"
            )

    def received(self, message: Message) -> None:
        """Record a message from the peer; ``OutOfTurn`` if the peer may not send it now."""
        peer = self.role.peer
        if not self._advance(peer, message):
            raise OutOfTurn(
                f"a {peer.value} may not send {shown_name(message)} in state "
                f"{self.states[peer].value}"
            )

    def _advance(self, sender: Role, message: Message) -> bool:
        name = event_name(message)
        state = self.states[sender]
        next_state = SENDS[sender][state].get(name)
        if next_state is None:
            return False
        if name == "eval_result":
            self.evaluations_owed -= 1
            if self.evaluations_owed > 0:
                next_state = State.EVALUATING
        self.states[sender] = next_state
        peer = sender.peer
        moves = PEER_MOVES.get((sender, name), {})
        if name == "evaluate" and self.states[peer] is not State.CLOSED:
            self.evaluations_owed += 1
        if self.states[peer] in moves:
            self.states[peer] = moves[self.states[peer]]
        return True
