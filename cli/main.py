"""``snet``: server, worker, spert, status, plan and demo subcommands."""

from __future__ import annotations

import argparse
import os
import sys

# Nothing imported here may import numpy: a worker's BLAS thread count is fixed by
# limit_blas_threads() in main(), and BLAS reads it once, when numpy is first imported
# (with two BLAS threads per worker on two cores, the demo ran ten times slower).
from .runtime import limit_blas_threads


def _add_job_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("job (what to train; also [job] in the TOML file)")
    group.add_argument("--mode", choices=("sync", "async"))
    group.add_argument("--epochs", type=int)
    group.add_argument("--network", help='layer sizes, e.g. "117:512:10"')
    group.add_argument("--activation", choices=("sigmoid", "tanh", "relu"))
    group.add_argument(
        "--bunch-size", dest="bunch_size", type=int, help="patterns per worker update"
    )
    group.add_argument(
        "--learning-rates",
        dest="learning_rates",
        help="comma-separated rate per epoch (the last one repeats)",
    )
    group.add_argument("--momentum", type=float)
    group.add_argument(
        "--updates-per-step",
        dest="updates_per_step",
        type=int,
        help="async: updates per step (0: one per live worker)",
    )
    group.add_argument("--max-in-flight", dest="max_in_flight", type=int)
    group.add_argument("--chunk-frames", dest="chunk_frames", type=int)
    group.add_argument("--seed", type=int)
    group.add_argument("--schedule", choices=("list", "newbob"), help="learning-rate schedule")
    group.add_argument("--newbob-scale", dest="newbob_scale", type=float)
    group.add_argument("--newbob-ramp", dest="newbob_ramp", type=float, help="CV error points")
    group.add_argument("--newbob-stop", dest="newbob_stop", type=float, help="CV error points")
    group.add_argument("--frame-order", dest="frame_order", choices=("shuffled", "sequential"))
    group.add_argument("--shuffle-cache-bunches", dest="shuffle_cache_bunches", type=int)
    group.add_argument(
        "--data",
        dest="source",
        help='"fsdd", an .npz (X, y, lengths), a directory of .npy, a .pfile, Kaldi .scp/.ark',
    )
    group.add_argument("--labels", help="Kaldi alignment archive with the per-frame labels")
    group.add_argument("--norm-file", dest="norm_file", help="Quicknet norm file to use")
    group.add_argument("--context", type=int, help="frames of context either side")
    group.add_argument(
        "--compress",
        help="update codec of workers that choose none: none, fp16, int8, sign, topk:F, "
        "powersgd:R (default none)",
    )


def _add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--http-host", dest="http_host")
    parser.add_argument("--http-port", dest="http_port", type=int)
    parser.add_argument("--name")
    parser.add_argument("--token", help="shared secret workers must prove (or SNET_TOKEN)")
    parser.add_argument("--out-dir", dest="out_dir")
    parser.add_argument(
        "--ready-file", dest="ready_file", help="JSON with pid and ports, once both listen"
    )
    parser.add_argument("--pid-file", dest="pid_file", help="this process's id, while it runs")
    parser.add_argument("--trace-file", dest="trace_file")
    parser.add_argument("--pool-size", dest="pool_size", type=int)
    parser.add_argument(
        "--min-workers",
        dest="min_workers",
        type=int,
        help="lease no frames before this many workers have joined (default 1)",
    )
    parser.add_argument("--max-frame-mb", dest="max_frame_mb", type=int)
    parser.add_argument("--heartbeat-seconds", dest="heartbeat_seconds", type=float)
    parser.add_argument("--worker-timeout-seconds", dest="worker_timeout_seconds", type=float)
    parser.add_argument(
        "--stall-seconds",
        dest="stall_seconds",
        type=float,
        help="least time a worker holding frames may take to deliver before it is late "
        "(default 2; its deadline is 10x its measured interval if longer)",
    )
    parser.add_argument(
        "--join-seconds",
        dest="join_seconds",
        type=float,
        help="sync mode: extra time for a worker's first update (default 10)",
    )
    parser.add_argument("--linger-seconds", dest="linger_seconds", type=float)
    parser.add_argument("--log-level", dest="log_level")
    parser.add_argument(
        "--init-weights", dest="init_weights", help="continue training from a weights .npz"
    )
    parser.add_argument("--hooks", help="extra hooks: package.module:ClassName,...")
    _add_checkpoint_flags(parser)
    parser.add_argument("--config", help="TOML file with [server] and [job] tables")
    _add_job_flags(parser)


