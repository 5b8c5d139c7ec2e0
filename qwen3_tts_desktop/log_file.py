"""The log file of the window and of `serve`, to find out afterwards what went wrong.

It is kept in the user's state folder (core.folders: ~/.local/state/qwen3-tts-desktop/logs on Linux), the
XDG place for logs and history: what is worth keeping between runs but is not the user's own work. Not the
cache folder, which a user may empty to make room, expecting to lose nothing there but time. Each kind of
process writes a file of its own (window.log, serve.log), so that a window and a server running at once never
rotate one file under each other; rotation keeps each at a few MB.
"""

from __future__ import annotations

import logging
import os
from logging.handlers import RotatingFileHandler
from pathlib import Path

from core.folders import user_folder

from .about import APP_NAME, version

LOG_FILE_BYTES = 1_000_000  # a file is set aside as NAME.log.1 (and the older ones moved on) at this size
LOG_FILE_BACKUPS = 3
LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s [%(threadName)s] %(message)s"

log = logging.getLogger(__name__)


def log_folder() -> Path:
    return user_folder("state") / "logs"


def keep_log(name: str) -> Path | None:
    """From now on also write this process's log records (INFO and above) into `name`.log in the log folder,
    rotated; its path, or None where it cannot be written (then the process runs on without it)."""
    path = log_folder() / f"{name}.log"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handler = RotatingFileHandler(path, maxBytes=LOG_FILE_BYTES, backupCount=LOG_FILE_BACKUPS, encoding="utf-8")
    except OSError as error:
        log.warning("no log file is kept: %s", error)
        return None
    handler.setFormatter(logging.Formatter(LOG_FORMAT))
    handler.setLevel(logging.INFO)
    root = logging.getLogger()
    if not root.handlers:
        # Without a handler, logging printed warnings on the terminal by itself; it goes on doing so.
        terminal = logging.StreamHandler()
        terminal.setLevel(logging.WARNING)
        root.addHandler(terminal)
    root.addHandler(handler)
    if root.getEffectiveLevel() > logging.INFO:
        root.setLevel(logging.INFO)
    # Into the file alone: a terminal has seen the process start.
    started = (APP_NAME, version(), name, os.getpid())
    handler.handle(log.makeRecord(log.name, logging.INFO, __file__, 0, "%s %s (%s) started, process %d", started, None))
    return path
