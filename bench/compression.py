"""Benchmark of compressed updates: bytes, accuracy, and epoch time on a slow link.

::

    python -m bench.compression accuracy [--repeats N]   # any user
    python -m bench.compression slowlink                 # root: network namespaces

``accuracy``: the default job (FSDD, 117:512:10, 10 epochs, async) with 4 workers, once per
update codec; for each, the bytes per update frame and the ratio to float32 (both from the
server's compression ledger, whole frames), and the final CV accuracy against ``none``'s.
Each run's step trace is kept beside it (``--workdir``): ``bench/replay.py`` replays one
deterministically, with any codec.

``slowlink``: the server and 4 workers in network namespaces whose links are shaped to
100 Mbit/s (see netns.py), a 351:1262:45 network (2.0 MB elements) on synthetic frames
(39 features, context 4, 45 classes); the mean epoch time with and without compression.

Every figure is measured in the same run; the tables are printed as Markdown.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from .netns import SERVER_ADDRESS, SlowNetwork

UPDATE_CODECS = ("none", "fp16", "int8", "sign", "topk:0.01", "powersgd:4")
SLOW_RUNS = (  # (update codec, weights form)
    ("none", "none"),
    ("sign", "none"),
    ("sign", "delta:int8"),
    ("topk:0.01", "delta:int8"),
)
SNET = [sys.executable, "-m", "snet.cli"]
Wrap = Callable[[str, list[str]], list[str]]


def _plain(namespace: str, args: list[str]) -> list[str]:
    return args


def train(
    workdir: Path,
    job: list[str],
    workers: int,
    worker_args: list[str],
    wrap: Wrap = _plain,
    host: str = "127.0.0.1",
    port: int = 0,
    namespaces: tuple[str, list[str]] | None = None,
    timeout: float = 1800.0,
) -> dict[str, Any]:
    """Run a server and ``workers`` workers to the end; the server's final status.json."""
    workdir.mkdir(parents=True, exist_ok=True)
    ready = workdir / "ready.json"
    server_ns, worker_ns = namespaces or ("", [""] * workers)
    server_args = [
        *SNET, "server", "--host", host, "--port", str(port), "--http-port", "0",
        "--ready-file", str(ready), "--out-dir", str(workdir / "out"), "--log-level", "warning",
        *job,
    ]  # fmt: skip
    logs = []
    processes = []
    try:
        log = open(workdir / "server.log", "wb")  # noqa: SIM115 - closed below
        logs.append(log)
        server = subprocess.Popen(wrap(server_ns, server_args), stdout=log, stderr=log)
        processes.append(server)
        deadline = time.monotonic() + 60
        while not ready.exists():
            if server.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"server did not start: {(workdir / 'server.log').read_text()}")
            time.sleep(0.1)
        address = f"{host}:{json.loads(ready.read_text())['port']}"
        for index in range(workers):
            log = open(workdir / f"worker{index}.log", "wb")  # noqa: SIM115
            logs.append(log)
            args = [*SNET, "worker", "--server", address, "--name", f"w{index + 1}"]
            args += ["--log-level", "warning", *worker_args]
            processes.append(subprocess.Popen(wrap(worker_ns[index], args), stdout=log, stderr=log))
        if server.wait(timeout) != 0:
            raise RuntimeError(f"server failed: {(workdir / 'server.log').read_text()[-2000:]}")
        for process in processes[1:]:
            process.wait(60)
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
        for log in logs:
            log.close()
    status: dict[str, Any] = json.loads((workdir / "out" / "status.json").read_text())
    return status


# ---------------------------------------------------------------- accuracy and bytes


def accuracy(workdir: Path, repeats: int, epochs: int, codecs: list[str]) -> str:
    """The table of bytes and CV accuracy per codec (``none`` first: the reference)."""
    codecs = ["none", *(c for c in codecs if c != "none")]
    rows: dict[str, list[dict[str, Any]]] = {codec: [] for codec in codecs}
    for repeat in range(repeats):
        for codec in codecs:
            run = workdir / f"acc-{codec.replace(':', '_')}-{repeat}"
            job = ["--mode", "async", "--epochs", str(epochs), "--compress", codec]
            job += ["--trace-file", str(run / "trace.jsonl")]  # replayable: bench/replay.py
            status = train(run, job, 4, [])
            rows[codec].append(status)
            print(
                f"  {codec:<11} run {repeat + 1}: CV {100 * status['cv_accuracy']:.2f}% "
                f"(epoch 1: {100 * status['epochs'][0]['cv_accuracy']:.2f}%), "
                f"{status['compression']['bytes_per_update']} B/update",
                file=sys.stderr,
                flush=True,
            )
    none_bytes = statistics.mean(s["compression"]["bytes_per_update"] for s in rows["none"])
    none_cv = statistics.mean(100 * s["cv_accuracy"] for s in rows["none"])
    lines = [
        "| codec | bytes per update | ratio to float32 | final CV accuracy | vs none |",
        "|---|---:|---:|---:|---:|",
    ]
    for codec, statuses in rows.items():
        per_update = statistics.mean(s["compression"]["bytes_per_update"] for s in statuses)
        cvs = [100 * s["cv_accuracy"] for s in statuses]
        cv = statistics.mean(cvs)
        spread = f" ({min(cvs):.2f}-{max(cvs):.2f})" if len(cvs) > 1 else ""
        lines.append(
            f"| `{codec}` | {per_update:,.0f} | {none_bytes / per_update:.1f}x | "
            f"{cv:.2f}%{spread} | {cv - none_cv:+.2f} |"
        )
    return "\n".join(lines)


