"""What one update costs on each side, beside what computing it costs.

A real server and 2 real async workers (``python -m snet.cli``, one BLAS thread each) train
with bunch 64 per worker, for three elements: the default job (117:512:10 on the bundled
data, 262 kB) and synthetic frames for 39:150:42 (49 kB) and 351:1262:45 (2 MB). After a
warm-up, each process's CPU time is read per thread from /proc over ``seconds``, with the
updates applied in that window, and divided:

- the server's event loop per update (receiving and decoding the update, the intake's
  checks, the lease book, publishing the step and sending the new weights to every
  worker) and its other threads (the step thread: the plausibility checks, the step, the
  weights' digest; the checkpoint writer). A step that takes less than the server's
  ``inline_step_seconds`` of CPU runs on the event loop's thread (transport/inline.py),
  and is counted in the loop's figure then;
- each worker's event loop per update (encoding and sending the update, receiving the
  weights and taking them over, leases, reports) and its compute (the bunch's
  arithmetic, which is what all of this is for: the workers' own figure, since bunches
  under ``inline_seconds`` are computed on the event loop's thread);
- the latency from a worker's send to the first bunch it starts on weights that include
  that update (the median of the workers' own ``per_update`` figures:
  client/update_timing.py, switched on with ``SNET_WORKER_REPORT_TIMING``).

``overhead/compute`` is (server + worker event loop) CPU per update over the compute
thread's: above 1, moving an update costs more than computing it.

``--baseline DIR`` measures a checkout of earlier code too (its processes import ``snet``
from ``DIR/src``), each element's runs back to back, so that before and after come from
the same minutes of this shared machine (its workers report no latency if that code could
not yet): baseline, this, this, baseline, each code's row the mean of its two. The second
of two runs back to back measured slower here, whichever code it was: identical code
(this checkout beside ``git archive HEAD``) 1454 then 1368 updates a second; this
session's code then its start's 1328 then 1233, in the other order 1575 then 1390
(docs/time-to-accuracy.md, session 25)::

    git archive main | tar -x -C /tmp/before
    .venv/bin/python -m bench.update_cost --seconds 4 --baseline /tmp/before
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from snet.cli.runtime import blas_thread_env

from .arguments import checkout, emit, output_path, positive_float
from .processes import LocalCluster
from .server_throughput import synthetic_data

BUNCH = 64  # per worker: the default job's global bunch of 128 divided among 2
WORKERS = 2
WARMUP_UPDATES = 300
# label -> network (None: the default job on the bundled data)
ELEMENTS: dict[str, str | None] = {"49kB": "39:150:42", "262kB": None, "2MB": "351:1262:45"}


def thread_cpu(pid: int) -> tuple[float, float]:
    """(main thread, all other threads) CPU seconds of process ``pid``, from /proc."""
    tick = os.sysconf("SC_CLK_TCK")
    main = other = 0.0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        seconds = (int(fields[11]) + int(fields[12])) / tick
        if int(task.name) == pid:
            main += seconds
        else:
            other += seconds
    return main, other


def _snapshot(cluster: LocalCluster) -> dict[str, Any]:
    assert cluster.server_handle is not None
    status = cluster.server_handle.status()
    return {
        "time": time.perf_counter(),
        "cpu": [thread_cpu(p.pid) for p in cluster.processes],  # the server first
        "applied": status["updates_applied"],
        "sent": sum(w["updates_sent"] for w in status["workers"]),
        "status": status,
    }


def measure(
    label: str, network: str | None, seconds: float, workdir: Path, baseline: Path | None = None
) -> dict[str, Any]:
    """One element's row: CPU per update on each side and the latency to new weights
    (``baseline``: of the checkout there instead of this one)."""
    flags = ["--mode", "async", "--min-workers", str(WORKERS), "--bunch-size", str(BUNCH)]
    flags += ["--epochs", "1000", "--checkpoint-seconds", "3600"]
    if network is not None:
        data, context = synthetic_data(workdir, network)
        flags += ["--network", network, "--data", str(data), "--context", str(context)]
    env = {**blas_thread_env(1), "SNET_WORKER_REPORT_TIMING": "true"}
    if baseline is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(baseline / "src"),
                                                          env.get("PYTHONPATH"))))  # fmt: skip
    code = "baseline" if baseline is not None else "this"
    with LocalCluster(workdir / f"{label}-{code}", env) as cluster:
        server = cluster.server(flags)
        for index in range(WORKERS):
            cluster.worker(server, f"w{index + 1}", [])
        cluster.wait_for(
            lambda: server.status()["updates_applied"] >= WARMUP_UPDATES, 120, "the warm-up"
        )
        first = _snapshot(cluster)
        time.sleep(seconds)
        last = _snapshot(cluster)
    applied = max(last["applied"] - first["applied"], 1)
    sent = max(last["sent"] - first["sent"], 1)
    (s_main0, s_other0), *workers0 = first["cpu"]
    (s_main1, s_other1), *workers1 = last["cpu"]
    loop = sum(w1[0] - w0[0] for w0, w1 in zip(workers0, workers1, strict=True))
    compute = sum(w1[1] - w0[1] for w0, w1 in zip(workers0, workers1, strict=True))
    reports = [w.get("report", {}).get("per_update", {}) for w in last["status"]["workers"]]
    computes = [r["compute_cpu_ms"] for r in reports if r.get("compute_cpu_ms") is not None]
    if computes:  # small bunches run on the event loop's thread: the workers' own split
        compute_ms = statistics.mean(computes)
        loop_ms = 1e3 * (loop + compute) / sent - compute_ms
    else:
        compute_ms, loop_ms = 1e3 * compute / sent, 1e3 * loop / sent
    latencies = [r["latency_ms"] for r in reports if r.get("latency_ms") is not None]
    row = {
        "element": label,
        "code": code,
        "network": last["status"]["network"],
        "element_bytes": 4 * last["status"]["connections_per_pattern"],
        "updates_per_s": round(applied / (last["time"] - first["time"]), 1),
        "server_loop_ms": round(1e3 * (s_main1 - s_main0) / applied, 3),
        "server_step_ms": round(1e3 * (s_other1 - s_other0) / applied, 3),
        "worker_loop_ms": round(loop_ms, 3),
        "worker_compute_ms": round(compute_ms, 3),
        "latency_ms": round(statistics.median(latencies), 3) if latencies else None,
    }
    return _with_overhead(row)


def _with_overhead(row: dict[str, Any]) -> dict[str, Any]:
    """``row`` with its ``overhead_over_compute`` (see the module's notes)."""
    overhead = row["server_loop_ms"] + row["server_step_ms"] + row["worker_loop_ms"]
    row["overhead_over_compute"] = (
        round(overhead / row["worker_compute_ms"], 2) if row["worker_compute_ms"] else None
    )
    return row


def run_update_bench(
    seconds: float = 4.0,
    labels: tuple[str, ...] = tuple(ELEMENTS),
    baseline: Path | None = None,
) -> list[Any]:
    """A row per element (see the module's notes), preceded by the ``baseline``
    checkout's when there is one: then each code is measured twice, in the order
    baseline, this, this, baseline, and its row is the mean of its two."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="snet-update-cost-") as tmp:
        for label in labels:
            if baseline is None:
                rows.append(measure(label, ELEMENTS[label], seconds, Path(tmp)))
                print(f"  update cost {label}: {rows[-1]}", flush=True)
                continue
            runs: dict[str, list[dict[str, Any]]] = {"baseline": [], "this": []}
            for code in (baseline, None, None, baseline):
                row = measure(label, ELEMENTS[label], seconds, Path(tmp), code)
                runs[row["code"]].append(row)
                print(f"  update cost {label}: {row}", flush=True)
            rows += [_mean_row(runs["baseline"]), _mean_row(runs["this"])]
    return rows


def _mean_row(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """One row of the figures of ``runs`` (of one element and code), each the mean, and
    its overhead over compute from those means (not the mean of the runs' ratios)."""
    row = dict(runs[0])
    for key, value in runs[0].items():
        if isinstance(value, float) and all(isinstance(r[key], float) for r in runs):
            row[key] = round(statistics.mean(r[key] for r in runs), 3)
    return _with_overhead(row) if "worker_compute_ms" in row else row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.update_cost", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("--seconds", type=positive_float, default=4.0, help="measuring window")
    parser.add_argument("--elements", default=",".join(ELEMENTS), help="of " + ",".join(ELEMENTS))
    parser.add_argument("--baseline", type=checkout, help="earlier code to measure too")
    parser.add_argument("--json", type=output_path, help="write the rows here too")
    args = parser.parse_args(argv)
    elements = tuple(args.elements.split(","))
    unknown = [label for label in elements if label not in ELEMENTS]
    if unknown:
        parser.error(f"unknown element(s) {', '.join(unknown)}; known: {', '.join(ELEMENTS)}")
    rows = run_update_bench(args.seconds, elements, args.baseline)
    emit(json.dumps(rows, indent=1), args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
