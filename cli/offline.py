"""Commands that need no server: ``snet eval`` and ``snet data convert``; and
``train_job``, the sequential training ``snet train`` (cli/train.py) and the benchmarks run."""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import numpy as np

from snet.client.network import BunchNetwork
from snet.client.sequential import SequentialResult, train_sequential
from snet.data.corpus import Corpus, corpus_from_source, job_norms, load_corpus
from snet.data.joined import open_job_source, split_frames
from snet.data.kaldi import write_kaldi
from snet.data.norms import Norms
from snet.data.pfile import write_pfile
from snet.data.sources import (
    check_against_network,
    open_source,
    resolve_source,
    total_frames,
)
from snet.protocol.errors import ConfigError, DataError, ResultsNotWritten
from snet.protocol.hooks import HookSet
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.network import initial_weights
from snet.protocol.numbering import counted
from snet.server.export import SavedWeights, read_weights
from snet.server.leases import LeaseBook
from snet.server.testset import score_test_set
from snet.server.update_rule import UpdateRule

from .flags import given
from .settings import env_name, merge, output_file, refuse_unknown_fields

DISK_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EIO)  # the machine's, not the user's


def lone_worker_chunks(job: JobSpec, corpus: Corpus) -> Callable[[int], Iterator[np.ndarray]]:
    """The frame order a server's ``LeaseBook`` leases to a single worker: each epoch's
    chunks, each taken as done (accepted and applied) once the trainer asks for the next."""
    book = LeaseBook(
        corpus.train_frames,
        corpus.bounds.total_frames,
        job.chunk_frames,
        job.seed,
        cache_frames=job.bunch_size * job.shuffle_cache_bunches,
        sequential=job.frame_order == "sequential",
        epochs=job.epochs,
    )

    def epoch_chunks(epoch: int) -> Iterator[np.ndarray]:
        book.start_epoch(epoch)
        while (lease := book.grant(0)) is not None:
            yield lease.indices
            book.record_applied(book.accept(0, lease.lease_id, 0, len(lease.indices)))

    return epoch_chunks


def start_rule(job: JobSpec, weights: np.ndarray | None = None) -> UpdateRule:
    """The server's update rule for ``job``, from ``weights`` or the job's initial ones."""
    spec = job.network
    return UpdateRule(initial_weights(spec, job.seed) if weights is None else weights, job.momentum)


def train_job(
    job: JobSpec,
    hooks: HookSet | None = None,
    weights: np.ndarray | None = None,
    progress: Callable[[dict[str, float | int | bool]], None] | None = None,
    rule: UpdateRule | None = None,
    corpus: Corpus | None = None,
) -> SequentialResult:
    """Sequential training of ``job`` with the server's update rule and frame order and the
    worker's arithmetic (client/sequential.py); the parts meet here, where both may be
    imported. ``rule``: one made by ``start_rule``, for a caller that must see the
    weights while they train (``snet train`` saves them when stopped); ``corpus``: the
    job's data already opened and normalised (else loaded here)."""
    spec = job.network
    if corpus is None:
        corpus = load_corpus(job.data, spec.output_size, spec.input_size)
    rule = start_rule(job, weights) if rule is None else rule
    return train_sequential(job, corpus, rule, lone_worker_chunks(job, corpus), hooks, progress)


