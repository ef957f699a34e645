"""The collector at start-up (protocol/heap.py): off from the entry point until the
command has loaded what it keeps, which is then frozen; untouched in a process whose
entry point did not switch it off (this one)."""

from __future__ import annotations

import gc
import sys

import pytest

from snet.protocol.heap import settle

from helpers import run_process

# A process as the ``snet`` entry point starts one: the collector off while it loads, then
# what it loaded frozen and the collector on again.
ENTRY = """
import gc
from snet.protocol.heap import settle, start_quietly
start_quietly()
assert not gc.isenabled()
import numpy  # what a command loads
settle()
assert gc.isenabled()
frozen = gc.get_freeze_count()
assert frozen > 10_000, frozen  # the interpreter's objects and numpy's
kept = [[index] for index in range(1000)]
settle()  # again: what was made since joins them, the collector stays on
assert gc.isenabled() and gc.get_freeze_count() >= frozen + 1000, gc.get_freeze_count()
print("ok", frozen)
"""


@pytest.mark.system
def test_an_entry_point_loads_with_the_collector_off_and_freezes_what_it_loaded() -> None:
    done = run_process([sys.executable, "-c", ENTRY], check=True)
    assert done.stdout.startswith("ok "), done.stdout


def test_settle_leaves_a_process_whose_collector_was_never_switched_off_alone() -> None:
    frozen = gc.get_freeze_count()
    settle()
    assert gc.isenabled()
    assert gc.get_freeze_count() == frozen
