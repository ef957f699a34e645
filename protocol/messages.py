"""The messages of snet's protocol, as frozen dataclasses.

Every message has a ``TYPE`` name on the wire, scalar fields that travel in the msgpack
header, and, for some, array fields (``ARRAYS``) that travel as raw buffers after it.
Array fields are excluded from ``==``; compare them with numpy.

Conversation (see README.md): server -> ServerHello; worker -> Hello (with the token
proof); server -> Welcome (the job), Weights, Lease...; worker -> Update...; either side ->
Heartbeat, ErrorMessage, Goodbye. After Welcome the server sends DataInfo (normalisation
and utterance lengths); a worker that cannot read the data answers FramesWanted and is
then sent Frames (raw normalised frames, each once) before the leases that need them. The
server may ask a worker to Evaluate a copy of the weights on the cross-validation set;
the worker answers with EvalResult. A worker may ask for a full float32 copy with Resync.

Message classes with ``ENCODABLE`` may carry their element ``encoded`` by a codec. Scalar
fields added after version 1 have defaults and may be left out; the decoder fills them in.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, get_args

import numpy as np

from .errors import ConfigError, MalformedFrame
from .staleness import StalenessSetting

NO_ELEMENT = np.zeros(0, dtype="<f4")  # a message's element that is elsewhere (encoded, a slot)
NO_ELEMENT.flags.writeable = False
_no_array = NO_ELEMENT.view  # the array fields' default: a view of it


# Array fields are compared with numpy, not ==. A received message never carries the pool
# buffer its payload landed in: the decoder hands that token out beside the message
# (``decoder.Decoded``), so that a frozen wire message owns nothing.


@dataclass(frozen=True)
class Encoded:
    """An element encoded by a codec (see codecs/): the codec's canonical name and its
    parts. On the wire the parts replace the message's element array, each as a raw
    array whose descriptor carries the codec's name."""

    codec: str
    parts: tuple[np.ndarray, ...]

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)


@dataclass(frozen=True)
class ServerHello:
    """First message on every connection, from the server: who it is, and the nonce the
    worker must prove the shared token against (HMAC-SHA256) when ``auth_required``."""

    TYPE: ClassVar[str] = "server_hello"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    protocol_version: int
    server_name: str
    nonce: bytes
    auth_required: bool


@dataclass(frozen=True)
class Hello:
    """The worker's answer: its name, backend kind and capabilities (e.g. codecs), and
    ``proof`` = HMAC-SHA256(key=token, msg=b"snet-hello\\x00" + nonce) when the server
    requires a token (else b"")."""

    TYPE: ClassVar[str] = "hello"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    protocol_version: int
    worker_name: str
    backend: str
    capabilities: tuple[str, ...]
    proof: bytes


@dataclass(frozen=True)
class Welcome:
    """The server accepts the worker: its id, the whole job (``JobSpec.to_dict()``) and
    the codecs agreed for this worker: ``{"update": ..., "weights": ...}``."""

    TYPE: ClassVar[str] = "welcome"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    worker_id: int
    job: dict[str, Any]
    codecs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Weights:
    """A copy of the network at ``version`` (an element), with the epoch and rate in force,
    and ``settled``: how many of the receiving worker's updates the server has applied or
    refused in this connection (the worker's flow control counts on it).

    When the worker asked for compressed weights the element travels ``encoded``: a full
    copy (``delta_from`` -1, e.g. in fp16) or the difference from the copy the worker
    reconstructed of version ``delta_from``.

    ``digest`` (optional, added with checkpoints) is ``weights_digest`` of the server's
    float32 weights of ``version``: a worker that received them whole can check its copy.
    ``slot`` (weights form ``shared``): the element is not in the frame but in that slot
    of the server's weights board (transport/shared_board.py); -1, not sent, otherwise."""

    TYPE: ClassVar[str] = "weights"
    ARRAYS: ClassVar[tuple[str, ...]] = ("element",)
    ENCODABLE: ClassVar[bool] = True
    version: int
    epoch: int
    learning_rate: float
    settled: int
    element: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    encoded: Encoded | None = field(default=None, compare=False, repr=False)
    delta_from: int = -1
    digest: str = ""
    slot: int = field(default=-1, kw_only=True, metadata={"omitted_when_default": True})


@dataclass(frozen=True)
class Lease:
    """Frames for the worker to train on: global frame indices, in the order to use them."""

    TYPE: ClassVar[str] = "lease"
    ARRAYS: ClassVar[tuple[str, ...]] = ("indices",)
    lease_id: int
    epoch: int
    indices: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    # the epoch's learning rate (0: not given), for a worker that steps locally (bmuf)
    learning_rate: float = 0.0


