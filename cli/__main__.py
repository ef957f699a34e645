"""``python -m snet.cli`` is the ``snet`` command."""

from .main import entry

entry()
