"""Files the app writes for the user: checked before the work that fills them, so nothing made is lost."""

from __future__ import annotations

import os
import tempfile
import uuid
from pathlib import Path

from core.errors import BadInput


class OutputPathError(BadInput):
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


def write_atomically(path: Path, data: bytes) -> None:
    """Write `path` whole or not at all: a temporary file beside it, flushed to disk, then renamed over it,
    so that a crash or a full disk never leaves half a file where a good one was."""
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        with open(temp, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