def eval_spec(args: argparse.Namespace, saved: SavedWeights) -> DataSpec:
    """The job's data as saved with the weights, with the data flags given (text, decoded
    by ``settings.merge`` like every flag) and SNET_JOB_DATA_* variables on top. The norm
    file is not taken from the job: the normalisation saved with the weights is used."""
    flags = given(args, DataSpec)
    where = f"{args.weights} (the job's data)"
    # as train, server and demo read them: SNET_JOB_DATA_SOURCEE=x was ignored here
    refuse_unknown_fields("SNET_JOB_DATA_", DataSpec, "job data")
    if saved.data is not None:
        base = {f.name: getattr(saved.data, f.name) for f in fields(DataSpec)}
        base["norm_file"] = ""
        return merge(DataSpec, base, "SNET_JOB_DATA_", flags, where)
    base = {} if saved.context is None else {"context": saved.context}
    spec = merge(DataSpec, base, "SNET_JOB_DATA_", flags, where)
    split = [f for f in fields(DataSpec) if f.name in ("cv_source", "cv_fraction", "split_seed")]
    told = any(f.name in flags or env_name("SNET_JOB_DATA_", f) in os.environ for f in split)
    if args.subset == "cv" and not told:
        print(
            f"snet eval: {args.weights} does not say how its job split the data (written "
            f"before snet saved the split): assuming cv_fraction {spec.cv_fraction:g} and "
            f"split_seed {spec.split_seed}",
            file=sys.stderr,
        )
    return spec


def _eval_norms(args: argparse.Namespace, saved: SavedWeights, spec: DataSpec) -> Norms:
    source = open_job_source(spec)
    if saved.norms is not None and not spec.norm_file:
        if len(saved.norms.mean) != source.features:
            raise DataError(
                f"{args.weights} was trained on {len(saved.norms.mean)} features per frame, "
                f"but {spec.source} has {source.features}: give --data the job's kind of data"
            )
        return saved.norms
    return job_norms(spec, source, split_frames(spec, source.lengths, source.cv_utterances)[0])


def _score(args: argparse.Namespace, saved: SavedWeights, spec: DataSpec) -> dict[str, Any]:
    """Frames scored, accuracy and mean loss of the weights on the chosen subset."""
    network = saved.spec
    norms = _eval_norms(args, saved, spec)
    if args.subset == "test":
        if not spec.test_source:
            raise ConfigError(f"{args.weights}'s job has no test file: name one with --test-data")
        test = open_source(spec.part("test"), "test")
        check_against_network(
            test, spec.window, network.input_size, network.output_size, every_class=False
        )
        # the function the server scores the test file with, so the figures agree
        return score_test_set(network, saved.flat, test, norms, spec.context)
    source = open_job_source(spec)
    # trained weights are scored, whatever classes the data has (a subset is a fair test)
    check_against_network(
        source, spec.window, network.input_size, network.output_size, every_class=False
    )
    corpus = corpus_from_source(spec, source, norms)
    everything = np.arange(total_frames(source))
    frames = {"cv": corpus.cv_frames, "train": corpus.train_frames, "all": everything}
    chosen = frames[args.subset]
    # BunchNetwork: the numpy workers' own arithmetic, so CV figures agree with /status
    scorer = BunchNetwork(network, 1024)
    loss, correct = 0.0, 0
    for start in range(0, len(chosen), 8192):
        part = chosen[start : start + 8192]
        part_loss, part_correct = scorer.evaluate(
            saved.flat, corpus.windows(part), corpus.labels_of(part)
        )
        loss, correct = loss + part_loss, correct + part_correct
    # what the subset's frames are read from: the job's own CV file holds its CV frames,
    # and "all" is the training data and that file (16,000 frames "on X" were X's 6,000
    # and the CV file's 10,000)
    read_from = {"cv": spec.cv_source, "all": " and ".join(p.description for p in source.parts)}
    data = read_from.get(args.subset, "") if spec.cv_source else ""
    if spec.cv_source and args.subset == "cv" and "source" in given(args, DataSpec):
        print(f"snet eval: the CV frames of {args.weights}'s job are its CV file's, "
              f"{spec.cv_source} (--cv-data names another): --subset train scores "
              f"{source.description}", file=sys.stderr)  # fmt: skip
    return {
        "data": data or source.description,
        "frames": len(chosen),
        "accuracy": round(correct / max(len(chosen), 1), 6),
        "loss": round(loss / max(len(chosen), 1), 6),
    }


