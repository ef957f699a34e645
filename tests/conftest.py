"""Shared fixtures: ``cluster`` starts real processes and kills what is left at teardown."""

from __future__ import annotations

import os
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


@pytest.fixture(autouse=True, scope="session")
def _data_cache_of_the_run(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Workers share normalised data through a cache directory (data/cache.py): the test
    run's own, never the home directory's."""
    os.environ["XDG_CACHE_HOME"] = str(tmp_path_factory.mktemp("xdg-cache"))
