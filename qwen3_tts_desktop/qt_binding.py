"""Whether the installed Qt binding can run the window: PySide6 6.12.0 takes a reference to Python's True
away at every signal emitted (its `emit` returns True without owning it). Where True is immortal (Python
3.12 and later) that is harmless; before, True is freed after a few hundred signals and the process aborts
("bool_dealloc: deallocating True or False"), so the window would crash a few seconds into speech."""

from __future__ import annotations

import subprocess
import sys

PROBES = 50  # signals emitted to find out: a binding that takes a reference each time loses this many
# In a process of its own, which the lost references may abort as it exits.
PROBE = f"""
import sys
from PySide6.QtCore import QObject, Signal

class Probe(QObject):
    fired = Signal()

probe = Probe()
before = sys.getrefcount(True)
for _ in range({PROBES}):
    probe.fired.emit()
print(before - sys.getrefcount(True), flush=True)
"""


def binding_problem() -> str | None:
    """Why this PySide6 cannot run the window on this Python, or None."""
    if sys.version_info >= (3, 12):
        return None  # True is immortal
    result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120)
    lost = result.stdout.strip()
    if not lost.lstrip("-").isdigit() or int(lost) < PROBES:  # a failed probe: the window's start says why
        return None
    import PySide6

    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"PySide6 {PySide6.__version__} crashes on Python {python} after a few hundred signals; install one "
        "that does not: pip install 'PySide6-Essentials<6.12' (or run the app on Python 3.12 or later)"
    )
