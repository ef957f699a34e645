"""snet: an asynchronous client/server parameter service for data-parallel training.

The real code lives in the repository's top-level folders ``server/``, ``client/``,
``protocol/``, ``data/`` and ``cli/``; ``src/snet`` maps them into the one ``snet``
namespace through symbolic links so that editable installs, pytest and mypy all see
``snet.server``, ``snet.client``, ``snet.protocol``, ``snet.data`` and ``snet.cli``.
"""

__version__ = "0.1.0"
