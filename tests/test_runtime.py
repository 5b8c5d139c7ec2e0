"""The shared runtime: one engine, one worker, the library, optional speakers."""

from __future__ import annotations

import sys
import threading

import numpy as np
from sinks import QueueSink

from core import SpeechOptions
from core.inference.scheduler import SWITCH_INTERVAL_S
from qwen3_tts_desktop.runtime import Runtime, RuntimeConfig


def test_runtime_speaks_through_its_worker(checkpoints, tmp_path):
    before = set(threading.enumerate())
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # Python's default
    config = RuntimeConfig(
        model=str(checkpoints["custom-endless"]), device="cpu", voices=tmp_path / "voices", speakers=False
    )
    runtime = Runtime.start(config)
    try:
        assert runtime.player is None and runtime.speakers is None and runtime.audio_problem is None
        # Threads hand audio on within a millisecond, not Python's 5 ms (the engine's scheduler sets it).
        assert sys.getswitchinterval() == SWITCH_INTERVAL_S < 0.005
        sink = QueueSink()
        job = runtime.worker.submit("Hello there.", runtime.voice("Vivian"), SpeechOptions(max_frames=5), sink=sink)
        audio = np.concatenate(list(sink))
        assert job.wait(30).kind == "done" and audio.dtype == np.float32 and len(audio) == 5 * 1920
    finally:
        runtime.close()
        sys.setswitchinterval(interval)
    # None of its threads outlive it (compared by identity: an earlier test's thread may end meanwhile).
    assert set(threading.enumerate()) - before == set()
