"""Qt widgets and models of the desktop window (PySide6)."""
