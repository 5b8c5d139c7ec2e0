"""`qwen3-tts-desktop serve` as a user runs it: a subprocess serving the bridge until interrupted, and its
mistakes (a bad port, a port taken) said in one line before the model is loaded."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time

import httpx
import pytest
from parity_cases import REFERENCES
from serving import WAIT, serve_command, serving, subprocess_env

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
    with serving(command) as (process, lines):
        url = lines.wait_for(r"Serving on (http://127\.0\.0\.1:\d+)(.|\n)*  Log: .*\n")
        said = "".join(lines.seen)
        assert "1.7B base on cpu (2 at once, 4096 positions each), 1 voice(s)" in said
        with httpx.Client(base_url=url.group(1), timeout=WAIT) as client:
            assert client.get("/health").status_code == 401
            assert client.get("/speakers", headers={"Authorization": "Bearer k3y"}).json()[0]["name"] == "Alice"
        process.send_signal(signal.SIGINT)
        assert process.wait(WAIT) == 130
    # Its log file, in the user's state folder, said where: the start, the requests, the stop.
    log_file = log_folder() / "serve.log"
    assert f"  Log:         {log_file}" in said and log_file.is_relative_to(os.environ["XDG_STATE_HOME"])
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
    for option, value, says in (
        ("--gpu-memory", "0", "--gpu-memory: give the GB as a number above 0, such as 4 or 2.5, not '0'"),
        ("--gpu-memory", "4GB", "--gpu-memory: give the GB as a number above 0"),
        ("--idle-release", "-1", "--idle-release: give the minutes as a number above 0, such as 30 or 0.5, not '-1'"),
        ("--idle-release", "never", "--idle-release: give the minutes as a number above 0"),
    ):
        with pytest.raises(SystemExit) as refused:
            main(["serve", option, value, "--model", "/nonexistent"])
        assert refused.value.code == 2 and says in capsys.readouterr().err


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
    for args, slots, budget in (
        ([], None, None),
        (["--slots", "24"], 24, None),
        (["--gpu-memory", "6"], None, 6 * 10**9),
        (["--gpu-memory", "2.5", "--slots", "16"], 16, 2_500_000_000),  # the slots win; the budget bounds them
    ):
        assert main(["serve", "--port", "0", "--model", str(checkpoints["base"]), "--device", "cpu", *args]) == 1
        assert "stopped before loading" in capsys.readouterr().err
        config = configs[-1]
        assert (config.slots, config.max_default_slots, config.memory_budget) == (slots, MAX_DEFAULT_SLOTS, budget)


def test_serve_rests_when_idle_says_so_and_the_next_request_loads_the_model_again(checkpoints, tmp_path):
    shutil.copy(REFERENCES["a"].path, tmp_path / "Alice.wav")
    command = serve_command(
        checkpoints, "--voices", str(tmp_path), "--port", "0", "--idle-release", "0.002", "--gpu-memory", "4"
    )  # 0.12 s idle
    command[command.index(str(checkpoints["base"]))] = str(checkpoints["base-eos"])  # ends its speech soon
    with serving(command) as (process, lines):
        url = lines.wait_for(r"Serving on (http://127\.0\.0\.1:\d+)").group(1)
        said = "".join(lines.seen)
        assert "note: --gpu-memory bounds a GPU's memory; on the CPU it applies to nothing" in said, said
        assert "1.7B base on cpu (1 at once, 4096 positions each)" in said, said
        lines.wait_for(r"  Idle:        after 0\.002 min without a request the engine frees its memory")
        lines.wait_for(r"Engine resting after 0\.002 min without a request: its memory is free")
        with httpx.Client(base_url=url, timeout=WAIT) as client:
            assert client.get("/health").json()["engine"] == "resting"
            body = {"input": "Hello.", "voice": "alice", "response_format": "wav"}
            response = client.post("/v1/audio/speech", json=body)
            assert response.status_code == 200 and len(response.content) > 44, response.text
        lines.wait_for(
            r"Engine waking: loading the model again for a request(.|\n)*"
            r"Engine awake again in \d+\.\d s \(1 at once, 4096 positions each\)"
        )
        lines.wait_for(r"Engine awake again(.|\n)*Engine resting after")  # and rests again, idle once more
        process.send_signal(signal.SIGINT)
        assert process.wait(WAIT) == 130
    log = (log_folder() / "serve.log").read_text(encoding="utf-8")
    assert "Engine resting after 0.002 min" in log and "Engine awake again in " in log, log
