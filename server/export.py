"""Trained weights as a self-describing ``.npz``: W0, b0, W1, b1, ... plus the layer sizes.

Besides the weights the file holds ``sizes``, ``activations``, ``version``, ``epoch`` and,
when known, the normalisation the network was trained with (``norm_mean``, ``norm_std``),
the ``context`` and the job's data description (``data_spec``, JSON: the files, the
train/CV split and the test file), so ``snet eval`` scores the job's own CV frames
without being told the split, and ``snet server --init-weights`` can continue from it.
"""

from __future__ import annotations

import io
import json
import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from snet.data.archive import ARCHIVE_ERRORS, open_npz
from snet.data.norms import Norms, write_norm_file
from snet.protocol.errors import ConfigError
from snet.protocol.job import DataSpec
from snet.protocol.network import ElementLayout, NetworkSpec
from snet.transport.files import write_atomically

from .testset import describe_test_result, score_test_set

if TYPE_CHECKING:
    from concurrent.futures import Executor

    from .training import Coordinator

log = logging.getLogger("snet.server")
STATUS_FILE = "status.json"  # the results document beside weights.npz in the out-dir
WEIGHTS_FILE = "weights.npz"  # a run's results: the final weights (snet train's too)
NORMS_FILE = "norms"  # the normalisation beside them, in Quicknet's norm-file format