# ---------------------------------------------------------------- the slow link


def synthetic_frames(path: Path, utterances: int = 400, length: int = 25) -> None:
    """Frames of 39 features in 45 classes: a mean per class, noise, a drift per utterance."""
    rng = np.random.default_rng(0)
    means = rng.standard_normal((45, 39)).astype(np.float32)
    labels = rng.integers(0, 45, size=utterances)
    frames = []
    for label in labels:
        drift = 0.5 * rng.standard_normal(39)
        frames.append(means[label] + drift + 1.5 * rng.standard_normal((length, 39)))
    np.savez(
        path,
        X=np.concatenate(frames).astype(np.float32),
        y=labels,
        lengths=np.full(utterances, length),
    )


def slowlink(workdir: Path, epochs: int, rate: str) -> str:
    data = workdir / "synthetic-351-45.npz"
    synthetic_frames(data)
    lines = [
        "| updates | weights | update frame | weights frame | MB per epoch into / out of "
        "the server | mean epoch time | speed-up | final CV accuracy |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    baseline = None
    with SlowNetwork(4, rate) as network:
        for codec, weights in SLOW_RUNS:
            run = workdir / f"slow-{codec.replace(':', '_')}-{weights.replace(':', '_')}"
            job = [
                "--mode", "async", "--epochs", str(epochs), "--network", "351:1262:45",
                "--data", str(data), "--context", "4", "--chunk-frames", "1024",
            ]  # fmt: skip
            status = train(
                run,
                job,
                4,
                ["--compress", codec, "--weights-codec", weights, "--retry-seconds", "60"],
                wrap=network.command,
                host=SERVER_ADDRESS,
                port=7000,
                namespaces=(network.server, network.worker_namespaces),
            )
            seconds = [e["seconds"] for e in status["epochs"][1:]]  # epoch 1 includes start-up
            epoch = statistics.mean(seconds)
            baseline = baseline or epoch
            total = status["compression"]
            copies = max(sum(r["compression"]["weights_sent"] for r in status["workers"]), 1)
            up, down = (
                total[key] / len(status["epochs"]) / 1e6 for key in ("received_bytes", "sent_bytes")
            )
            lines.append(
                f"| `{codec}` | `{weights}` | {total['bytes_per_update']:,} B | "
                f"{total['sent_bytes'] / copies:,.0f} B | {up:.0f} / {down:.0f} | "
                f"{epoch:.1f} s | {baseline / epoch:.1f}x | {100 * status['cv_accuracy']:.2f}% |"
            )
            print(f"  {codec}/{weights}: {seconds}", file=sys.stderr, flush=True)
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("part", choices=("accuracy", "slowlink", "all"))
    parser.add_argument("--repeats", type=int, default=1, help="accuracy: runs per codec")
    parser.add_argument(
        "--codecs", default=",".join(UPDATE_CODECS), help="accuracy: comma-separated codecs"
    )
    parser.add_argument("--epochs", type=int, default=10, help="accuracy: epochs per run")
    parser.add_argument("--slow-epochs", type=int, default=3, help="slowlink: epochs per run")
    parser.add_argument("--rate", default="100mbit", help="slowlink: tc tbf rate")
    parser.add_argument("--workdir", help="keep logs and outputs here (default: a temp dir)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="snet-bench-") as temporary:
        workdir = Path(args.workdir or temporary)
        workdir.mkdir(parents=True, exist_ok=True)
        if args.part in ("accuracy", "all"):
            print(f"## Accuracy and bytes ({args.epochs} epochs, async, 4 workers)\n")
            codecs = args.codecs.split(",")
            print(accuracy(workdir, args.repeats, args.epochs, codecs), flush=True)
        if args.part in ("slowlink", "all"):
            print(f"\n## Epoch time over a {args.rate} link (351:1262:45, async, 4 workers)\n")
            print(slowlink(workdir, args.slow_epochs, args.rate), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
