"""Opening an ``.npz`` archive that a user named: weights (``--weights``,
``--init-weights``) and data (``--data``, ``--cv-data``, ``--test-data``).

``np.load`` takes whatever it is given: a file that is not a zip archive (a text file, a
truncated download) it tries to read as a pickle, and says "allow_pickle", which is both
wrong and unsafe advice. ``open_npz`` asks whether the file is a zip archive first, so the
user is told what is wrong with the file; ``ARCHIVE_ERRORS`` are what reading a member of
an archive that is damaged inside can raise.
"""

from __future__ import annotations

import zipfile
import zlib
from pathlib import Path
from typing import Any

import numpy as np

# what np.load and reading its members raise on a missing, damaged or foreign file
ARCHIVE_ERRORS = (OSError, EOFError, ValueError, KeyError, zipfile.BadZipFile, zlib.error)


def not_an_archive(path: str | Path) -> str:
    """The one line for a file that is not a readable ``.npz`` archive."""
    return f"{path} is not an .npz archive (or is truncated or corrupt)"


def open_npz(path: str | Path) -> Any:
    """``np.load(path)`` of an ``.npz`` archive, never unpickling: raises ``OSError`` for a
    file that cannot be opened and ``ValueError(not_an_archive(path))`` for one that is not
    a zip archive (the end of a truncated one is missing, so it is not one either)."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{path} does not exist or is not a file")
    if not zipfile.is_zipfile(path):
        raise ValueError(not_an_archive(path))
    return np.load(path, allow_pickle=False)
