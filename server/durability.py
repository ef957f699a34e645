"""What a restart resumes from (the checkpoints are taken and written by
server/checkpointer.py).

``resume_point``: what ``snet server`` starts from: the newest whole checkpoint of the
same job (network, settings, a setting added since the checkpoint was written or one its
mode does not read taken at its default, and a fingerprint of the data), nothing with
``--fresh`` (which refuses to discard a finished run's results without ``--force``), and
a one-line ``ConfigError`` for a checkpoint of another job. Nor does a fresh start
overwrite the results of a run it cannot resume (``snet train``'s, or a server's whose
checkpoints are gone) without ``--fresh --force``.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from snet.protocol.errors import ConfigError
from snet.protocol.job import JobSpec
from snet.protocol.modes import in_use, shown
from snet.transport.files import unfinished_writes

from .checkpoint import CheckpointStore, LoadedCheckpoint
from .export import STATUS_FILE, WEIGHTS_FILE, read_status

if TYPE_CHECKING:
    from .config import ServerConfig

log = logging.getLogger("snet.server")


def _settings(job: dict[str, Any]) -> dict[str, Any]:
    """A job's settings by name, a nested table's as ``table.key`` (``data.split_seed``),
    so that a message names the setting that differs, not the whole table."""
    flat: dict[str, Any] = {}
    for key, value in job.items():
        if isinstance(value, dict) and "sizes" not in value:  # a network stays whole
            flat.update({f"{key}.{inner}": item for inner, item in value.items()})
        else:
            flat[key] = value
    return flat


def _setting(value: object) -> str:
    """A job setting as a person reads it (a network: sizes, activations; not sizes alone)."""
    if isinstance(value, dict) and "sizes" in value:  # "117:1024:10 there, here" hid a tanh
        return " ".join([":".join(map(str, value["sizes"])), *value.get("activations", [])])
    if value is None:
        return "(none)"
    # as typed (true, not True), but every digit of a float: two that differ must read so
    text = repr(value) if isinstance(value, str | float) else shown(value)
    return text if len(text) <= 60 else text[:57] + "..."


def job_identity(
    job_dict: dict[str, Any], data_fingerprint: str, labels: str = ""
) -> dict[str, Any]:
    """What a checkpoint must match to be resumed: the job (as JSON) and the data (its
    shape, split and normalisation; and ``labels``, the labels' digest, apart: checkpoints
    written before it was kept hold none, and still resume)."""
    return {"job": json.loads(json.dumps(job_dict)), "data": data_fingerprint, "labels": labels}


# Settings a run changes while it trains (POST /control): not part of what a checkpoint
# must match. A restart's command that gives another one puts it in force (resume.py); a
# refusal, "staleness 'none' there", named the command that was, not the policy in force.
RUN_TIME_SETTINGS = ("staleness",)


def _without_run_time_settings(job: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in job.items() if key not in RUN_TIME_SETTINGS}


def _as_of_now(job: dict[str, Any]) -> dict[str, Any]:
    """A saved job with the settings added since it was written at their defaults: a
    checkpoint from before a setting existed (``np_pipeline``, say) is of the same job as
    one that leaves the setting at its default, and still resumes. So are the settings
    its mode never read (``block_bunches`` of a sync job, which snet refuses since, and
    which had changed nothing: protocol/modes.py), or its run could not be resumed."""
    defaults = json.loads(json.dumps(JobSpec().to_dict()))
    return in_use({**defaults, **job}, defaults)


class OtherJob(ConfigError):
    """The out-dir's checkpoint is of another job: ``differing`` names the job's settings
    that differ (a command that chose one of them itself can say so: snet demo)."""

    def __init__(self, message: str, differing: list[str]) -> None:
        super().__init__(message)
        self.differing = differing


def resume_point(
    config: ServerConfig, store: CheckpointStore, identity: dict[str, Any]
) -> LoadedCheckpoint | None:
    """The checkpoint to resume from, or None to start a fresh run (raises ConfigError)."""
    store.remove_leftovers()
    _remove_unfinished_results(Path(config.out_dir))
    try:
        loaded = store.newest()
    except ConfigError:  # a checkpoint it cannot read: --fresh starts over all the same
        if not config.fresh:
            raise
        loaded = None
    if config.fresh or loaded is None:
        finished = _finished_run(config, loaded)
        if finished and not (config.fresh and config.force):
            advice = (
                "--fresh would overwrite them: add --force" if config.fresh
                else "and no checkpoint to resume: a fresh run would overwrite them: "
                "--fresh --force to do so"
            )  # fmt: skip
            raise ConfigError(f"{config.out_dir} holds the results of {finished}; {advice}, "
                              "or choose another --out-dir")  # fmt: skip
        if config.fresh:
            store.clear()
        return None
    saved = loaded.state
    job = saved.get("job")
    theirs, ours = (
        _without_run_time_settings(_as_of_now(job)) if isinstance(job, dict) and job else {},
        _without_run_time_settings(_as_of_now(identity["job"])),
    )
    if theirs != ours:
        there, here = _settings(theirs), _settings(ours)
        differing = sorted(k for k in {*there, *here} if there.get(k) != here.get(k))
        shown = "; ".join(
            f"{key} {_setting(there.get(key))} there, {_setting(here.get(key))} here"
            for key in differing[:3]
        ) + ("; ..." if len(differing) > 3 else "")
        raise OtherJob(
            f"{loaded.path} is a checkpoint of another job ({shown}): use "
            f"{_start_over(config, loaded)} to start over, or another --out-dir",
            differing,
        )
    if saved.get("data") != identity["data"]:
        raise ConfigError(
            f"{loaded.path} is a checkpoint of the same job on other data (the data's "
            f"fingerprint differs): use {_start_over(config, loaded)} to start over, or "
            "another --out-dir"
        )
    if saved.get("labels") and identity.get("labels") and saved["labels"] != identity["labels"]:
        raise ConfigError(
            f"{loaded.path} is a checkpoint of the same job on other data (its frames have "
            f"other labels: digest {saved['labels']} there, {identity['labels']} here): use "
            f"{_start_over(config, loaded)} to start over, or another --out-dir"
        )
    store.set_aside_newer(loaded)  # resumed: the damaged ones newer are out of the count
    if config.init_weights:  # documented, but a user who gave it should hear it too
        log.warning("--init-weights %s not used: resuming the run checkpointed in %s "
                    "(--fresh starts over from those weights)", config.init_weights,
                    loaded.path)  # fmt: skip
    return loaded


def _start_over(config: ServerConfig, loaded: LoadedCheckpoint) -> str:
    """The flags that start anew on ``config``'s out-dir: a finished run's results are
    overwritten only with --force too (the advice "--fresh" was then refused in turn)."""
    return "--fresh --force" if _finished_run(config, loaded) else "--fresh"


def _finished_run(config: ServerConfig, loaded: LoadedCheckpoint | None) -> str:
    """The run whose results are in the out-dir (its newest checkpoint ``loaded``), and
    why it is taken for one, when a fresh start would overwrite them ("" if none)."""
    coordinator = loaded.state.get("coordinator") if loaded is not None else None
    if loaded is not None and isinstance(coordinator, dict) and coordinator.get("finished"):
        return f"a finished run (checkpoint {loaded.path.name} of a completed training)"
    status, said = Path(config.out_dir) / STATUS_FILE, read_status(Path(config.out_dir))
    trained, applied = said.get("state") == "trained", bool(said.get("updates_applied"))
    if trained:
        return f"a finished run ({status} says trained)"
    weights = Path(config.out_dir) / WEIGHTS_FILE
    if loaded is not None or not weights.is_file():
        return ""  # a checkpoint resumes the run; or there are no results to overwrite
    if applied:  # a server's that trained, its checkpoints gone (a stopped one's are kept)
        return f"a stopped run ({weights}; {status.name}: updates applied)"
    # a server stopped before it trained wrote its initial weights, nothing to lose
    return "" if status.exists() else f"a finished run ({weights}: snet train's, say)"


def _remove_unfinished_results(out_dir: Path) -> None:
    """The temporary files of results whose write a kill cut short (.weights.npz.XXXXXXXX,
    266 kB each, stayed for good: the checkpoints' were removed); the out-dir is this
    server's (locked) by now."""
    for name in (WEIGHTS_FILE, STATUS_FILE):
        for path in unfinished_writes(out_dir, name):
            log.info("removing %s: results whose write was cut short", path.name)
            path.unlink(missing_ok=True)
