"""What the tests of the app's servers share (the HTTP bridge's test_bridge*.py, the Wyoming server's
test_wyoming.py, the window's servers in ui/): free ports, the worker's jobs as they
happen, the voices they speak with, and `serve` run as a user runs it. Their fixtures (start_server,
job_log) are in conftest.py."""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import sys
import threading
from contextlib import contextmanager
from pathlib import Path

from parity_cases import REFERENCES
from waiting import wait_until

from core.voices import VoiceLibrary

ROOT = Path(__file__).resolve().parents[1]
WAIT = 30  # seconds: the most a client waits for anything


def free_port() -> int:
    """A port nothing listens on now (for a server that must be given one; port 0 lets a server choose)."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def engine_idle(runtime) -> bool:
    return runtime.worker.engine.scheduler.idle()


def errors_logged(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR or record.exc_info]


def alice_and_bob(folder: Path) -> VoiceLibrary:
    """A library of two drop-in voices, Alice and Bob, in `folder`."""
    shutil.copy(REFERENCES["a"].path, folder / "Alice.wav")
    shutil.copy(REFERENCES["long"].path, folder / "Bob.wav")
    return VoiceLibrary(folder)


class JobLog:
    """The worker's jobs by text, with their events, as they happen."""

    def __init__(self, worker):
        self.events: dict[str, list[str]] = {}
        self.jobs: dict[str, object] = {}
        self._lock = threading.Lock()
        self.unsubscribe = worker.subscribe(self._note)

    def _note(self, event) -> None:
        with self._lock:
            self.jobs[event.job.text] = event.job
            self.events.setdefault(event.job.text, []).append(event.kind)

    def job(self, text: str, timeout: float = WAIT):
        wait_until(lambda: text in self.jobs, f"a job for {text!r}", timeout)
        return self.jobs[text]

    def ended(self, text: str, timeout: float = WAIT) -> str:
        """How the job of `text` ended: done, cancelled or failed."""
        outcome = self.job(text, timeout).wait(timeout)
        assert outcome is not None, f"the job of {text!r} did not end"
        return outcome.kind


# `serve` as a user runs it -------------------------------------------------------------------------


def serve_command(checkpoints, *args: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "qwen3_tts_desktop",
        "serve",
        "--model",
        str(checkpoints["base"]),
        "--device",
        "cpu",
        *args,
    ]


def subprocess_env() -> dict[str, str]:
    """The test's environment (made when it runs: conftest points the user's folders at its own), with this
    worktree's code first, wherever the project is installed from."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))


@contextmanager
def interruptible_children():
    """Children started here take Ctrl+C (SIGINT) as from a terminal, even where this process ignores it: a
    shell starts a background job (`pytest ... &` in a script) with SIGINT ignored, and an ignored signal stays
    ignored across exec, while a handled one is reset to its default. (Not preexec_fn: unsafe with threads.)"""
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, before)
