"""``snet bench`` results as Markdown tables, with the issue's targets checked."""

from __future__ import annotations

from typing import Any

from .report_update import accuracy_section, accuracy_targets, update_section

BACKENDS = ("numpy", "numba", "torch_backend")  # snet's, as bench/worker_compute.py names them
# The bunch sizes speech training uses, against the GEMM ceiling of their shapes (one thread):
# the default job's and a small bunch of MultiSpert's network-parallel runs.
SMALL_BUNCH_TARGETS = {("117:512:10", 128): 0.85, ("39:500:42", 12): 0.85}


def _table(headers: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join("-" if v is None else str(v) for v in row) + " |" for row in rows]
    return lines


def _ratio(a: float | None, b: float | None, digits: int = 2) -> float | None:
    return round(a / b, digits) if a and b else None


def _best_ours(row: dict[str, Any]) -> tuple[str, float]:
    options = {k: row[k] for k in BACKENDS if row.get(k)}
    name = max(options, key=lambda k: options[k])
    return name, options[name]


def _torch_best(row: dict[str, Any]) -> float | None:
    """The faster of PyTorch's autograd and hand-written steps (None without torch)."""
    return max(row.get("torch_autograd") or 0, row.get("torch_hand") or 0) or None


def _ceiling(row: dict[str, Any], backend: str) -> float | None:
    """The GEMM ceiling measured with the BLAS that ``backend`` uses."""
    return row.get("gemm_ceiling_torch" if backend == "torch_backend" else "gemm_ceiling_numpy")


def _worker_section(rows: list[dict[str, Any]], rerun: str) -> list[str]:
    """The worker table; ``rerun`` says when, if the section was rerun on its own."""
    table = []
    for row in rows:
        name, ours = _best_ours(row)
        torch_best, ceiling = _torch_best(row), _ceiling(row, name)
        table.append(
            [
                row["network"],
                row["bunch"],
                row["threads"],
                row.get("numpy"),
                row.get("numba"),
                row.get("torch_backend"),
                _ratio(row.get("numpy"), row["gemm_ceiling_numpy"]),
                _ratio(row.get("numba"), row["gemm_ceiling_numpy"]),
                _ratio(row.get("torch_backend"), row.get("gemm_ceiling_torch")),
                row.get("torch_autograd"),
                row.get("torch_autograd_sgd"),
                row.get("torch_hand"),
                _ratio(ours, torch_best),
                _ratio(ours, row.get("torch_autograd")),
                _ratio(ours, ceiling),
            ]
        )
    return [
        "## Worker arithmetic (MCUPS)",
        "",
        f"{rerun}"
        "snet's backends compute one bunch's summed gradient, context windows cut from "
        "frames included; PyTorch's figures get their inputs ready-made. `numpy` is the "
        "numpy backend's numpy passes, `numpy+numba` the same backend with its compiled "
        "step (client/fused.py, used when numba is installed), timed in turns with it. "
        "`/ceiling` is the "
        "backend against the same five matrix products alone with the same BLAS (numpy: "
        "OpenBLAS, torch: MKL); `best/torch` is snet's faster backend against the faster of "
        "PyTorch's autograd and hand-written steps; `best/autograd` against the autograd "
        "step a PyTorch user writes (its `+SGD` column adds the optimizer step). With 1 "
        "thread the figures of a row are timed in turns in one process and count the "
        "compute thread's CPU time (time spent waiting for a core on this shared machine "
        "left out); with 2 threads each is timed in one stretch of wall-clock time, and "
        "the other engineers' work on the same 2 cores weighs on them.",
        "",
        *_table(
            [
                "network",
                "bunch",
                "threads",
                "numpy",
                "numpy+numba",
                "torch backend",
                "numpy/ceiling",
                "numba/ceiling",
                "torch/ceiling",
                "PyTorch autograd",
                "autograd+SGD",
                "PyTorch hand",
                "best/torch",
                "best/autograd",
                "best/ceiling",
            ],
            table,
        ),
        "",
        *_oversubscribed(rows),
    ]


def _oversubscribed(rows: list[dict[str, Any]]) -> list[str]:
    """A note on multi-threaded rows where a GEMM ceiling fell below half the one-thread
    ceiling of the same shapes and BLAS: more threads do not make the same products that
    much slower unless other work held the cores, so those rows say nothing about the
    code."""
    ceilings = ("gemm_ceiling_numpy", "gemm_ceiling_torch")
    one = {(r["network"], r["bunch"]): r for r in rows if r["threads"] == 1}
    hit = [
        f"{r['network']} bunch {r['bunch']}"
        for r in rows
        if r["threads"] > 1
        and (single := one.get((r["network"], r["bunch"])))
        and any((r.get(c) or 0) < (single.get(c) or 0) / 2 for c in ceilings)
    ]
    if not hit:
        return []
    return [
        f"Rows with 2 threads where a ceiling fell below half its 1-thread value "
        f"({', '.join(hit)}) were measured while other work held the cores: they say "
        "nothing about the code.",
        "",
    ]


