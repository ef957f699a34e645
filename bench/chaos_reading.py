"""What a chaos run (bench/chaos.py) left behind, read: the servers' and workers' log
times around each kill, and the trace's surviving lineage with its ledger check."""

from __future__ import annotations

import json
from collections import Counter
from datetime import datetime
from pathlib import Path
from typing import Any


def server_log_times(log: Path) -> list[dict[str, list[float]]]:
    """Per server start (its ``event loop`` line), the wall times of its log lines of
    interest: imports done, serving, workers joined."""
    starts: list[dict[str, list[float]]] = []
    marks = {"event loop:": "imported", "serving snet": "serving", ") joined": "joined"}
    for line in log.read_text(errors="replace").splitlines():
        for text, name in marks.items():
            if text in line:
                when = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
                if name == "imported":
                    starts.append({})
                if starts:
                    starts[-1].setdefault(name, []).append(when)
    return starts


def worker_rejoin_seconds(log: Path, kills: list[tuple[float, str]]) -> list[float | None]:
    """Per worker kill (its wall time and the worker's name), the seconds until the
    restarted worker joined (its first ``worker NAME (...) joined`` line after the kill),
    None if it never did."""
    joins: list[tuple[float, str]] = []
    for line in log.read_text(errors="replace").splitlines():
        if ") joined" in line and "snet.server: worker " in line:
            name = line.split("snet.server: worker ", 1)[1].split(" ", 1)[0]
            joins.append((datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp(), name))
    seconds: list[float | None] = []
    for killed, name in kills:
        after = [when for when, joined in joins if joined == name and when >= killed]
        seconds.append(round(min(after) - killed, 3) if after else None)
    return seconds


def kill_phases(kill: dict[str, Any], start: dict[str, list[float]]) -> dict[str, float]:
    """Where the seconds from a kill to the first step after it went."""
    killed, first_step = kill.pop("killed_at"), kill.pop("first_step_at")
    imported, serving = start["imported"][0], start["serving"][0]
    joined = min(start.get("joined", [first_step]))
    return {
        "start_and_imports": round(imported - killed, 3),
        "state_load": round(serving - imported, 3),
        "first_worker_rejoins": round(max(joined - serving, 0.0), 3),
        "first_step": round(max(first_step - max(joined, serving), 0.0), 3),
    }


def lineage(trace: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The steps the final weights descend from, and per resume what it undid: a resumed
    server continues from its checkpoint's version; later steps of the killed one are lost."""
    steps: list[dict[str, Any]] = []
    resumes: list[dict[str, Any]] = []
    for line in trace.read_text().splitlines():
        record = json.loads(line)
        if "resumed" not in record:
            steps.append(record)
            continue
        lost = [s for s in steps if s["version"] > record["resumed"]]
        steps = steps[: len(steps) - len(lost)]
        resumes.append({"resumed_version": record["resumed"], "versions_lost": len(lost),
                        "updates_lost": sum(len(s["updates"]) for s in lost),
                        "epochs_of_lost_steps": sorted({s["epoch"] for s in lost})})  # fmt: skip
    return steps, resumes


def ledger_check(status: dict[str, Any], steps: list[dict[str, Any]]) -> dict[str, Any]:
    """Every epoch's ledger exact, and every frame once per epoch in the surviving steps."""
    frames = Counter((s["epoch"], f) for s in steps for u in s["updates"] for f in u["frames"])
    per_epoch = Counter(epoch for epoch, _ in frames)
    train = status["epochs"][0]["ledger"]["frames"]
    ledgers_exact = all(
        e["ledger"]["used_once"] == e["ledger"]["frames"] and e["ledger"]["used_more"] == 0
        for e in status["epochs"]
    )
    return {
        "ledgers_exact": ledgers_exact,
        "trace_frames_doubled": sum(1 for count in frames.values() if count > 1),
        "trace_frames_missing": sum(train - per_epoch[e] for e in range(status["epochs_done"])),
        "ok": ledgers_exact and all(count == 1 for count in frames.values())
        and all(per_epoch[e] == train for e in range(status["epochs_done"])),
    }  # fmt: skip
