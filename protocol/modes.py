"""The training modes, which job settings each of them reads, and the rule built on that.

A setting of one mode given in another was silently ignored: ``--block-bunches 8`` on a
sync job trained plain sync, and the user who had forgotten ``--mode bmuf`` never learnt
that the flag did nothing. ``MODE_SETTINGS`` names, for every job setting that only some
modes read, the modes that read it, as the code that reads it decides (the comments say
where). A job that sets one away from its default in a mode that does not read it is
refused in one line (``JobSpec`` calls ``ignored_problem``), and so is a staleness policy
that ``POST /control`` asks for at run time (server/staleness.py), by the same rule.

Within a mode, one setting can make it ignore another (``OVERRIDDEN_BY``: blocks of
seconds take no count of bunches); giving both is refused the same way.

A job accepted before this rule (a checkpoint an earlier snet wrote, the welcome of an
older server) is read with such settings at their defaults (``in_use``): they changed
nothing in its mode, so it is the same job, and a run that set one still resumes.

bmuf's two kinds of blocks read different settings, so they are named apart, as
``snet plan --modes`` names them: ``bmuf`` (synchronous blocks) and ``bmuf-async``
(``block_sync`` false, each block filtered as it arrives).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .network import ElementLayout, NetworkSpec
from .numbering import counted

MODES = ("sync", "async", "bmuf", "np")
# The modes whose workers each take a share of the job's bunch when several start together
# (`snet demo`): SNet's data division, a step summing the shares of one global bunch. In bmuf
# every worker trains its copy on whole bunches (local SGD, as Chen & Huo), in np sees each.
SHARED_BUNCH_MODES = ("sync", "async")
BMUF = ("bmuf", "bmuf-async")  # a bmuf job's synchronous and asynchronous blocks

# setting -> the modes (bmuf by its blocks) that read it; any setting not named here is
# read by every mode. Each entry as the code decides it, not as the flag's help says it.
MODE_SETTINGS: dict[str, tuple[str, ...]] = {
    # updates per step: async's step policy alone (server/policies.py AsyncSteps); a sync
    # round takes every worker's update, bmuf a block per worker or each block alone
    "updates_per_step": ("async",),
    # the worker's flow control (client/policies.py AsyncCompute): a sync worker waits for
    # each step, one with async blocks for its last delta's, and np sends no updates
    "max_in_flight": ("async",),
    # only where an update may be applied on newer weights than its own
    # (StepPolicy.stale_updates): sync rounds and sync blocks are always current
    "staleness": ("async", "bmuf-async"),
    # the update codec of workers that choose none: np sends partial outputs, not updates
    "compress": ("sync", "async", *BMUF),
    # the worker's blocks (client/blocks.py) and the server's filter (server/block_filter.py)
    "block_bunches": BMUF,
    "block_seconds": BMUF,
    "block_filter": BMUF,
    "block_momentum": BMUF,
    "block_lr": BMUF,
    "block_sync": BMUF,
    "block_overlap": BMUF,
    # two bunches in flight among the slice holders (server/slice_rounds.py)
    "np_pipeline": ("np",),
}

# The modes whose workers hold the whole network and send updates: their exchange is sure
# to carry a whole float32 element (weights after a resync, an evaluation, an uncompressed
# update or bmuf delta: ``whole_element_bytes``) and a server's trace records their steps
# (``trace_problem``). np's workers hold slices, and its steps are bunches all of them
# take part in.
UPDATE_MODES = ("sync", "async", "bmuf")

# setting -> the one that, once set (not 0), makes the mode ignore it: a block of seconds
# ends by the clock or at its lease's end, whatever block_bunches says (client/blocks.py,
# server/policies.py BlockSteps.update_frames)
OVERRIDDEN_BY = {"block_bunches": "block_seconds"}

NAMES = {
    "sync": "sync mode",
    "async": "async mode",
    "bmuf": "bmuf mode with synchronous blocks",
    "bmuf-async": "bmuf mode with asynchronous blocks (block_sync false)",
    "np": "np mode",
}


def kind(mode: object, block_sync: object) -> object:
    """The name a job of ``mode`` goes by in ``MODE_SETTINGS`` (bmuf: by its blocks)."""
    return "bmuf-async" if mode == "bmuf" and block_sync is False else mode


def _kind_of(settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> object:
    return kind(settings.get("mode"), settings.get("block_sync", defaults["block_sync"]))


def ignored(settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """The settings of a job (``settings``: its values by name, a ``JobSpec``'s fields or
    its dict) that its mode does not read and that differ from ``defaults``, in the
    table's order; a setting the dict lacks is at its default."""
    job = _kind_of(settings, defaults)
    return [
        name
        for name, modes in MODE_SETTINGS.items()
        if (job not in modes or _overridden(name, settings, defaults))
        and settings.get(name, defaults[name]) != defaults[name]
    ]


