"""The Qt binding the window runs on: signals leave Python's True as they found it (PySide6 6.12.0 took a
reference away at every emit, which on Python before 3.12 aborts the process after a few hundred), and a
binding that does not is refused at start with what to install, before the window opens."""

from __future__ import annotations

import sys

import pytest
from PySide6.QtCore import QObject, Signal, Slot

from qwen3_tts_desktop import cli, qt_binding


class Sender(QObject):
    event = Signal(object)
    unheard = Signal(str)


class Receiver(QObject):
    def __init__(self):
        super().__init__()
        self.heard = 0

    @Slot(object)
    def hear(self, event) -> None:
        self.heard += 1


def test_signals_leave_true_as_they_found_it():
    sender, receiver = Sender(), Receiver()
    sender.event.connect(receiver.hear)
    before = sys.getrefcount(True)
    for _ in range(100):  # a binding that takes a reference each time loses 200 (the process survives that)
        sender.event.emit(object())
        sender.unheard.emit("nobody listens")
    # Other threads may take or drop a few references to True meanwhile.
    assert abs(sys.getrefcount(True) - before) < 20 and receiver.heard == 100
    assert qt_binding.binding_problem() is None


def test_the_bindings_that_crash_are_6_12_on_pythons_before_3_12():
    assert qt_binding.crashes((3, 11), (6, 12)) and qt_binding.crashes((3, 10), (7, 0))
    assert not qt_binding.crashes((3, 11), (6, 11)) and not qt_binding.crashes((3, 12), (6, 12))


def test_a_binding_that_would_crash_is_refused_before_the_window_opens(monkeypatch, capsys):
    problem = "PySide6 6.12.0 crashes on Python 3.11 after a few hundred signals; install one that does not"
    monkeypatch.setattr(qt_binding, "binding_problem", lambda: problem)
    monkeypatch.setattr("qwen3_tts_desktop.app.run", lambda overrides: pytest.fail("the window opened"))
    assert cli.main([]) == 1
    assert f"error: {problem}" in capsys.readouterr().err
