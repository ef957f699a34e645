"""``snet``: server, worker, spert, status and demo subcommands."""

from __future__ import annotations

import argparse
import sys

from .runtime import limit_blas_threads
from .spert import add_board_flags


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
    group.add_argument("--chunk-frames", dest="chunk_frames", type=int)
    group.add_argument("--seed", type=int)
    group.add_argument("--data", dest="source", help='"fsdd" or an .npz with X, y, lengths')
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
    parser.add_argument("--max-frame-mb", dest="max_frame_mb", type=int)
    parser.add_argument("--heartbeat-seconds", dest="heartbeat_seconds", type=float)
    parser.add_argument("--worker-timeout-seconds", dest="worker_timeout_seconds", type=float)
    parser.add_argument("--linger-seconds", dest="linger_seconds", type=float)
    parser.add_argument("--log-level", dest="log_level")
    parser.add_argument("--config", help="TOML file with [server] and [job] tables")
    _add_job_flags(parser)


def _add_worker_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", help="HOST:PORT of the server")
    parser.add_argument("--name")
    parser.add_argument("--token")
    parser.add_argument("--threads", type=int, help="BLAS threads (default 1)")
    parser.add_argument("--heartbeat-seconds", dest="heartbeat_seconds", type=float)
    retry_help = "keep trying to (re)connect this long (default 30)"
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
    parser.add_argument("--config", help="TOML file with a [worker] (and [spert]) table")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="snet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="run the server daemon")
    _add_server_flags(server)

    worker = commands.add_parser("worker", help="attach a worker to a server")
    _add_worker_flags(worker)
    worker.add_argument("--backend", help="compute backend: auto (default), numpy, torch or spert")

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


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command in ("worker", "spert"):
        limit_blas_threads(args.threads or 1)
    from snet.protocol.errors import ConfigError, DataError, ListenError

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
        from .demo import run_demo

        return run_demo(args)
    except ListenError as exc:
        print(f"snet: {exc}", file=sys.stderr)
        return 1
    except (ConfigError, DataError) as exc:
        print(f"snet: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