def weights_npz(
    spec: NetworkSpec,
    flat: np.ndarray,
    version: int,
    epoch: int,
    norms: Norms | None = None,
    context: int | None = None,
    data: DataSpec | None = None,
) -> bytes:
    """The weights as the bytes of an .npz file."""
    views = ElementLayout.for_network(spec).views(np.asarray(flat))
    arrays: dict[str, Any] = {
        "sizes": np.array(spec.sizes, dtype=np.int64),
        "activations": np.array(spec.activations, dtype=str),
        "version": np.array(version, dtype=np.int64),
        "epoch": np.array(epoch, dtype=np.int64),
    }
    if norms is not None:
        arrays["norm_mean"], arrays["norm_std"] = norms.mean, norms.std
    if context is not None:
        arrays["context"] = np.array(context, dtype=np.int64)
    if data is not None:
        arrays["data_spec"] = np.array(json.dumps(asdict(data)))
    for layer in range(len(views) // 2):
        arrays[f"W{layer}"] = views[2 * layer]
        arrays[f"b{layer}"] = views[2 * layer + 1]
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def current_weights_npz(coordinator: Coordinator) -> bytes:
    """The coordinator's current weights, normalisation and context as an .npz; its
    ``epoch`` counts the whole epochs trained, as ``snet train``'s does (it had been the
    0-based index of the epoch in progress: 0 after a run of one epoch)."""
    return weights_npz(
        coordinator.job.network,
        coordinator.rule.model,
        coordinator.version,
        coordinator.stats.epochs_done,
        coordinator.plan.norms,
        coordinator.job.data.context,
        coordinator.job.data,
    )


@dataclass
class SavedWeights:
    """What a weights file holds."""

    spec: NetworkSpec
    flat: np.ndarray  # the element (float32)
    version: int
    norms: Norms | None
    context: int | None
    data: DataSpec | None  # the job's data and split (None in files written before it)
    epoch: int = 0  # the whole epochs trained into them (0 in files written without it)


def read_weights(path: str | Path, expected: NetworkSpec | None = None) -> SavedWeights:
    """Read a weights .npz; with ``expected``, refuse a file of another network."""
    try:
        with open_npz(path) as data:
            if not {"sizes", "activations"} <= set(data.files):  # e.g. a data set's .npz
                raise ValueError(
                    f"not a file of snet weights (it holds {', '.join(data.files[:6]) or 'nothing'}"
                    ", not sizes, activations, W0, b0, ...)"
                )
            spec = NetworkSpec(
                tuple(int(s) for s in data["sizes"]),
                tuple(str(a) for a in data["activations"]),
            )
            layout = ElementLayout.for_network(spec)
            flat = layout.allocate()
            for view, (layer, kind) in zip(
                layout.views(flat),
                [(i, k) for i in range(len(spec.sizes) - 1) for k in ("W", "b")],
                strict=True,
            ):
                array = data[f"{kind}{layer}"]
                if array.shape != view.shape:
                    raise ValueError(f"{kind}{layer} has shape {array.shape}, not {view.shape}")
                view[...] = array
            norms = (
                Norms(data["norm_mean"].astype(np.float64), data["norm_std"].astype(np.float64))
                if "norm_mean" in data.files
                else None
            )
            context = int(data["context"]) if "context" in data.files else None
            version = int(data["version"]) if "version" in data.files else 0
            epoch = max(int(data["epoch"]), 0) if "epoch" in data.files else 0
            data_spec = (
                DataSpec(**json.loads(str(data["data_spec"])))
                if "data_spec" in data.files
                else None
            )
    except (*ARCHIVE_ERRORS, TypeError) as exc:
        raise ConfigError(f"cannot read weights from {path}: {exc}") from exc
    if not np.isfinite(flat).all():
        raise ConfigError(f"{path}: the weights contain NaN or infinite values")
    if expected is not None and spec != expected:
        raise ConfigError(
            f"{path} holds a {spec.describe()} network ({', '.join(spec.activations)}), "
            f"the job trains {expected.describe()} ({', '.join(expected.activations)})"
        )
    return SavedWeights(spec, flat, version, norms, context, data_spec, epoch)


def write_final_files(
    out_dir: Path, coordinator: Coordinator, document: dict[str, Any], start: int | None,
    written: int | None,
) -> Path:  # fmt: skip
    """Write ``out_dir``'s weights.npz, norms and status.json (``document``: /status's);
    the weights' path. Left as they are: the weights this server wrote at this version
    already (at completion: said again at its stop for nothing), and, when it resumed a
    run at ``start`` and trained nothing since (``start`` None: ``--fresh``), the weights
    and the status.json that run wrote if they are of the weights held (a ``--fresh`` run
    writes its own, or the directory would hold one run's weights beside another's
    status)."""
    again = coordinator.version == written  # said at its completion: not again at its stop
    untouched = coordinator.version == start
    path = out_dir / WEIGHTS_FILE
    # what it resumed from is checked against the file: a server killed after a later
    # checkpoint left an older weights.npz (version 1100 beside a run trained to 1911)
    if path.exists() and (again or (untouched and _holds(path, coordinator))):
        if not again:
            log.info("trained nothing since it started: %s left as it is", path)
    else:
        write_atomically(path, current_weights_npz(coordinator))
        log.info("final weights (version %d, digest %s) written to %s",
                 coordinator.version, coordinator.digest, path)  # fmt: skip
    write_norm_file(out_dir / NORMS_FILE, coordinator.plan.norms)
    status = out_dir / STATUS_FILE
    if untouched and _describes(read_status(out_dir), coordinator):
        # trained nothing: the status.json of the run that trained these weights stays its
        # record (rewritten, its workers were "left (server restarted)", its checkpoint
        # and compression counts 0: this server's, not the run's)
        if not again:
            log.info("trained nothing since it started: %s left as it is", status)
        return path
    if coordinator.finished.is_set():  # not "stopping": what the run came to, and why
        document = {**document, "state": "trained", "stop_reason": "trained"}
    write_atomically(status, json.dumps(document, indent=1).encode())
    return path


async def score_test_file(
    coordinator: Coordinator, executor: Executor, out_dir: Path | None
) -> dict[str, Any]:
    """The job's test file scored with the final weights (the model's: bmuf's block filter
    keeps them apart from the snapshot sent), said in the log and added to the
    status.json in ``out_dir`` (None: nothing written there)."""
    import asyncio  # (here: snet train reads weights with this module, and no event loop)

    plan, job = coordinator.plan, coordinator.job
    assert plan.test is not None
    result: dict[str, Any] = await asyncio.get_running_loop().run_in_executor(
        executor, score_test_set, job.network, coordinator.rule.model, plan.test, plan.norms,
        job.data.context,
    )  # fmt: skip
    log.info("%s", describe_test_result(result))
    if out_dir is not None:  # (two fsyncs: not on the event loop)
        await asyncio.get_running_loop().run_in_executor(
            executor, _add_test_result, out_dir, coordinator, result
        )
    return result


def _add_test_result(out_dir: Path, coordinator: Coordinator, result: dict[str, Any]) -> None:
    """The test file's score into the status.json of the weights held, once scored: it is
    scored after the results are written, and reached the file only at a graceful stop
    (a kill while serving the results lost it, and a restart scored it again for /status
    alone: a probe). A failure to write is said, and the run goes on."""
    said = read_status(out_dir)
    if not _describes(said, coordinator) or said.get("test") == result:
        return
    try:
        write_atomically(
            out_dir / STATUS_FILE, json.dumps({**said, "test": result}, indent=1).encode()
        )
    except OSError as exc:
        log.warning("cannot add the test file's score to %s: %s", out_dir / STATUS_FILE, exc)


def read_status(out_dir: Path) -> dict[str, Any]:
    """The status.json in ``out_dir`` as written ({} when there is none, or it is not a
    JSON table)."""
    try:
        said = json.loads((out_dir / STATUS_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return said if isinstance(said, dict) else {}


def _describes(said: dict[str, Any], coordinator: Coordinator) -> bool:
    """Whether ``said`` (a status.json, ``read_status``) was written of the weights the
    coordinator holds: their version and digest (not one a server killed later left)."""
    return bool(said.get("weight_version") == coordinator.version
                and said.get("weights_digest") == coordinator.digest)  # fmt: skip


def _holds(path: Path, coordinator: Coordinator) -> bool:
    """Whether the weights file ``path`` holds the coordinator's weights: their version
    and values (the model's, which bmuf's block filter keeps apart from its snapshot)."""
    try:
        saved = read_weights(path, coordinator.job.network)
    except (OSError, ValueError, KeyError, ConfigError):
        return False
    model = np.asarray(coordinator.rule.model, dtype=np.float32)
    return saved.version == coordinator.version and np.array_equal(saved.flat, model)