def run_eval(args: argparse.Namespace) -> int:
    """Score saved weights on the job's CV frames (or test file, training frames, all):
    frame accuracy and mean cross-entropy."""
    saved = read_weights(args.weights)
    spec = eval_spec(args, saved)
    path = resolve_source(spec.source)
    if "source" not in given(args, DataSpec) and not Path(path).exists():
        # the path the weights were trained with, perhaps relative to another folder
        raise DataError(
            f"data {path} does not exist (the data {args.weights} was trained on: --data names it)"
        )
    scored = _score(args, saved, spec)
    result = {"weights": args.weights, "subset": args.subset, **scored}
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.weights} on {result['data']} ({args.subset}, {result['frames']} frames): "
            f"frame accuracy {100 * float(result['accuracy']):.2f}%, loss {result['loss']:.4f}"
        )
    return 0


def run_convert(args: argparse.Namespace) -> int:
    """Rewrite a data set as a pfile, an .npz or a Kaldi ark/scp with alignments. The
    output's name and folder are checked before the input is read (it may be large)."""
    out = output_file(args.output, (".pfile", ".pf", ".npz", ".ark"), "output")
    suffix = out.suffix.lower()
    alignments = out.with_name(out.stem + "-ali.ark")
    outputs = [out, out.with_suffix(".scp"), alignments] if suffix == ".ark" else [out]
    _check_outputs(outputs, [args.input, args.labels or ""], args.force)
    # frames as they are: no windows are cut (with or without lengths)
    source = open_source(DataSpec(source=args.input, context=0, labels=args.labels or ""))
    if total_frames(source) == 0:  # a pfile of none was a traceback (reshaping nothing)
        raise DataError(f"{source.description} has no frames: nothing to convert")
    frames = source.read(np.arange(total_frames(source)))
    before = {path: _stamp(path) for path in outputs}
    try:
        if suffix in (".pfile", ".pf"):
            write_pfile(out, frames, source.labels, source.lengths)
        elif suffix == ".npz":
            np.savez(out, X=frames, y=source.labels, lengths=source.lengths)
        else:
            # The scp names the ark as given: absolute, so that it reads from any folder
            # (a relative name was read against the working directory of whoever trains).
            write_kaldi(
                str(out.resolve()),
                str(out.with_suffix(".scp")),
                str(alignments),
                frames,
                source.labels,
                source.lengths,
            )
    except OSError as exc:  # no permission, a full disk
        # a full disk left a truncated file under the output's name: what this command
        # wrote goes (a file it could not open, someone else's perhaps, stays as it was)
        for path in outputs:
            if _stamp(path) != before[path]:
                path.unlink(missing_ok=True)
        said = f"cannot write {out}: {exc.strerror or exc}"
        if exc.errno in DISK_FULL:  # exit 1, as snet train's weights there: not the input's
            raise ResultsNotWritten(said) from exc
        raise DataError(said) from exc  # a path it cannot use (a directory, no permission): 2
    print(
        f"{source.description} -> {out}: {counted(len(source.lengths), 'utterance')}, "
        f"{counted(len(frames), 'frame')} of {counted(source.features, 'feature')}"
    )
    return 0


def _check_outputs(outputs: list[Path], inputs: list[str], force: bool) -> None:
    """ConfigError for an output that is one of the ``inputs`` (converted onto itself, the
    data was rewritten in place, and lost when the write failed) or, unless ``force``,
    a file that exists (replaced without a word before)."""
    for path in outputs:
        if not path.exists():
            continue
        for named in filter(None, inputs):
            with contextlib.suppress(OSError):
                if path.samefile(named):
                    raise ConfigError(
                        f"the output {path} is the input {named} itself: give the output "
                        "another name (nothing written)"
                    )
        if not force and not path.is_dir():  # a directory cannot be replaced: said on writing
            raise ConfigError(f"{path} exists: --force replaces it (nothing written)")


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """What changes when a file is written (None: there is none)."""
    try:
        stat = path.stat()
    except OSError:
        return None
    return stat.st_ino, stat.st_mtime_ns, stat.st_size
