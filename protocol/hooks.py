"""Behaviour hooks, CLONES-style: code that runs before and after training, each epoch and
each bunch, without touching the training loop.

The server's coordinator and the sequential trainer (``snet train``) call the same hooks
at the same points; the statistics snet reports (MCUPS, accuracy per epoch) are collected
by the built-in hooks below, and a user adds one by naming its class
(``--hooks package.module:ClassName``; the class is built without arguments). A hook's
``figures()`` appear in /status under ``"hooks"``. A hook that raises, or whose figures JSON
cannot encode, is switched off and its error shown there: statistics never stop training
(nor the /status, /metrics and status.json they go into). A hook that keeps a history
gives it in ``checkpoint_state()`` (plain data: JSON, numpy arrays; else the hook is
switched off) and takes it back in ``restore_checkpoint()``, so it
survives a server restart with the rest of the training state.
"""

from __future__ import annotations

import importlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .errors import ConfigError
from .numbering import shown_epoch


@dataclass(frozen=True)
class RunInfo:
    """The run a hook is told about before training starts."""

    network: str
    connections: int  # weights + biases, for MCUPS
    mode: str  # "sync", "async" or "sequential"
    epochs: int
    train_frames: int


@dataclass(frozen=True)
class BunchEvent:
    """One weight update: ``updates`` worker bunches summed into one step."""

    epoch: int
    version: int
    updates: int
    patterns: int
    correct: int
    loss_sum: float
    learning_rate: float


@dataclass(frozen=True)
class EpochEvent:
    """One epoch, reported once its cross-validation result is in."""

    epoch: int
    learning_rate: float
    train_patterns: int
    train_correct: int
    cv_frames: int
    cv_correct: int
    cv_loss: float
    kept: bool  # False: the schedule rolled these weights back (newbob)


class Hook:
    """Base class: override the points you need; ``figures`` is shown in /status."""

    name = "hook"

    def before_training(self, info: RunInfo) -> None:
        """Before the first epoch."""

    def before_epoch(self, epoch: int, learning_rate: float) -> None:
        """When an epoch's first frames are leased."""

    def after_bunch(self, event: BunchEvent) -> None:
        """After every weight update."""

    def after_epoch(self, event: EpochEvent) -> None:
        """After an epoch's cross-validation."""

    def after_training(self) -> None:
        """When training is complete (not when stopped early)."""

    def figures(self) -> dict[str, Any]:
        return {}

    def checkpoint_state(self) -> Any:
        """What the hook must keep across a server restart, as plain data (None: nothing)."""
        return None

    def restore_checkpoint(self, state: Any) -> None:
        """Take back what ``checkpoint_state`` gave (when the server resumes)."""


class HookSet:
    """Calls every hook at each point; a hook that raises is switched off."""

    def __init__(self, hooks: list[Hook]) -> None:
        self.hooks = list(hooks)
        self.errors: dict[str, str] = {}

    def call(self, point: str, *args: Any) -> None:
        for hook in list(self.hooks):
            self._guarded(hook, point, *args)

    def figures(self) -> dict[str, Any]:
        """Each hook's figures by name, as plain JSON data; a switched-off hook's error.
        Checked here, where they are taken: every document they go into can be written."""
        out: dict[str, Any] = {}
        for hook in list(self.hooks):
            figures = self._guarded(hook, "figures", then=_plain_json)
            if any(kept is hook for kept in self.hooks):  # not switched off
                out[hook.name] = figures
        for name, error in self.errors.items():
            out[name] = {"error": error, "disabled": True}
        return out

    def checkpoint_state(self) -> dict[str, Any]:
        """Each hook's state that is not None, by name. A state the checkpoint cannot hold
        switches its hook off: else no checkpoint at all could be written."""
        saved = {}
        for hook in list(self.hooks):
            state = self._guarded(hook, "checkpoint_state", then=_checkpointable)
            if state is not None:
                saved[hook.name] = state
        return saved

    def restore_checkpoint(self, saved: dict[str, Any]) -> None:
        for hook in list(self.hooks):
            if hook.name in saved:
                self._guarded(hook, "restore_checkpoint", saved[hook.name])

    def _guarded(
        self, hook: Hook, point: str, *args: Any, then: Callable[[Any], Any] = lambda x: x
    ) -> Any:
        """``hook.point(*args)`` passed through ``then``; None if either raised."""
        try:
            return then(getattr(hook, point)(*args))
        except Exception as exc:  # a user's hook must not stop training
            self.errors[hook.name] = f"{point}: {type(exc).__name__}: {exc}"
            self.hooks.remove(hook)
            return None


def _as_json(value: Any, default: Callable[[Any], Any] | None = None) -> str:
    """``value`` as JSON text; ``TypeError`` saying so if JSON cannot encode it."""
    try:
        return json.dumps(value, default=default)
    except (TypeError, ValueError, RecursionError) as exc:  # ValueError: a circular reference
        raise TypeError(f"JSON cannot encode it: {exc}") from exc


def _plain_json(figures: Any) -> Any:
    """Figures through JSON and back: plain data that /status, /metrics, the dashboard's
    events and status.json can always encode (NaN stays NaN: /status makes it null)."""
    return json.loads(_as_json(figures))


def _checkpointable(state: Any) -> Any:
    """``state`` if a checkpoint can hold it: JSON, and numpy arrays and scalars."""
    _as_json(state, _numpy_as_list)
    return state


