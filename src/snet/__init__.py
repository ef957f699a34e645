"""snet: an asynchronous client/server parameter service for data-parallel training.

The real code lives in the repository's top-level folders ``server/``, ``client/``,
``protocol/``, ``data/``, ``perf/`` and ``cli/``; ``src/snet`` maps them into the one
``snet`` namespace through symbolic links so that editable installs, wheels, pytest and
mypy all see ``snet.server``, ``snet.client``, ``snet.protocol``, ``snet.data``,
``snet.perf`` and ``snet.cli``. ``bench/`` is not mapped: the benchmarks run from a
checkout and are never installed.
"""

__version__ = "0.1.0"