def _target(label: str, value: float | None, at_least: float) -> list[Any]:
    """A row of the targets table: met when the measured ratio is at least the goal."""
    return [label, value, f">= {at_least}", value is not None and value >= at_least]


def _targets(results: dict[str, Any]) -> list[str]:
    checks: list[list[Any]] = []
    for row in results.get("worker", []):
        goal = SMALL_BUNCH_TARGETS.get((row["network"], row["bunch"]))
        if goal is not None and row["threads"] == 1:
            name, ours = _best_ours(row)
            label = f"worker vs the GEMM ceiling (bunch {row['bunch']}, {row['network']}, {name})"
            checks.append(_target(label, _ratio(ours, _ceiling(row, name), 3), goal))
        if row["network"] != "351:1262:45" or row["threads"] != 1:
            continue
        _, ours = _best_ours(row)
        if row["bunch"] == 1000:
            # "with either backend": each against the ceiling of its own BLAS
            ratios = {
                k: _ratio(row.get(k), _ceiling(row, k), 3) or 0.0 for k in BACKENDS if row.get(k)
            }
            closest = max(ratios, key=lambda k: ratios[k])
            label = f"worker vs the GEMM ceiling (bunch 1000, {closest})"
            checks.append(_target(label, ratios[closest], 0.9))
            checks.append(
                _target(
                    "worker vs PyTorch at its best (bunch 1000)",
                    _ratio(ours, _torch_best(row), 3),
                    1.0,
                )
            )
        if row["bunch"] == 12:
            for peer in ("torch_autograd", "torch_hand"):
                checks.append(
                    _target(
                        f"worker vs PyTorch ({peer}, bunch 12)",
                        _ratio(ours, row.get(peer), 3),
                        1.5,
                    )
                )
    for row in results.get("server", []):
        if row["element"] == "2MB":
            label = f"server 2 MB elements, {row['clients']} client(s), vs recv_into"
            checks.append(_target(label, row["ratio"], 0.75))
    scaling = results.get("scaling")
    if isinstance(scaling, dict) and scaling.get("rows"):
        # Within 15% everywhere: 1 - (the largest |1 - measured/predicted|) >= 0.85.
        worst = max(abs(1 - r["measured_over_predicted"]) for r in scaling["rows"])
        label = "scaling model vs measurement, P <= 8 (1 - worst error)"
        checks.append(_target(label, round(1 - worst, 3), 0.85))
    if results.get("round", {}).get("ratio") is not None:
        checks.append(_target("sync round vs gloo all-reduce", results["round"]["ratio"], 1.0))
    checks += accuracy_targets(results)
    lines = ["## Targets", "", *_table(["target", "measured", "goal", "met"], checks), ""]
    lines += _small_bunch_limit(results.get("worker", []))
    return lines + _server_cpu_limit(results.get("server", []))


def _server_cpu_limit(rows: list[dict[str, Any]]) -> list[str]:
    """Says so when the CPU the server and its clients spend per 2 MB element, on this
    machine's cores, cannot carry 0.75 of the plain figure however well it is overlapped."""
    bounded = [r for r in rows if r["element"] == "2MB" and r.get("cpu_bound_ratio") is not None]
    if not bounded or all(r["cpu_bound_ratio"] >= 0.75 for r in bounded):
        return []
    parts = [
        f"{r['clients']} client(s): {sum(r['snet_cpu_ms']):.2f} ms "
        f"(server {r['snet_cpu_ms'][0]:.2f}) against {sum(r['plain_cpu_ms']):.2f} ms, "
        f"at most {r['cpu_bound_ratio']:.2f} of recv_into, {r['ratio']:.2f} reached"
        for r in bounded
    ]
    return [
        "The server, its clients and the plain sink share this machine's cores. With 2 MB "
        "elements the CPU time per element, snet's (server and clients, who also take the "
        "new weights back) against the plain path's (sink and clients), and the most of "
        "the plain figure those cores could carry at snet's cost however well it "
        f"overlapped its work: {'; '.join(parts)}.",
        "",
    ]