@dataclass(frozen=True)
class Update:
    """The summed gradient of ``patterns`` patterns (an element), computed against weights
    ``base_version``, on frames ``offset:offset+patterns`` of lease ``lease_id``; or, in
    compressed-update mode, that element ``encoded`` by the codec agreed at the handshake;
    or, ``slot`` >= 0, in that slot of the worker's update board (an empty ``element``)."""

    TYPE: ClassVar[str] = "update"
    ARRAYS: ClassVar[tuple[str, ...]] = ("element",)
    ENCODABLE: ClassVar[bool] = True
    base_version: int
    lease_id: int
    offset: int
    patterns: int
    loss_sum: float
    correct: int
    compute_seconds: float
    element: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    encoded: Encoded | None = field(default=None, compare=False, repr=False)
    slot: int = field(default=-1, kw_only=True, metadata={"omitted_when_default": True})


@dataclass(frozen=True)
class Evaluate:
    """Asks the worker to score weights ``version`` on the cross-validation frames."""

    TYPE: ClassVar[str] = "evaluate"
    ARRAYS: ClassVar[tuple[str, ...]] = ("element",)
    version: int
    epoch: int
    element: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)


@dataclass(frozen=True)
class EvalResult:
    """Cross-validation frame accuracy and summed loss of weights ``version``."""

    TYPE: ClassVar[str] = "eval_result"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    version: int
    epoch: int
    frames: int
    correct: int
    loss_sum: float


@dataclass(frozen=True)
class DataInfo:
    """The data as the server sees it, sent right after ``Welcome``: the feature count,
    the normalisation (row 0 means, row 1 standard deviations, float64) every worker
    applies, and the utterance lengths (from which the split and the windows follow).
    ``cv_utterances > 0``: the last that many utterances are the job's separate CV file
    and all others train; 0: the split follows the job's cv_fraction and split_seed."""

    TYPE: ClassVar[str] = "data_info"
    ARRAYS: ClassVar[tuple[str, ...]] = ("norms", "lengths")
    features: int
    total_frames: int
    norms: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    lengths: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    cv_utterances: int = field(default=0, kw_only=True)  # added later: keyword only
    # protocol/digest.py's ``labels_digest`` of the server's labels ("": none sent, by a
    # server before it): a worker's copy of the same shape with other labels is not it
    labels: str = field(default="", kw_only=True, metadata={"omitted_when_default": True})


@dataclass(frozen=True)
class FramesWanted:
    """The worker cannot read the job's data (``reason`` says why): from now on the server
    sends it the raw frames its leases and evaluations need, each frame once."""

    TYPE: ClassVar[str] = "frames_wanted"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    reason: str


@dataclass(frozen=True)
class Frames:
    """Normalised raw frames (not windows) for a worker fed inline: global row numbers,
    features (rows x features, float32) and each row's label (int32)."""

    TYPE: ClassVar[str] = "frames"
    ARRAYS: ClassVar[tuple[str, ...]] = ("indices", "features", "labels")
    indices: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    features: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    labels: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)


@dataclass(frozen=True)
class WorkerReport:
    """Backend-specific figures a worker wants shown in /status (e.g. an emulated board's
    modelled busy time, a codec's compression ratio): a msgpack map of plain values."""

    TYPE: ClassVar[str] = "worker_report"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    sent_at: float
    report: dict[str, Any]


@dataclass(frozen=True)
class Resync:
    """The worker asks for a full float32 copy of the weights (a copy it cannot use); the
    next ``Weights`` is one. ``no_board``: it cannot read the weights board at all."""

    TYPE: ClassVar[str] = "resync"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    reason: str
    no_board: bool = field(default=False, kw_only=True, metadata={"omitted_when_default": True})


@dataclass(frozen=True)
class Heartbeat:
    """Liveness, sent by either side when it has been quiet for a while."""

    TYPE: ClassVar[str] = "heartbeat"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    sent_at: float


# Either side's heartbeat_seconds at least: 0 sent them without a pause (the worker's), or
# woke the server's housekeeping a thousand times a second (the server's), a core each
HEARTBEAT_FLOOR = 0.05


@dataclass(frozen=True)
class ErrorMessage:
    """A refusal: ``code`` is machine-readable (e.g. ``update_rejected``), ``text`` is not.
    ``fatal`` says whether the sender closes the connection after it. A refused update is
    named by its ``lease_id`` and ``offset`` (-1 when the refusal is not of an update), so
    that a compressing worker can take it out of its error feedback."""

    TYPE: ClassVar[str] = "error"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    code: str
    text: str
    fatal: bool
    lease_id: int = -1
    offset: int = -1


# The reason a server gives when the job is done. Any other reason from a server (it was
# stopped, e.g. to be restarted) tells a worker to try to connect again for a while.
TRAINING_COMPLETE = "training complete"

# The codes of the fatal errors that drop a worker without refusing it: it missed a sync
# round's deadline, or sent nothing for the server's worker_timeout_seconds (a frozen
# process, a suspended machine). It is welcome back, so it reconnects rather than gives up.
ROUND_DEADLINE = "round_deadline"
TIMEOUT = "timeout"
DROPPED = frozenset({ROUND_DEADLINE, TIMEOUT})