def _overridden(name: str, settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> bool:
    over = OVERRIDDEN_BY.get(name)
    return over is not None and bool(settings.get(over, defaults[over]))


def in_use(settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """``settings`` with those its mode or its schedule does not read at their defaults:
    the job it trains (how a job an older snet let through is read: a welcome, a
    checkpoint)."""
    unread = [*ignored(settings, defaults), *_schedule_ignored(settings, defaults)]
    return {**settings, **{name: defaults[name] for name in unread}}


def describe(modes: tuple[str, ...]) -> str:
    """The modes as a person reads them: "async mode and bmuf mode with ...", and both
    kinds of bmuf blocks together as plain "bmuf mode"."""
    both = set(BMUF) <= set(modes)
    names = [
        "bmuf mode" if both and mode == "bmuf" else NAMES[mode]
        for mode in modes
        if not (both and mode == "bmuf-async")
    ]
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def block_length(bunches: int, seconds: float) -> str:
    """A bmuf block's length as a person reads it: "16 bunches", or "0.05 s" when it ends
    by the clock (block_seconds)."""
    return f"{seconds:g} s" if seconds else counted(bunches, "bunch", "bunches")


def blocks_said(sync: bool, length: str, overlap: bool) -> str:
    """bmuf's blocks as the demo's banner and ``snet status`` say them: "sync blocks of 16
    bunches, overlapping the exchange" (``length``: ``block_length``'s, or "" unknown)."""
    of = f" of {length}" if length else ""
    return f"{'sync' if sync else 'async'} blocks{of}" + (
        ", overlapping the exchange" if overlap else ""
    )


def shown(value: object) -> str:
    """A setting's value as one types it (``true``, ``16``, ``0.5``, ``bounded:2``)."""
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


# the settings of the newbob learning-rate schedule alone (protocol/schedule.py)
NEWBOB_SETTINGS = ("newbob_scale", "newbob_ramp", "newbob_stop")


def _schedule_ignored(settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> list[str]:
    """Newbob's settings away from their defaults in a job of another schedule."""
    if settings.get("schedule", defaults["schedule"]) == "newbob":
        return []
    return [n for n in NEWBOB_SETTINGS if settings.get(n, defaults[n]) != defaults[n]]


def _schedule_problem(settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """A setting of another schedule than the job's, away from its default ("" if none):
    ``--newbob-stop 3`` under the list schedule was accepted and changed nothing."""
    unread = _schedule_ignored(settings, defaults)
    if not unread:
        return ""
    name, schedule = unread[0], settings.get("schedule", defaults["schedule"])
    return (
        f"{name} {shown(settings[name])} applies to the newbob schedule only, and this job's "
        f"schedule is {schedule}, which would ignore it (leave it at its default, "
        f"{shown(defaults[name])}, or give --schedule newbob)"
    )


def ignored_problem(settings: Mapping[str, Any], defaults: Mapping[str, Any]) -> str:
    """Why a job cannot be run as given ("" if it can): a setting its mode would ignore,
    named first (the command line says it as the user gave it: cli/settings.py), with
    the modes that read it and the job's mode; any others its mode ignores after it; or
    a setting of another learning-rate schedule than its own."""
    if problem := _schedule_problem(settings, defaults):
        return problem
    names = ignored(settings, defaults)
    if not names:
        return ""
    first, *more = names
    job = _kind_of(settings, defaults)
    also = "".join(f"; {name} {shown(settings[name])} is ignored there too" for name in more)
    if job in MODE_SETTINGS[first]:  # read by its mode, but overridden by another setting
        over = OVERRIDDEN_BY[first]
        return (
            f"{first} {shown(settings[first])} is ignored when {over} is set ({over} "
            f"{shown(settings[over])}: a block ends by the clock, or at its lease's end); "
            f"give one of them (leave it at its default, {shown(defaults[first])}{also})"
        )
    modes = MODE_SETTINGS[first]
    # bmuf's kinds of blocks are named apart only where the setting tells them apart
    split = len(set(BMUF) & set(modes)) == 1
    mode = NAMES[str(job)] if split and job in BMUF else f"{settings.get('mode')} mode"
    return (
        f"{first} {shown(settings[first])} applies to {describe(modes)} only, and this job "
        f"is in {mode}, which would ignore it (leave it at its default, "
        f"{shown(defaults[first])}{also})"
    )


def trace_problem(mode: str) -> str:
    """Why a server training in ``mode`` cannot write a trace ("" if it can)."""
    if mode in UPDATE_MODES:
        return ""
    return (
        f"trace_file: {mode} mode writes no trace yet (its steps are bunches all holders "
        "take part in, not updates): leave it out, or train in another mode"
    )


def whole_element_bytes(network: NetworkSpec, mode: str) -> int:
    """The payload of a whole float32 element of ``network`` if ``mode``'s exchange
    carries one (``UPDATE_MODES``), which a frame limit must then hold; else 0."""
    return ElementLayout.for_network(network).nbytes if mode in UPDATE_MODES else 0
