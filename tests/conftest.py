"""Shared fixtures: ``cluster`` starts real processes and kills what is left at teardown."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from helpers import Cluster


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    nodes = Cluster(tmp_path)
    try:
        yield nodes
    finally:
        nodes.close()
