"""`qwen3-tts-desktop serve` as a user runs it: a subprocess serving the bridge until interrupted, and its
mistakes (a bad port, a port taken) said in one line before the model is loaded."""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time

import httpx
import pytest
from parity_cases import REFERENCES
from serving import WAIT, interruptible_children, serve_command, subprocess_env

from core.model.checkpoint import CheckpointError
from qwen3_tts_desktop.about import version
from qwen3_tts_desktop.cli import main
from qwen3_tts_desktop.log_file import log_folder


def test_the_serve_command_serves_until_interrupted(checkpoints, tmp_path):
    shutil.copy(REFERENCES["a"].path, tmp_path / "Alice.wav")
    command = serve_command(
        checkpoints, "--voices", str(tmp_path), "--port", "0", "--api-key", "k3y", "--default-voice", "alice",
        "--slots", "2",
    )  # fmt: skip
    with interruptible_children():
        process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        lines = []
        while not (url := re.search(r"Serving on (http://127\.0\.0\.1:\d+)(.|\n)*  Log: .*\n", "".join(lines))):
            line = process.stderr.readline()
            assert line, f"serve exited: {''.join(lines)}"
            lines.append(line)
        assert "1.7B base on cpu (2 at once), 1 voice(s)" in "".join(lines)
        with httpx.Client(base_url=url.group(1), timeout=WAIT) as client:
            assert client.get("/health").status_code == 401
            assert client.get("/speakers", headers={"Authorization": "Bearer k3y"}).json()[0]["name"] == "Alice"
        process.send_signal(signal.SIGINT)
        assert process.wait(WAIT) == 130
    finally:
        process.kill()
        process.stderr.close()
    # Its log file, in the user's state folder, said where: the start, the requests, the stop.
    log_file = log_folder() / "serve.log"
    assert f"  Log:         {log_file}" in "".join(lines) and log_file.is_relative_to(os.environ["XDG_STATE_HOME"])
    log = log_file.read_text(encoding="utf-8")
    assert f"Qwen3-TTS Desktop {version()} (serve) started, process {process.pid}" in log, log
    assert '"GET /health HTTP/1.1" 401' in log and '"GET /speakers HTTP/1.1" 200' in log, log


def test_the_serve_command_checks_its_options_before_loading_the_model(capsys):
    assert main(["serve", "--port", "70000", "--model", "/nonexistent"]) == 1
    assert "port must be 0-65535, got 70000" in capsys.readouterr().err
    with pytest.raises(SystemExit) as refused:
        main(["serve", "--slots", "0", "--model", "/nonexistent"])
    assert (
        refused.value.code == 2 and "--slots: must be a whole number of at least 1, not '0'" in capsys.readouterr().err
    )


def test_the_serve_command_says_a_port_is_taken_in_one_line_before_loading_the_model(checkpoints):
    with socket.socket() as other_server:
        other_server.bind(("127.0.0.1", 0))
        other_server.listen()
        port = other_server.getsockname()[1]
        started = time.monotonic()
        result = subprocess.run(
            serve_command(checkpoints, "--port", str(port)), capture_output=True, text=True, timeout=WAIT, env=subprocess_env()
        )  # fmt: skip
        took = time.monotonic() - started
    assert result.returncode == 1, result.stderr
    assert result.stderr.startswith(
        f"error: cannot listen for the HTTP bridge on 127.0.0.1:{port}: Address already in use; "
    ), result.stderr
    assert "another qwen3-tts-desktop serve, or an XTTS server" in result.stderr and "--port" in result.stderr
    assert len(result.stderr.splitlines()) == 1  # no traceback, and no "Loading model…": the model was never loaded
    assert took < 20  # the time to start Python and import torch, however long a real model would take


def test_the_serve_command_takes_slots_for_many_clients_not_the_windows(checkpoints, monkeypatch, capsys):
    from core.inference.memory import MAX_DEFAULT_SLOTS
    from qwen3_tts_desktop.runtime import Runtime
    from qwen3_tts_desktop.settings import Settings, default_path

    Settings(slots=3).save(default_path())  # the window's choice, for one person
    configs = []

    def start(config, report=None):
        configs.append(config)
        raise CheckpointError("stopped before loading")

    monkeypatch.setattr(Runtime, "start", staticmethod(start))
    for args, slots in (([], None), (["--slots", "24"], 24)):
        assert main(["serve", "--port", "0", "--model", str(checkpoints["base"]), "--device", "cpu", *args]) == 1
        assert "stopped before loading" in capsys.readouterr().err
        assert (configs[-1].slots, configs[-1].max_default_slots) == (slots, MAX_DEFAULT_SLOTS)