def _numpy_as_list(value: Any) -> Any:
    # imported here: `snet status` reads this module (through the progress bar) and has
    # no other use for numpy, whose import is most of that command's start-up
    import numpy as np

    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


class McupsHook(Hook):
    """Million connection updates per second: overall and per epoch (wall clock).

    The overall figure covers the time spent training, up to the last weight update, over
    every life of the server (the checkpoint keeps the patterns and seconds so far): idle
    time after training (``--linger-seconds``, a restart that trained nothing) does not
    dilute it. An epoch's figure is taken when the next one starts or training ends.
    """

    name = "mcups"

    def __init__(self) -> None:
        self.connections = 0
        self.started = 0.0  # this process's training began (before_training)
        self.last_update = 0.0  # this process's latest weight update (0: none yet)
        self.patterns = 0  # applied by this process
        self.earlier_patterns = 0  # applied by the server's earlier lives
        self.earlier_seconds = 0.0  # and the seconds they trained
        self.epoch_started = 0.0
        self.epoch_patterns = 0
        self.per_epoch: list[float] = []

    def before_training(self, info: RunInfo) -> None:
        self.connections = info.connections
        self.started = self.epoch_started = time.perf_counter()

    def before_epoch(self, epoch: int, learning_rate: float) -> None:
        self._close_epoch()
        self.epoch_started = time.perf_counter()

    def after_bunch(self, event: BunchEvent) -> None:
        self.patterns += event.patterns
        self.epoch_patterns += event.patterns
        self.last_update = time.perf_counter()

    def after_training(self) -> None:
        self._close_epoch()  # no next epoch will

    def _close_epoch(self) -> None:
        if self.epoch_patterns:
            seconds = time.perf_counter() - self.epoch_started
            self.per_epoch.append(self._rate(self.epoch_patterns, seconds))
        self.epoch_patterns = 0

    def _rate(self, patterns: int, seconds: float) -> float:
        return round(self.connections * patterns / max(seconds, 1e-9) / 1e6, 3)

    def _totals(self) -> tuple[int, float]:
        """Patterns applied and seconds spent training, over every life of the server."""
        seconds = self.last_update - self.started if self.last_update else 0.0
        return self.earlier_patterns + self.patterns, self.earlier_seconds + seconds

    def figures(self) -> dict[str, Any]:
        patterns, seconds = self._totals()
        return {
            "mcups": self._rate(patterns, seconds) if seconds > 0 else 0.0,
            "per_epoch": self.per_epoch,
        }

    def checkpoint_state(self) -> Any:
        patterns, seconds = self._totals()
        return {"per_epoch": self.per_epoch, "patterns": patterns, "seconds": seconds}

    def restore_checkpoint(self, state: Any) -> None:
        self.per_epoch = [float(rate) for rate in state["per_epoch"]]
        # checkpoints from before these were kept: the overall rate starts anew
        self.earlier_patterns = int(state.get("patterns", 0))
        self.earlier_seconds = float(state.get("seconds", 0.0))


class AccuracyHook(Hook):
    """Training and CV frame accuracy per epoch, and the best CV epoch."""

    name = "accuracy"

    def __init__(self) -> None:
        self.epochs: list[dict[str, Any]] = []

    def after_epoch(self, event: EpochEvent) -> None:
        self.epochs.append(
            {
                "epoch": event.epoch,
                "learning_rate": event.learning_rate,
                "train": round(event.train_correct / max(event.train_patterns, 1), 6),
                "cv": round(event.cv_correct / max(event.cv_frames, 1), 6),
                "kept": event.kept,
            }
        )

    def figures(self) -> dict[str, Any]:
        """Epochs numbered for the reader, from 1 (protocol/numbering.py); the checkpoint
        keeps the 0-based index the events carry."""
        shown = [{**epoch, "epoch": shown_epoch(epoch["epoch"])} for epoch in self.epochs]
        best = max(shown, key=lambda e: e["cv"], default=None)
        return {"epochs": shown, "best_cv_epoch": best["epoch"] if best else None}

    def checkpoint_state(self) -> Any:
        return {"epochs": self.epochs}

    def restore_checkpoint(self, state: Any) -> None:
        self.epochs = [dict(epoch) for epoch in state["epochs"]]


def load_hook(path: str) -> Hook:
    """Build the hook class named ``package.module:ClassName`` (no arguments)."""
    module_name, _, class_name = path.partition(":")
    if not module_name or not class_name:
        raise ConfigError(f"a hook is named package.module:ClassName, got {path!r}")
    try:
        cls = getattr(importlib.import_module(module_name), class_name)
        hook: Hook = cls()
    except Exception as exc:  # the user's module or constructor, whatever it raised: one line
        raise ConfigError(f"cannot load hook {path!r}: {type(exc).__name__}: {exc}") from exc
    for point in ("before_training", "before_epoch", "after_bunch", "after_epoch"):
        if not callable(getattr(hook, point, None)):
            raise ConfigError(f"hook {path!r} has no {point}() (derive from snet Hook)")
    return hook


def standard_hooks(extra: str = "") -> HookSet:
    """The built-in MCUPS and accuracy hooks plus the comma-separated ``extra`` ones."""
    hooks: list[Hook] = [McupsHook(), AccuracyHook()]
    hooks += [load_hook(name.strip()) for name in extra.split(",") if name.strip()]
    return HookSet(hooks)
