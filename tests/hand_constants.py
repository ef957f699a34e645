"""A network and model constants small enough to work the performance model by hand
(tests/test_perfmodel.py, tests/test_plan.py)."""

from __future__ import annotations

from snet.perf.model import Constants
from snet.protocol.network import NetworkSpec

# A network small enough to work by hand: 2:3:1 has 2*3+3 + 3*1+1 = 13 connections.
TINY = NetworkSpec.parse("2:3:1")
HAND = Constants(
    cu_seconds=1e-6,
    pattern_seconds=0.0,
    link_seconds_per_byte=1e-9,
    worker_seconds_per_byte=2e-9,
    message_seconds=1e-4,
    latency_seconds=5e-5,
    apply_seconds_per_byte=1e-10,
    step_seconds_per_byte=2e-10,
    step_fixed_seconds=3e-6,
    source="by hand",
)
