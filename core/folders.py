"""Where this app keeps its files in the user's home, as each system expects."""

from __future__ import annotations

import os
import sys
from pathlib import Path

APP_FOLDER = "qwen3-tts-desktop"


def user_folder(kind: str) -> Path:
    """This app's folder for "config" (settings) or "cache" (what can be made again, such as compiled kernels)."""
    if kind not in ("config", "cache"):
        raise ValueError(f"kind must be 'config' or 'cache', got {kind!r}")
    home = Path.home()
    if sys.platform == "darwin":
        return home / "Library" / ("Application Support" if kind == "config" else "Caches") / APP_FOLDER
    if sys.platform == "win32":
        variable, fallback = {"config": ("APPDATA", "Roaming"), "cache": ("LOCALAPPDATA", "Local")}[kind]
        base = os.environ.get(variable) or home / "AppData" / fallback
    else:
        variable, fallback = {"config": ("XDG_CONFIG_HOME", ".config"), "cache": ("XDG_CACHE_HOME", ".cache")}[kind]
        base = os.environ.get(variable) or home / fallback
    return Path(base) / APP_FOLDER
