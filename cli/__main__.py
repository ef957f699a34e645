"""``python -m snet.cli`` is the ``snet`` command."""

from .main import main

raise SystemExit(main())
