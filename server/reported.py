"""The figures a peer reports are checked for plausibility, not only for finiteness
(issue 12: accuracy counts of 7.8e15 and a NaN loss reached /status; the norms of the
updates themselves: server/plausible.py):

- ``update_figures_problem`` and ``eval_figures_problem``: the counts an update or a CV
  result reports are bounded by its patterns, and its loss is finite.
- ``checked_report``: a worker's report is small, shallow, plain JSON.
- ``finite``: every figure in /status is finite JSON (a NaN would make it not JSON).
"""

from __future__ import annotations

import json
import math
from typing import Any

from snet.protocol.errors import RejectedUpdate

MAX_LOSS_PER_PATTERN = 1e4  # cross-entropy of a float32 softmax stays far below this
MAX_COMPUTE_SECONDS = 1e6  # an update's compute time (11 days: no bunch takes that)
# a worker report's JSON size: an emulated board's is 360 bytes; at 64 KiB, 254 peers'
# reports made /status 15 MB (a probe), at 8 KiB 256 workers' make 2 MB at most
REPORT_BYTES = 8 * 1024
REPORT_DEPTH = 8  # nesting of a worker report


def update_figures_problem(patterns: int, correct: int, loss_sum: float, seconds: float) -> str:
    """Why an update's reported figures are implausible ("" if they are not)."""
    if patterns < 1:
        return f"update claims {patterns} patterns"
    if not 0 <= correct <= patterns:
        return f"update claims {correct} correct of {patterns} patterns"
    if not (math.isfinite(loss_sum) and 0.0 <= loss_sum <= MAX_LOSS_PER_PATTERN * patterns):
        return f"update claims a loss of {loss_sum!r} over {patterns} patterns"
    if not (math.isfinite(seconds) and 0.0 <= seconds <= MAX_COMPUTE_SECONDS):
        return f"update claims {seconds:.3g} seconds of compute"  # (1e300 was taken)
    return ""


def eval_figures_problem(frames: int, correct: int, loss_sum: float, cv_frames: int) -> str:
    """Why a CV result's figures are implausible ("" if they are not)."""
    if frames != cv_frames:
        return f"evaluation scored {frames} frames, the CV set has {cv_frames}"
    if not 0 <= correct <= frames:
        return f"evaluation claims {correct} correct of {frames} frames"
    if not (math.isfinite(loss_sum) and 0.0 <= loss_sum <= MAX_LOSS_PER_PATTERN * max(frames, 1)):
        return f"evaluation claims a loss of {loss_sum!r}"
    return ""


def checked_report(report: Any) -> dict[str, Any]:
    """A worker report as /status can show it: a map of plain JSON values, at most
    ``REPORT_DEPTH`` deep and ``REPORT_BYTES`` long (``RejectedUpdate`` otherwise). The
    depth is measured without recursion, so a report nested a thousand deep is refused,
    not a RecursionError."""
    if not isinstance(report, dict):
        raise RejectedUpdate("worker report is not a map")
    stack: list[tuple[Any, int]] = [(report, 1)]
    while stack:
        value, depth = stack.pop()
        if isinstance(value, dict | list):
            if depth > REPORT_DEPTH:
                raise RejectedUpdate(f"worker report is nested deeper than {REPORT_DEPTH}")
            children = value.values() if isinstance(value, dict) else value
            stack.extend((child, depth + 1) for child in children)
    try:
        text = json.dumps(report, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise RejectedUpdate(f"worker report is not plain JSON data: {exc}") from exc
    if len(text) > REPORT_BYTES:
        raise RejectedUpdate(f"worker report is {len(text)} bytes, over {REPORT_BYTES}")
    safe: dict[str, Any] = json.loads(text)
    return safe


def finite(document: Any) -> Any:
    """``document`` with every NaN or infinite float replaced by None (JSON has neither)."""
    if isinstance(document, float):
        return document if math.isfinite(document) else None
    if isinstance(document, dict):
        return {key: finite(value) for key, value in document.items()}
    if isinstance(document, list | tuple):
        return [finite(value) for value in document]
    return document
