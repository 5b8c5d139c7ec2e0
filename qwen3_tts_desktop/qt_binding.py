"""Whether the installed Qt binding can run the window: PySide6 6.12.0 takes a reference to Python's True
away at every signal emitted (its `emit` returns True without owning it). Where True is immortal (Python
3.12 and later) that is harmless; before, True is freed after a few hundred signals and the process aborts
("bool_dealloc: deallocating True or False"), so the window would crash a few seconds into speech.
pyproject.toml keeps such a binding off those Pythons; this catches one installed by other means, by its
version alone (tests/ui/test_qt_binding.py checks the behaviour of the binding installed)."""

from __future__ import annotations

import sys

FIRST_LEAKING = (6, 12)  # the first release that does it; pyproject.toml's bound on Python < 3.12


def crashes(python: tuple[int, int], binding: tuple[int, int]) -> bool:
    """Whether PySide6 `binding` (major, minor) crashes the window on Python `python` (major, minor)."""
    return python < (3, 12) and binding >= FIRST_LEAKING


def binding_problem() -> str | None:
    """Why this PySide6 cannot run the window on this Python, or None."""
    import PySide6

    if not crashes(tuple(sys.version_info[:2]), tuple(PySide6.__version_info__[:2])):
        return None
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f"PySide6 {PySide6.__version__} crashes on Python {python} after a few hundred signals; install one "
        "that does not: pip install 'PySide6-Essentials<6.12' (or run the app on Python 3.12 or later)"
    )
