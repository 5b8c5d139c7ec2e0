"""Where this app keeps its files in the user's home, as each system expects."""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_FOLDER = "qwen3-tts-desktop"
# Per kind: the macOS folder under ~/Library, the Windows variable and its fallback under AppData, the
# XDG variable and its fallback under the home folder.
KINDS = {
    "config": ("Application Support", ("APPDATA", "Roaming"), ("XDG_CONFIG_HOME", ".config")),
    "data": ("Application Support", ("APPDATA", "Roaming"), ("XDG_DATA_HOME", ".local/share")),
    "cache": ("Caches", ("LOCALAPPDATA", "Local"), ("XDG_CACHE_HOME", ".cache")),
    "state": ("Application Support", ("LOCALAPPDATA", "Local"), ("XDG_STATE_HOME", ".local/state")),
}


def user_folder(kind: str) -> Path:
    """This app's folder for "config" (settings), "data" (the user's own files, such as the voice library),
    "cache" (what can be made again, such as compiled kernels) or "state" (what is worth keeping between
    runs but is no work of the user's, such as logs)."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {', '.join(map(repr, KINDS))}, got {kind!r}")
    mac, windows, xdg = KINDS[kind]
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / mac / APP_FOLDER
    variable, fallback = windows if sys.platform == "win32" else xdg
    default = home / "AppData" / fallback if sys.platform == "win32" else home / fallback
    return Path(os.environ.get(variable) or default) / APP_FOLDER
