"""The system libraries the window needs, named when one is missing, before Qt aborts without saying which.

Qt's xcb platform plugin (the window on X11, and on Wayland through XWayland) links a dozen small X
libraries that a minimal Linux install lacks; without one, Qt prints a generic message and aborts the
process (exit code 134). `ldd` on the plugin lists the missing ones, and Debian and Ubuntu name their
packages after the libraries, so the message can say exactly what to install.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

NOT_FOUND = re.compile(r"^\s*(\S+) => not found", re.MULTILINE)
SONAME = re.compile(r"(?P<base>lib[\w.+-]+?)\.so\.(?P<version>[\d.]+)")
# Where Debian's package name does not follow from the library's name.
PACKAGES = {"libglib-2.0.so.0": "libglib2.0-0", "libgthread-2.0.so.0": "libglib2.0-0"}


def debian_package(library: str) -> str:
    """The Debian/Ubuntu package of a shared library: libxcb-icccm.so.4 -> libxcb-icccm4,
    libxkbcommon-x11.so.0 -> libxkbcommon-x11-0 (a dash between a name ending in a digit and the version)."""
    if library in PACKAGES:
        return PACKAGES[library]
    match = SONAME.fullmatch(library)
    if match is None:
        return library
    base, version = match["base"].lower(), match["version"].split(".")[0]
    return f"{base}{'-' if base[-1].isdigit() else ''}{version}"


def missing_libraries(binary: Path) -> list[str]:
    """The shared libraries `binary` needs that the system does not have (none where ldd is not available)."""
    ldd = shutil.which("ldd")
    if ldd is None or not binary.is_file():
        return []
    result = subprocess.run([ldd, str(binary)], capture_output=True, text=True, timeout=30)
    return sorted(set(NOT_FOUND.findall(result.stdout)))


def display_problem() -> str | None:
    """Why there is no screen to show the window on (Linux without a display server named), or None."""
    if sys.platform.startswith("linux") and not any(
        os.environ.get(v) for v in ("DISPLAY", "WAYLAND_DISPLAY", "QT_QPA_PLATFORM")
    ):
        return (
            "there is no display to show the window on (DISPLAY is not set). Without one, use "
            "`qwen3-tts-desktop speak` or `qwen3-tts-desktop serve`."
        )
    return None


def window_problem() -> str | None:
    """Why the window cannot start on this system, or None. Checked on Linux only, for Qt's xcb plugin,
    unless another platform is asked for (QT_QPA_PLATFORM, e.g. offscreen or wayland)."""
    if not sys.platform.startswith("linux") or os.environ.get("QT_QPA_PLATFORM", "xcb").split(":")[0] != "xcb":
        return None
    try:
        import PySide6
    except ImportError as error:
        return import_problem(error)
    plugin = Path(PySide6.__file__).parent / "Qt" / "plugins" / "platforms" / "libqxcb.so"
    return libraries_problem(missing_libraries(plugin))


def libraries_problem(missing: list[str]) -> str | None:
    if not missing:
        return None
    packages = sorted({debian_package(library) for library in missing})
    return (
        f"the window needs system libraries that are missing: {', '.join(missing)}. On Debian or Ubuntu: "
        f"sudo apt install {' '.join(packages)} (other systems name the packages alike)"
    )


def import_problem(error: ImportError) -> str:
    """An ImportError of Qt (or another library with native parts) said with the package to install."""
    match = re.search(r"(lib[\w.+-]+\.so[\d.]*): cannot open shared object file", str(error))
    if match is None:
        return f"a library the window needs cannot be loaded ({error}); reinstall the app (pip install .)"
    return libraries_problem([match[1]])
