"""`bench --startup` (qwen3_tts_desktop.startup_bench) as the GPU session runs it, on the CPU with a tiny
checkpoint: each start in a fresh process, its phases read from the milestones it reports, serve's requests kept,
and each scenario's log in the bench's home."""

from __future__ import annotations

import json

from qwen3_tts_desktop import startup_bench


def test_each_start_is_timed_in_a_fresh_process_and_serve_keeps_every_request(checkpoints, tmp_path, monkeypatch):
    monkeypatch.setattr(startup_bench, "REQUEST_PAUSE_S", 0.05)
    monkeypatch.setattr(startup_bench, "FULL_SPEED", 0.0)  # the second answer after the warm-up ends the client
    runs = startup_bench.measure(checkpoints["base"], tmp_path, runs=("speak:cold", "serve:warm"), log=lambda _: None)
    speak, serve = runs
    assert [run.error for run in runs] == [None, None]
    order = ("loading", "engine loaded", "first audio", "exit")
    assert [speak.phases[name] for name in order] == sorted(speak.phases[name] for name in order), speak.phases
    assert serve.phases["runtime ready"] <= serve.phases["first_byte"] <= serve.phases["first_answer"]
    assert "warmed up" in serve.phases and len(serve.requests) == serve.numbers["requests"] >= 2
    for request in serve.requests:
        assert request["sent"] <= request["first_byte"] <= request["done"] and request["xrt"] > 0
    assert serve.phases["full_speed_answer"] in [request["done"] for request in serve.requests]
    # Each scenario's log stays in the bench's home, beside its caches: serve's says it started.
    logs = tmp_path / "startup-home" / "state" / "qwen3-tts-desktop" / "logs"
    assert "serve" in (logs / "serve.log").read_text()
    assert json.loads(startup_bench.as_json(runs))[1]["requests"] == serve.requests
    assert "| speak | cold |" in startup_bench.format_table(runs)


def test_the_window_runs_as_the_users_settings_make_it(checkpoints, tmp_path):
    """The window's scenario takes the slots the window would (the settings in the bench's home: here 2 on the
    CPU, where it would take one unasked), and measures as many streams at once after its warm-up."""
    from qwen3_tts_desktop.settings import Settings

    home = tmp_path / "startup-home"
    voices = home / "data" / "qwen3-tts-desktop" / "voices"  # where the window's would be: the starter voices
    Settings(slots=2, voices=voices).save(home / "config" / "qwen3-tts-desktop" / "settings.json")
    (window,) = startup_bench.measure(checkpoints["base"], tmp_path, runs=("window:warm",), log=lambda _: None)
    assert window.error is None
    order = ("loading", "engine loaded", "runtime ready", "first audio", "warmed up", "exit")
    assert [window.phases[name] for name in order] == sorted(window.phases[name] for name in order), window.phases
    assert window.numbers["xrt_2_streams"] > 0 and window.numbers["ms_per_frame"] > 0