# The code of the non-fatal error that tells a worker one of its leases was taken back
# (``lease_id`` names it) for being late: it drops the lease's remaining frames, which
# another worker now trains, rather than compute updates that will be refused; but not its
# last work: it is leased nothing more until an update of its arrives, refused or not.
LEASE_REVOKED = "lease_revoked"
# How many leases taken back either side remembers (a worker holds two at a time): an
# update refused for one of them was being computed when it was told, and is no fault
TAKEN_BACK_REMEMBERED = 16

# The codes of the fatal errors a server at its connection limits turns a newcomer away
# with, before its greeting: the server is busy, not refusing this worker, so a worker
# tries again within its retry window rather than gives up.
TOO_MANY_CONNECTIONS = "too_many_connections"
TOO_MANY_HANDSHAKES = "too_many_handshakes"
BUSY = frozenset({TOO_MANY_CONNECTIONS, TOO_MANY_HANDSHAKES})


@dataclass(frozen=True)
class Goodbye:
    """The sender closes the connection on purpose (``reason`` says why; see
    ``TRAINING_COMPLETE``)."""

    TYPE: ClassVar[str] = "goodbye"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    reason: str


@dataclass(frozen=True)
class SliceState:
    """np mode (docs/network-parallel.md): a slice of hidden units ``start:stop`` with its
    flat parameters (``element``, layout in protocol/slices.py) and their momentum
    (``velocity``) as of bunch ``bunch``. From the server it hands the slice to the worker
    (replacing any it held); from the worker it reports the slice, when asked."""

    TYPE: ClassVar[str] = "np_slice"
    ARRAYS: ClassVar[tuple[str, ...]] = ("element", "velocity")
    start: int
    stop: int
    bunch: int
    element: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    velocity: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)


@dataclass(frozen=True)
class NpBunch:
    """np mode, server to worker, applied in this order: the output ``error`` (patterns x
    outputs) of bunch ``error_of`` (-1: none) to be stepped at ``learning_rate`` over
    ``patterns``; then, if ``collect``, a ``SliceState`` report; then the forward pass of
    bunch ``bunch`` (-1: none) on the frames ``indices``, answered by ``PartialOutputs``."""

    TYPE: ClassVar[str] = "np_bunch"
    ARRAYS: ClassVar[tuple[str, ...]] = ("indices", "error")
    bunch: int
    error_of: int
    learning_rate: float
    patterns: int
    collect: bool
    indices: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)
    error: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)


@dataclass(frozen=True)
class PartialOutputs:
    """np mode, worker to server: its slice's share of the output pre-activations of
    bunch ``bunch`` (patterns x outputs) and the seconds its forward pass took."""

    TYPE: ClassVar[str] = "np_partial"
    ARRAYS: ClassVar[tuple[str, ...]] = ("partial",)
    bunch: int
    compute_seconds: float
    partial: np.ndarray = field(default_factory=_no_array, compare=False, repr=False)


SliceReply = PartialOutputs | SliceState  # what an np-mode worker sends the server


@dataclass(frozen=True)
class PolicyChange:
    """The server put another staleness policy in force (``POST /control``) from the step
    after weights ``version``; sent only to workers that said they follow such changes
    (``FOLLOWS_POLICY`` in ``Hello.capabilities``). A worker acts on it as on the job's
    ``staleness`` (a ``bounded:S`` bound caps its unsettled updates). Checked when
    decoded: a policy text that is too long or not a policy is a malformed frame."""

    TYPE: ClassVar[str] = "policy"
    ARRAYS: ClassVar[tuple[str, ...]] = ()
    version: int
    staleness: str

    def __post_init__(self) -> None:
        if len(self.staleness) > POLICY_CHARS:
            raise MalformedFrame(f"policy.staleness is over {POLICY_CHARS} characters")
        try:
            StalenessSetting.parse(self.staleness)
        except ConfigError as exc:
            raise MalformedFrame(f"policy.staleness: {exc}") from None


POLICY_CHARS = 32  # a policy's text: "dcasgd:0.04" and the like
FOLLOWS_POLICY = "policy:staleness"  # Hello capability: tell me of staleness policy changes

Message = (
    ServerHello | Hello | Welcome | Weights | Lease | Update | Evaluate | EvalResult
    | WorkerReport | Resync | DataInfo | FramesWanted | Frames | Heartbeat | ErrorMessage
    | Goodbye | SliceState | NpBunch | PartialOutputs | PolicyChange
)  # fmt: skip

# Every message by its wire name, in the order of ``Message`` (written once, there).
MESSAGE_TYPES: dict[str, type[Any]] = {cls.TYPE: cls for cls in get_args(Message)}