def _small_bunch_limit(rows: list[dict[str, Any]]) -> list[str]:
    """Says so when 1.5x PyTorch's hand-written step at bunch 12 exceeds the GEMM ceiling."""
    for row in rows:
        if (row["network"], row["bunch"], row["threads"]) != ("351:1262:45", 12, 1):
            continue
        hand = row.get("torch_hand")
        ceilings = [c for c in (row.get("gemm_ceiling_numpy"), row.get("gemm_ceiling_torch")) if c]
        if not hand or not ceilings or 1.5 * hand <= max(ceilings):
            return []
        name, ours = _best_ours(row)
        return [
            f"With bunch 12, 1.5x PyTorch's hand-written step ({1.5 * hand:.0f} MCUPS) is "
            f"above the GEMM ceiling of these shapes ({max(ceilings):.0f} MCUPS, the faster "
            "BLAS's five matrix products alone): no step that does those products can reach "
            f"it. snet's best backend ({name}) does {ours:.0f} MCUPS, "
            f"{ours / max(ceilings):.2f} of that ceiling and {ours / hand:.2f}x the "
            "hand-written step.",
            "",
        ]
    return []


def _rerun(results: dict[str, Any], section: str) -> str:
    """The note for a section measured by a later ``snet bench --only`` than the rest."""
    when = results.get(f"{section}_when")
    return f"Rerun on its own (`snet bench --only {section}`) at {when}. " if when else ""


def _cpu_pair(values: list[float] | None) -> str | None:
    return None if not values or None in values else f"{values[0]:.2f} + {values[1]:.2f}"


def render_markdown(results: dict[str, Any]) -> str:
    machine = results.get("machine", {})
    lines = [
        "# snet benchmarks",
        "",
        f"Measured {results.get('when', '?')} on {machine.get('cpus', '?')} CPUs "
        f"({machine.get('processor', '?')}), Python {machine.get('python', '?')}, by "
        "`snet bench` (rerun it to refresh this file). Every figure that matters is a "
        "ratio of two measurements taken in the same run.",
        "",
    ]
    lines += _targets(results)
    if "worker" in results:
        lines += _worker_section(results["worker"], _rerun(results, "worker"))
    if "server" in results:
        lines += [
            "## Server throughput",
            "",
            _rerun(results, "server")
            + "Clients push update elements as fast as the socket allows, through a real "
            "async-mode server (one step per N updates, each applied with momentum; steps "
            "that queue up behind a running one are fused into one pass, and the new "
            "weights go back to every client after each pass) and into a plain "
            "`recv_into` sink that does nothing else. `steps/pass` is how many steps the "
            "server fused on average. CPU per element is the receiver's (server or sink) + "
            "the clients'; `CPU-bound ratio` is the most of the recv_into figure this "
            "machine's cores could carry at snet's CPU per element.",
            "",
        ]
        lines += _table(
            [
                "element",
                "clients",
                "snet elements/s",
                "steps/pass",
                "snet GB/s",
                "recv_into GB/s",
                "ratio",
                "snet CPU ms/element",
                "recv_into CPU ms/element",
                "CPU-bound ratio",
            ],
            [
                [
                    r["element"],
                    r["clients"],
                    r["snet_elements_per_s"],
                    r.get("steps_per_pass"),
                    r["snet_gb_per_s"],
                    r["plain_gb_per_s"],
                    r["ratio"],
                    _cpu_pair(r.get("snet_cpu_ms")),
                    _cpu_pair(r.get("plain_cpu_ms")),
                    r.get("cpu_bound_ratio"),
                ]
                for r in results["server"]
            ],
        )
        lines.append("")
    if "round" in results:
        r = results["round"]
        lines += [
            "## Synchronous round",
            "",
            _rerun(results, "round")
            + "Two clients each push a 2 MB update and wait for the new weights, beside two "
            "`torch.distributed` processes all-reducing a tensor of the same size with gloo.",
            "",
        ]
        lines += _table(
            ["element MB", "snet rounds/s", "gloo all-reduces/s", "ratio"],
            [[r["element_mb"], r["snet_rounds_per_s"], r["gloo_allreduce_per_s"], r["ratio"]]],
        )
        lines.append("")
    if isinstance(results.get("scaling"), dict) and results["scaling"].get("rows"):
        rows = results["scaling"]["rows"]
        headers = [
            "workers",
            "mode",
            "measured_mcups",
            "predicted_mcups",
            "measured_over_predicted",
            "bound",
        ]
        lines += [
            "## Scaling with emulated workers",
            "",
            _rerun(results, "scaling")
            + "Workers whose compute time is modelled (`--backend modelled`), a real "
            "server and real processes; the prediction is `snet plan`'s model "
            "(docs/performance-model.md) with constants calibrated in the same run.",
            "",
        ]
        lines += _table(headers, [[row.get(h) for h in headers] for row in rows])
        lines.append("")
    if results.get("update"):
        lines += update_section(results["update"], _rerun(results, "update"))
    if results.get("accuracy"):
        lines += accuracy_section(results["accuracy"], _rerun(results, "accuracy"))
    return "\n".join(lines)
