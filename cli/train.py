"""``snet train``: the job a server would run, trained sequentially in this process.

Everything a user can get wrong is checked before the first epoch, with the server's own
code where the server checks it too: the thread count (a worker's check), the job, the
memory its network needs, the out-dir (locked as a server locks it, so that a server and
``snet train`` never write one out-dir at once, and refused where a server's run is kept),
the initial weights and the data, the test file included (server/dataplan.py). The test
file is scored with the final weights as the server scores it (server/testset.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import fields
from pathlib import Path

import numpy as np

from snet.client.footprint import activations
from snet.data.corpus import corpus_from_source
from snet.data.norms import Norms, write_norm_file
from snet.protocol.errors import (
    ConfigError,
    OutDirUnwritable,
    OutputNotWritten,
    ResultsNotWritten,
    TrainingDiverged,
)
from snet.protocol.hooks import standard_hooks
from snet.protocol.job import JobSpec
from snet.protocol.memory import WORD32, MemoryNeed
from snet.protocol.numbering import shown_epoch
from snet.protocol.process_settings import check_threads
from snet.protocol.schedule import stopped_early
from snet.server.checkpoint import CHECKPOINTS_DIR
from snet.server.dataplan import plan_data
from snet.server.export import NORMS_FILE, STATUS_FILE, WEIGHTS_FILE, read_weights, weights_npz
from snet.server.service import OutDirLock, check_places
from snet.server.testset import describe_test_result, score_test_set
from snet.server.update_rule import UpdateRule
from snet.transport.files import write_atomically
from snet.transport.host_memory import available_bytes

from .flags import given_job
from .offline import start_rule, train_job
from .progress_bar import (
    EXIT_INTERRUPTED,
    EXIT_READER_GONE,
    BarHook,
    ProgressBar,
    detach_stdout,
    say,
)
from .settings import build_job, decode, read_toml, say_unread_tables
from .stop_signals import HungUp, Terminated, raised_on_stop

# What sequential training holds of a network's element (float32 weights and biases): the
# weights, two velocity buffers (server/update_rule.py), the gradient and the fresh buffer
# each step writes, and under newbob its best weights; a bunch's activations on top.
ELEMENT_COPIES = 5


def training_need(job: JobSpec) -> MemoryNeed:
    """About how much memory ``snet train`` needs for ``job``'s network (the workers'
    estimate's words and activations: client/footprint.py)."""
    copies = [(ELEMENT_COPIES, "of the weights, momentum, gradient and step")]
    if job.schedule == "newbob":
        copies.append((1, "of newbob's best weights"))
    return MemoryNeed(WORD32 * job.network.connections, tuple(copies), (activations(job),))


def check_fits_in_memory(job: JobSpec) -> None:
    """Refuse, before allocating anything, a network larger than this machine's available
    memory: numpy would otherwise fail (or the kernel kill the process) part-way into the
    run. A command run in the foreground, it refuses on what is available now, where the
    daemons only warn (their restart would make a brief squeeze final)."""
    need = training_need(job)
    bound = "this machine's available memory"
    refusal = need.refusal(job.network.describe(), "to train", available_bytes(), bound)
    if refusal:
        raise ConfigError(refusal)


def refuse_a_server_run(out_dir: str) -> None:
    """ConfigError when ``out_dir`` holds a server's (or the demo's) run: its weights.npz
    would be replaced by this run's, while its status and checkpoints, which a server or
    the demo shows and resumes, went on describing the other network."""
    # what a server's (or the demo's) run keeps beside its weights (a file named
    # checkpoints, or a directory named status.json, is none: snet train writes neither)
    where = Path(out_dir)
    found = [name for name, there in ((STATUS_FILE, (where / STATUS_FILE).is_file()),
                                      (CHECKPOINTS_DIR, (where / CHECKPOINTS_DIR).is_dir()))
             if there]  # fmt: skip
    if found:
        raise ConfigError(
            f"{out_dir} holds a server's run ({', '.join(found)}): snet train would replace "
            "its weights.npz; give another --out-dir, or remove that run"
        )


