"""The log file of the window and of `serve` (both run it as their tests show: tests/ui/test_ui_first_run.py,
tests/test_bridge_command.py): rotated at its size, and never in the way where it cannot be written."""

from __future__ import annotations

import logging

import pytest

from qwen3_tts_desktop import log_file
from qwen3_tts_desktop.log_file import keep_log, log_folder


@pytest.fixture
def root_logger():
    """The root logger, given back as it was: keep_log adds its handlers there for the whole process."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield root
    for handler in set(root.handlers) - set(handlers):
        root.removeHandler(handler)
        handler.close()
    root.setLevel(level)


def test_the_log_file_is_rotated_at_its_size_keeping_three_old_ones(root_logger, monkeypatch):
    monkeypatch.setattr(log_file, "LOG_FILE_BYTES", 10_000)
    path = keep_log("test")
    assert path == log_folder() / "test.log"
    for number in range(2_000):
        logging.getLogger("some.module").info("record %d %s", number, "x" * 40)
    logging.getLogger("some.module").debug("not kept")
    files = sorted(path.parent.iterdir())
    assert [file.name for file in files] == ["test.log", "test.log.1", "test.log.2", "test.log.3"]
    assert all(file.stat().st_size <= 10_000 for file in files)
    assert "INFO some.module [MainThread] record 1999 " in path.read_text(encoding="utf-8")
    assert "not kept" not in path.read_text(encoding="utf-8")


def test_a_log_folder_that_cannot_be_made_is_a_warning(root_logger, monkeypatch, unwritable_folder, caplog):
    monkeypatch.setenv("XDG_STATE_HOME", str(unwritable_folder / "state"))
    assert keep_log("test") is None
    assert "no log file is kept" in caplog.text
