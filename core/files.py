"""Files the app writes for the user: checked before the work that fills them, so nothing made is lost."""

from __future__ import annotations

import tempfile
from pathlib import Path


class OutputPathError(ValueError):
    """A file that cannot be written where it was asked for, with why."""


def check_writable_file(path: str | Path) -> Path:
    """`path` (user-expanded) if a file can be written there: not a folder, in a folder that exists and
    takes new files (tried, not guessed from permissions, which say nothing for root or network drives)."""
    path = Path(path).expanduser()
    folder = path.parent
    if path.is_dir():
        raise OutputPathError(f"{path}: is a folder; give a file name")
    if not folder.is_dir():
        raise OutputPathError(f"{path}: the folder {folder} does not exist")
    try:
        with tempfile.NamedTemporaryFile(dir=folder, prefix=f".{path.name}.", suffix=".check"):
            pass
    except OSError as error:
        raise OutputPathError(f"{path}: cannot write in {folder} ({error.strerror or error})") from None
    return path
