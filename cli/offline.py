"""Commands that need no server: ``snet eval``, ``snet train`` and ``snet data convert``."""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from snet.client.network import BunchNetwork
from snet.client.sequential import SequentialResult, train_sequential
from snet.data.corpus import Corpus, corpus_from_source, job_norms, load_corpus, split_frames
from snet.data.kaldi import write_kaldi
from snet.data.pfile import write_pfile
from snet.data.sources import check_against_network, open_source, total_frames
from snet.protocol.errors import DataError
from snet.protocol.hooks import HookSet, standard_hooks
from snet.protocol.job import DataSpec, JobSpec
from snet.protocol.network import initial_weights
from snet.server.export import read_weights, weights_npz, write_atomically
from snet.server.leases import LeaseBook
from snet.server.update_rule import UpdateRule

from .flags import given, given_job
from .settings import build_job, merge, read_toml


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
    )

    def epoch_chunks(epoch: int) -> Iterator[np.ndarray]:
        book.start_epoch(epoch)
        while (lease := book.grant(0)) is not None:
            yield lease.indices
            book.record_applied(book.accept(0, lease.lease_id, 0, len(lease.indices)))

    return epoch_chunks


def train_job(
    job: JobSpec,
    hooks: HookSet | None = None,
    weights: np.ndarray | None = None,
    progress: Callable[[dict[str, float | int | bool]], None] | None = None,
) -> SequentialResult:
    """Sequential training of ``job`` with the server's update rule and frame order and the
    worker's arithmetic (client/sequential.py); the parts meet here, where both may be
    imported."""
    spec = job.network
    corpus = load_corpus(job.data, spec.output_size, spec.input_size)
    rule = UpdateRule(initial_weights(spec, job.seed) if weights is None else weights, job.momentum)
    return train_sequential(job, corpus, rule, lone_worker_chunks(job, corpus), hooks, progress)


def run_eval(args: argparse.Namespace) -> int:
    """Score saved weights on data: frame accuracy and mean cross-entropy."""
    saved = read_weights(args.weights)
    flags = given(args, DataSpec)
    if "context" not in flags and saved.context is not None:
        flags["context"] = saved.context
    spec = merge(DataSpec, {}, "SNET_JOB_DATA_", flags)
    source = open_source(spec)
    network = saved.spec
    check_against_network(source, spec.window, network.input_size, network.output_size)
    train, cv = split_frames(spec, source.lengths)
    if saved.norms is not None and not spec.norm_file:
        norms = saved.norms
        if len(norms.mean) != source.features:
            raise DataError(f"{args.weights} was trained on {len(norms.mean)} features")
    else:
        norms = job_norms(spec, source, train)
    corpus = corpus_from_source(spec, source, norms)
    frames = {"cv": cv, "train": train, "all": np.arange(total_frames(source))}[args.subset]
    scorer = BunchNetwork(network, 1024)
    loss, correct = 0.0, 0
    for start in range(0, len(frames), 8192):
        part = frames[start : start + 8192]
        part_loss, part_correct = scorer.evaluate(
            saved.flat, corpus.windows(part), corpus.labels_of(part)
        )
        loss, correct = loss + part_loss, correct + part_correct
    result = {
        "weights": args.weights,
        "data": source.description,
        "subset": args.subset,
        "frames": len(frames),
        "accuracy": round(correct / max(len(frames), 1), 6),
        "loss": round(loss / max(len(frames), 1), 6),
    }
    if args.json:
        print(json.dumps(result))
    else:
        print(
            f"{args.weights} on {source.description} ({args.subset}, {len(frames)} frames): "
            f"frame accuracy {100 * result['accuracy']:.2f}%, loss {result['loss']:.4f}"
        )
    return 0


def run_train(args: argparse.Namespace) -> int:
    """Sequential training in this process of the job a server would run (the same flags,
    SNET_JOB_* variables and [job] table); writes weights.npz like the server."""
    values, where = read_toml(args.config).table("job")
    job = build_job(values, given_job(args), where)
    weights = read_weights(args.init_weights, job.network).flat if args.init_weights else None

    def show(row: dict[str, float | int | bool]) -> None:
        kept = "" if row["kept"] else "  (rolled back)"
        print(
            f"epoch {int(row['epoch']) + 1:>2}  lr {row['learning_rate']:<8g} "
            f"train {100 * float(row['train_accuracy']):6.2f}%  "
            f"CV {100 * float(row['cv_accuracy']):6.2f}%{kept}",
            flush=True,
        )

    result = train_job(job, standard_hooks(), weights, show)
    spec = job.data
    source = open_source(spec)
    norms = job_norms(spec, source, split_frames(spec, source.lengths)[0])
    path = Path(args.out_dir) / "weights.npz"
    payload = weights_npz(job.network, result.weights, 0, len(result.epochs), norms, spec.context)
    write_atomically(path, payload)
    print(f"weights in {path}")
    return 0


def run_convert(args: argparse.Namespace) -> int:
    """Rewrite a data set as a pfile, an .npz or a Kaldi ark/scp with alignments."""
    source = open_source(DataSpec(source=args.input, labels=args.labels or ""))
    frames = source.read(np.arange(total_frames(source)))
    out = Path(args.output)
    suffix = out.suffix.lower()
    if suffix in (".pfile", ".pf"):
        write_pfile(out, frames, source.labels, source.lengths)
    elif suffix == ".npz":
        np.savez(out, X=frames, y=source.labels, lengths=source.lengths)
    elif suffix == ".ark":
        alignments = out.with_name(out.stem + "-ali.ark")
        write_kaldi(
            str(out),
            str(out.with_suffix(".scp")),
            str(alignments),
            frames,
            source.labels,
            source.lengths,
        )
    else:
        raise DataError(f"cannot write {out}: use .pfile, .npz or .ark")
    print(
        f"{source.description} -> {out}: {len(source.lengths)} utterances, "
        f"{len(frames)} frames of {source.features} features"
    )
    return 0
