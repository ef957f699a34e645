"""``snet``: server, worker, status, plan and demo subcommands."""

from __future__ import annotations

import argparse
import sys

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
    group.add_argument("--chunk-frames", dest="chunk_frames", type=int)
    group.add_argument("--seed", type=int)
    group.add_argument("--data", dest="source", help='"fsdd" or an .npz with X, y, lengths')
    group.add_argument("--context", type=int, help="frames of context either side")


def _add_server_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--http-host", dest="http_host")
    parser.add_argument("--http-port", dest="http_port", type=int)
    parser.add_argument("--name")
    parser.add_argument("--token", help="shared secret workers must prove (or SNET_TOKEN)")
    parser.add_argument("--out-dir", dest="out_dir")
    parser.add_argument("--ready-file", dest="ready_file")
    parser.add_argument("--trace-file", dest="trace_file")
    parser.add_argument("--pool-size", dest="pool_size", type=int)
    parser.add_argument("--max-frame-mb", dest="max_frame_mb", type=int)
    parser.add_argument("--heartbeat-seconds", dest="heartbeat_seconds", type=float)
    parser.add_argument("--worker-timeout-seconds", dest="worker_timeout_seconds", type=float)
    parser.add_argument("--linger-seconds", dest="linger_seconds", type=float)
    parser.add_argument("--log-level", dest="log_level")
    parser.add_argument("--config", help="TOML file with [server] and [job] tables")
    _add_job_flags(parser)


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
    parser = argparse.ArgumentParser(prog="snet", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    server = commands.add_parser("server", help="run the server daemon")
    _add_server_flags(server)

    worker = commands.add_parser("worker", help="attach a worker to a server")
    worker.add_argument("--server", help="HOST:PORT of the server")
    worker.add_argument("--name")
    worker.add_argument("--token")
    worker.add_argument("--threads", type=int, help="BLAS threads (default 1)")
    worker.add_argument("--backend", help="compute backend (default numpy)")
    worker.add_argument("--heartbeat-seconds", dest="heartbeat_seconds", type=float)
    worker.add_argument("--retry-seconds", dest="retry_seconds", type=float)
    worker.add_argument("--max-frame-mb", dest="max_frame_mb", type=int)
    worker.add_argument("--log-level", dest="log_level")
    worker.add_argument("--config", help="TOML file with a [worker] table")

    status = commands.add_parser("status", help="show a server's training status")
    status.add_argument(
        "--url", default=None, help="HTTP address (default SNET_URL or http://127.0.0.1:7080)"
    )
    status.add_argument("--json", action="store_true", help="print the raw JSON")

    plan = commands.add_parser(
        "plan", help="predict MCUPS and speed-up per strategy and mode (performance models)"
    )
    _add_plan_flags(plan)

    bench = commands.add_parser("bench", help="run the benchmark suite")
    bench.add_argument("--only", help="comma-separated sections: worker,server,round,scaling")
    bench.add_argument("--quick", action="store_true", help="fewer configurations")
    bench.add_argument("--seconds", type=float, default=3.0, help="measuring time per figure")
    bench.add_argument("--json", default="docs/benchmarks.json")
    bench.add_argument("--markdown", default="docs/benchmarks.md")

    demo = commands.add_parser("demo", help="train locally: a server and N worker processes")
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--http-port", dest="http_port", type=int, default=0)
    demo.add_argument("--out-dir", dest="out_dir", default="snet-out")
    _add_job_flags(demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "worker":
        limit_blas_threads(args.threads or 1)
    from snet.protocol.errors import ConfigError, DataError

    try:
        if args.command == "server":
            from .commands import run_server

            return run_server(args)
        if args.command == "worker":
            from .commands import run_worker

            return run_worker(args)
        if args.command == "bench":
            from .bench import run_bench

            return run_bench(args)
        if args.command == "status":
            from .status import run_status

            return run_status(args)
        if args.command == "plan":
            from .plan import run_plan

            return run_plan(args)
        from .demo import run_demo

        return run_demo(args)
    except (ConfigError, DataError) as exc:
        print(f"snet: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())
