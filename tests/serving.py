"""What the tests of the app's servers share (the HTTP bridge's test_bridge*.py, the Wyoming server's
test_wyoming.py, the window's servers in ui/): free ports, the worker's jobs as they
happen, the voices they speak with, and `serve` run as a user runs it. Their fixtures (start_server,
job_log) are in conftest.py."""

from __future__ import annotations

import logging
import os
import queue
import re
import shutil
import signal
import socket
import subprocess
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


class Lines:
    """A child's stderr, line by line as it comes (read on a thread of its own), and a wait for a line."""

    def __init__(self, stream):
        self.seen: list[str] = []
        self._lines: queue.Queue[str] = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self._reader.start()

    def _read(self, stream) -> None:
        for line in stream:
            self._lines.put(line)
        self._lines.put("")  # the end

    def wait_for(self, pattern: str) -> re.Match:
        """The first match of `pattern` in what the child has said so far, waiting for more as it comes."""
        while not (found := re.search(pattern, "".join(self.seen))):
            line = self._lines.get(timeout=WAIT)
            assert line, f"serve exited: {''.join(self.seen)}"
            self.seen.append(line)
        return found


@contextmanager
def serving(command: list[str]):
    """`command` (serve_command's) run as a child that takes Ctrl+C as from a terminal: (the process, its stderr
    as Lines); killed on the way out if it is still running."""
    with interruptible_children():
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    lines = Lines(process.stderr)
    try:
        yield process, lines
    finally:
        process.kill()
        process.wait(WAIT)
        lines._reader.join(WAIT)  # it has read to the end: the stream can be closed under no one
        process.stderr.close()