def refuse_earlier_weights(out_dir: str, init_weights: str, force: bool) -> None:
    """ConfigError when ``out_dir`` holds an earlier run's weights.npz that this run would
    replace (a rerun started again at epoch 1 and, stopped, replaced a stopped run's 7
    epochs with its 1, without a word: a probe), unless ``force``, or unless this run
    continues from them (``--init-weights`` that very file)."""
    path = Path(out_dir) / WEIGHTS_FILE
    if force or not path.is_file():
        return
    if init_weights and Path(init_weights).resolve() == path.resolve():
        return  # continued: replaced by their own continuation
    raise ConfigError(
        f"{path} holds the weights of an earlier run, which this one would replace: add "
        f"--force to replace them, --init-weights {path} to continue from them, or give "
        "another --out-dir"
    )


def train_threads(args: argparse.Namespace) -> int:
    """--threads, else SNET_TRAIN_THREADS, else 1, checked as a worker's threads are (the
    BLAS limit itself was set before numpy was imported: cli/main.py)."""
    if args.threads is not None:
        return check_threads(args.threads, "--threads")
    text = os.environ.get("SNET_TRAIN_THREADS", "1")
    return check_threads(decode(text, int, "SNET_TRAIN_THREADS"), "SNET_TRAIN_THREADS")


def _save(job: JobSpec, weights: np.ndarray, epochs: int, norms: Norms, out_dir: str) -> Path:
    spec = job.data
    path = Path(out_dir) / WEIGHTS_FILE
    payload = weights_npz(job.network, weights, 0, epochs, norms, spec.context, spec)
    try:
        write_atomically(path, payload)
        write_norm_file(Path(out_dir) / NORMS_FILE, norms)  # as a server's, for Quicknet
    except OSError as exc:  # a full disk: a traceback said so, after the whole training
        raise ResultsNotWritten(
            f"cannot write the trained weights to {path}: {exc.strerror or exc}"
        ) from exc
    return path


def run_train(args: argparse.Namespace) -> int:
    """Train, write OUT_DIR/weights.npz as the server does, score the test file (if any).

    Ctrl-C stops as SIGINT stops a server: the weights trained so far are written (after
    the last whole step; ``--init-weights`` continues from them) unless nothing was
    trained, in one line, with status 130; so does SIGTERM, with status 143, a reader of
    the output that goes (``| head``), with status 141, and an output that cannot be
    written (``> /dev/full``, a full disk: cli/output.py), with status 1."""
    with raised_on_stop():
        return _train(args)


def parallel_settings(job: JobSpec) -> list[str]:
    """The settings of parallel training ``job`` sets away from their defaults (``mode=bmuf``,
    ``compress=int8``): a config shared with a server is welcome, but what of it sequential
    training leaves out is said, not silently dropped."""
    default = JobSpec()
    return [
        f"{setting.name}={getattr(job, setting.name)}"
        for setting in fields(JobSpec)
        if setting.metadata.get("parallel")
        and getattr(job, setting.name) != getattr(default, setting.name)
    ]