def _add_checkpoint_flags(parser: argparse.ArgumentParser) -> None:
    from dataclasses import fields

    from snet.server.config import ServerConfig

    help_of = {f.name: f.metadata.get("help") for f in fields(ServerConfig)}
    group = parser.add_argument_group("checkpoints (resumed by default from --out-dir)")
    group.add_argument("--checkpoint-seconds", dest="checkpoint_seconds", type=float,
                       help=help_of["checkpoint_seconds"])  # fmt: skip
    group.add_argument("--checkpoint-steps", dest="checkpoint_steps", type=int,
                       help=help_of["checkpoint_steps"])  # fmt: skip
    group.add_argument("--checkpoint-keep", dest="checkpoint_keep", type=int,
                       help=help_of["checkpoint_keep"])  # fmt: skip
    for name in ("fresh", "force"):
        group.add_argument(f"--{name}", action="store_true", default=None, help=help_of[name])


def _add_worker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="HOST:PORT of the server")
    parser.add_argument("--name")
    parser.add_argument("--token")
    parser.add_argument("--threads", type=int, help="BLAS threads (default 1)")
    parser.add_argument("--heartbeat-seconds", dest="heartbeat_seconds", type=float)
    retry_help = "keep trying to get back to the server this long after losing it (default 300)"
    parser.add_argument("--retry-seconds", type=float, help=retry_help)
    silence_help = "drop and redo a connection silent this long (default 30)"
    parser.add_argument("--server-timeout-seconds", type=float, help=silence_help)
    parser.add_argument("--max-frame-mb", dest="max_frame_mb", type=int)
    parser.add_argument(
        "--compress",
        help="send updates in this codec with error feedback: none, fp16, int8, sign, "
        "topk:F, powersgd:R (default: the job's)",
    )
    parser.add_argument(
        "--weights-codec",
        dest="weights_codec",
        help="receive weights as none (float32), fp16, or delta:CODEC (default none)",
    )
    parser.add_argument("--log-level", dest="log_level")
    parser.add_argument(
        "--data-access",
        dest="data_access",
        choices=("auto", "local", "inline"),
        help="read the data here (local), have the server send it (inline), or try (auto)",
    )
    parser.add_argument("--config", help="TOML file with a [worker] (and [spert]) table")


def _add_plan_flags(parser: argparse.ArgumentParser) -> None:
    """``snet plan`` (cli/plan.py); its defaults are those of the scaling benchmark."""
    parser.add_argument("--network", default="351:1262:45", help='layer sizes, e.g. "351:1262:45"')
    parser.add_argument("--bunch", type=int, default=1000, help="patterns per worker update")
    parser.add_argument(
        "--link-mbps",
        dest="link_mbps",
        type=float,
        help="link speed in Mbit/s (default: the measured 127.0.0.1 link of the constants)",
    )
    parser.add_argument("--workers", default="1,2,4,8", help="comma-separated worker counts")
    parser.add_argument("--strategies", default="pattern,network")
    parser.add_argument("--modes", default="sync,async")
    parser.add_argument(
        "--exemplars", type=int, default=1_000_000, help="exemplars per epoch (BSP table)"
    )
    parser.add_argument("--constants", help="JSON with the model's constants (snet bench output)")
    parser.add_argument("--calibrate", action="store_true", help="measure the constants now")
    parser.add_argument("--measured", help="scaling benchmark JSON to draw against the model")
    parser.add_argument("--png", help="draw the model (and the measurement) to this PNG file")
    parser.add_argument("--json", action="store_true", help="print the predictions as JSON")


def _parser() -> argparse.ArgumentParser:
    from .spert import add_board_flags  # imports numpy: only after the BLAS limit is set

    parser = argparse.ArgumentParser(prog="snet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="run the server daemon")
    _add_server_flags(server)

    worker = commands.add_parser("worker", help="attach a worker to a server")
    _add_worker_flags(worker)
    worker.add_argument(
        "--backend", help="compute backend: auto (default), numpy, torch, spert or modelled"
    )

    spert = commands.add_parser(
        "spert", help="attach an emulated Spert-II board as a worker (backend spert)"
    )
    _add_worker_flags(spert)
    add_board_flags(spert)

    status = commands.add_parser("status", help="show a server's training status")
    status.add_argument(
        "--url", default=None, help="HTTP address (default SNET_URL or http://127.0.0.1:7080)"
    )
    status.add_argument("--json", action="store_true", help="print the raw JSON")

    plan = commands.add_parser(
        "plan", help="predict MCUPS and speed-up per strategy and mode (performance models)"
    )
    _add_plan_flags(plan)

    evaluate = commands.add_parser("eval", help="score saved weights on data")
    evaluate.add_argument("--weights", required=True, help="a weights .npz written by snet")
    evaluate.add_argument("--data", dest="source", help="data to score on (default fsdd)")
    evaluate.add_argument("--labels", help="Kaldi alignment archive")
    evaluate.add_argument("--norm-file", dest="norm_file", help="Quicknet norm file")
    evaluate.add_argument("--context", type=int, help="default: as saved with the weights")
    evaluate.add_argument("--subset", choices=("cv", "train", "all"), default="cv")
    evaluate.add_argument("--cv-fraction", dest="cv_fraction", type=float, default=0.1)
    evaluate.add_argument("--split-seed", dest="split_seed", type=int, default=0)
    evaluate.add_argument("--json", action="store_true")

    train = commands.add_parser("train", help="sequential training in this process")
    train.add_argument("--out-dir", dest="out_dir", default="snet-out")
    train.add_argument("--init-weights", dest="init_weights")
    _add_job_flags(train)

    data = commands.add_parser("data", help="data tools")
    data_commands = data.add_subparsers(dest="data_command", required=True)
    convert = data_commands.add_parser("convert", help="rewrite data as .pfile, .npz or .ark")
    convert.add_argument("input", help="any data snet reads")
    convert.add_argument("output", help="OUT.pfile, OUT.npz or OUT.ark (+ .scp, -ali.ark)")
    convert.add_argument("--labels", help="Kaldi alignment archive of the input")

    bench = commands.add_parser("bench", help="run the benchmark suite")
    bench.add_argument("--only", help="comma-separated sections: worker,server,round,scaling")
    bench.add_argument("--quick", action="store_true", help="fewer configurations")
    bench.add_argument("--seconds", type=float, default=3.0, help="measuring time per figure")
    bench.add_argument("--json", default="docs/benchmarks.json")
    bench.add_argument("--markdown", default="docs/benchmarks.md")

    demo = commands.add_parser("demo", help="train locally: a server and N worker processes")
    demo.add_argument("--workers", type=int, default=2, help="numpy worker processes")
    demo.add_argument(
        "--spert", type=int, default=0, help="emulated Spert-II boards to add as workers"
    )
    demo.add_argument(
        "--spert-time-scale",
        dest="spert_time_scale",
        type=float,
        default=1.0,
        help="how much faster than real time the demo's boards run",
    )
    demo.add_argument("--http-port", dest="http_port", type=int, default=0)
    demo.add_argument("--out-dir", dest="out_dir", default="snet-out")
    demo.add_argument(
        "--weights-codec",
        dest="weights_codec",
        help="the workers' --weights-codec (none, fp16, delta:CODEC)",
    )
    _add_job_flags(demo)
    return parser


def _early_blas_limit(argv: list[str]) -> None:
    """A worker's BLAS thread count (``--threads``, else SNET_WORKER_THREADS, else 1), set
    before anything imports numpy: building the parser already does."""
    if not argv or argv[0] not in ("worker", "spert"):
        return
    threads = os.environ.get("SNET_WORKER_THREADS", "1")
    for index, word in enumerate(argv):
        if word == "--threads" and index + 1 < len(argv):
            threads = argv[index + 1]
        elif word.startswith("--threads="):
            threads = word.split("=", 1)[1]
    limit_blas_threads(int(threads) if threads.isdigit() and int(threads) > 0 else 1)


def main(argv: list[str] | None = None) -> int:
    _early_blas_limit(sys.argv[1:] if argv is None else argv)
    args = _parser().parse_args(argv)
    from snet.protocol.errors import ConfigError, DataError, ListenError, OutDirInUse

    try:
        if args.command == "server":
            from .commands import run_server

            return run_server(args)
        if args.command == "worker":
            from .commands import run_worker

            return run_worker(args)
        if args.command == "spert":
            from .spert import run_spert

            return run_spert(args)
        if args.command == "bench":
            from .bench import run_bench

            return run_bench(args)
        if args.command == "status":
            from .status import run_status

            return run_status(args)
        if args.command == "plan":
            from .plan import run_plan

            return run_plan(args)
        if args.command in ("eval", "train", "data"):
            from . import offline
            from .commands import JOB_FLAGS

            if args.command == "eval":
                return offline.run_eval(args)
            if args.command == "data":
                return offline.run_convert(args)
            flags = {k: v for k in JOB_FLAGS if (v := getattr(args, k, None)) is not None}
            return offline.run_train(args, flags)
        from .demo import run_demo

        return run_demo(args)
    except (ListenError, OutDirInUse) as exc:
        print(f"snet: {exc}", file=sys.stderr)
        return 1
    except (ConfigError, DataError) as exc:
        print(f"snet: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