def _train(args: argparse.Namespace) -> int:
    train_threads(args)
    document = read_toml(args.config)
    say_unread_tables(document, "train")  # its out_dir, say: the weights went elsewhere
    values, where = document.table("job")
    job = build_job(values, given_job(args), where)
    if unused := parallel_settings(job):  # from [job] or SNET_JOB_*: it has no such flags
        print(f"snet train: trains in one process: {', '.join(unused)} (a server's) not used",
              file=sys.stderr)  # fmt: skip
    check_fits_in_memory(job)
    lock = OutDirLock(args.out_dir, holder="snet train")
    lock.acquire()  # first: a server still running there is named as the holder
    try:
        refuse_a_server_run(args.out_dir)
        check_places(args.out_dir, (WEIGHTS_FILE, NORMS_FILE))  # (a directory: trained, lost)
        refuse_earlier_weights(args.out_dir, args.init_weights or "", args.force)
    except (ConfigError, OutDirUnwritable):
        lock.release()
        raise
    epochs_done = 0
    bar = ProgressBar(sys.stdout)  # on a terminal only: plain lines in pipes and logs

    def show(row: dict[str, float | int | bool]) -> None:
        nonlocal epochs_done
        epochs_done += 1
        kept = "" if row["kept"] else "  (rolled back)"
        bar.print(
            f"epoch {shown_epoch(int(row['epoch'])):>2}  lr {row['learning_rate']:<8g} "
            f"train {100 * float(row['train_accuracy']):6.2f}%  "
            f"CV {100 * float(row['cv_accuracy']):6.2f}%{kept}"
        )

    rule: UpdateRule | None = None
    before = 0  # the epochs the --init-weights held
    first: np.ndarray | None = None  # the weights before the first step
    saved: Path | None = None  # the final weights, once written
    try:
        earlier = read_weights(args.init_weights, job.network) if args.init_weights else None
        weights = earlier.flat if earlier is not None else None
        before = earlier.epoch if earlier is not None else 0  # counted on in weights.npz
        plan = plan_data(job)  # the server's checks of the data and the test file
        hooks = standard_hooks()
        hooks.hooks.append(BarHook(bar))
        rule = start_rule(job, weights)
        first = rule.weights
        # the data as the plan opened and normalised it: loading it again computed the
        # normalisation again, a second pass over every training frame (30 ms for the
        # bundled digits, a read of the whole corpus for a large one)
        corpus = corpus_from_source(job.data, plan.source, plan.norms)
        result = train_job(job, hooks, progress=show, rule=rule, corpus=corpus)
        bar.clear()
        saved = _save(job, result.weights, before + len(result.epochs), plan.norms, args.out_dir)
        if early := stopped_early(job, len(result.epochs)):
            print(early)
        print(f"weights in {saved}")
        if plan.test is not None:
            context = job.data.context
            scored = score_test_set(job.network, result.weights, plan.test, plan.norms, context)
            print(describe_test_result(scored))
    except TrainingDiverged as exc:  # a failure: exit 1, and nothing worth keeping
        bar.clear()
        say(f"snet train: {exc} (no weights written)")
        return 1
    except (KeyboardInterrupt, BrokenPipeError, OutputNotWritten) as exc:
        # Ctrl-C, or the output gone (the reader left, ``| head``, or a full disk):
        # stopped either way, as a server stops on SIGINT, with what was trained kept
        gone = isinstance(exc, (BrokenPipeError, OutputNotWritten))
        if gone or isinstance(exc, HungUp):  # a hung-up terminal fails every write (EIO)
            detach_stdout()
        else:
            bar.clear()
        cause = "(its output's reader has gone)" if gone else "by Ctrl-C"
        cause = f"by {exc.signal_name}" if isinstance(exc, Terminated) else cause
        if isinstance(exc, OutputNotWritten):
            cause = f"(its output cannot be written: {exc})"
        # An epoch's line is printed once the epoch is done: a failed print (or Ctrl-C
        # just then) comes after epoch ``epochs_done``, not in the next one.
        during = (
            f"after epoch {epochs_done}"
            if gone or epochs_done >= job.epochs
            else f"in epoch {epochs_done + 1}"
        )
        where = f"snet train: stopped {cause} {during} of {job.epochs}"
        if saved is not None:  # while the test file was scored
            where = f"snet train: stopped {cause} after training"
            say(f"{where}: weights in {saved}, the test file not scored")
        elif rule is None or rule.weights is first:  # nothing trained: an old file stays
            say(f"{where}: nothing trained, no weights written")
        else:
            path = _save(job, rule.weights, before + epochs_done, plan.norms, args.out_dir)
            say(f"{where}: the weights so far in {path}")
        if isinstance(exc, Terminated):
            return exc.exit_status
        if isinstance(exc, OutputNotWritten):
            return 1  # a failure, where a reader that left is not
        return EXIT_READER_GONE if gone else EXIT_INTERRUPTED
    finally:
        lock.release()
    return 0
