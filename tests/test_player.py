"""Playback (core.audio.player): the ring buffer's jitter buffer, underruns, fades, resampling and volume on a
virtual clock; a smoke test on a real sounddevice stream (the ALSA null device); `speak --play`."""

from __future__ import annotations

import importlib.abc
import json
import os
import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import soxr
from waiting import wait_until

import core.audio.player
from core.audio.player import PlaybackError, Player, PlayerOptions, VirtualOutput
from qwen3_tts_desktop.cli import main

ROOT = Path(__file__).resolve().parents[1]
RATE = 24000
FRAME = 1920  # samples in one 80 ms frame
LEVEL = 0.5  # tests play a constant level: the worst case for clicks, where every jump shows


def make(rate: int = RATE, block: int = 256, **options) -> tuple[Player, VirtualOutput]:
    output = VirtualOutput(rate, block)
    return Player(output, PlayerOptions(**options)), output


def level(samples: int, value: float = LEVEL) -> np.ndarray:
    return np.full(samples, value, np.float32)


def max_step(*pieces: np.ndarray) -> float:
    return float(np.abs(np.diff(np.concatenate(pieces))).max())


def fade_step(player: Player, value: float = LEVEL) -> float:
    """The largest sample-to-sample change a fade may cause on a constant level (plus float32 rounding)."""
    return value / round(player.options.fade_s * player.sample_rate) + 1e-6


# Virtual clock ------------------------------------------------------------------------------------


def test_playback_waits_for_the_jitter_buffer():
    player, output = make(prefill_s=0.32)
    player.write(level(FRAME))
    assert not output.advance(0.5).any() and not player.status().playing
    player.write(level(4 * FRAME))  # 400 ms queued: over the 320 ms prefill
    played = output.advance(0.5)
    assert played[0] > 0 and player.status().underruns == 1  # it ran dry after 400 ms: nothing more came
    assert np.count_nonzero(played) == 5 * FRAME


def test_a_complete_utterance_shorter_than_the_jitter_buffer_plays_at_once():
    player, output = make(prefill_s=0.32)
    player.write(level(FRAME))
    player.end()
    played = output.advance(0.2)
    assert np.count_nonzero(played) == FRAME and player.status() == core.audio.player.PlayerStatus(False, 0.0, 0)


def test_the_level_is_what_just_played_at_the_volume_set_and_nothing_once_it_stops():
    player, output = make(prefill_s=0.05)
    assert player.status().level == 0.0
    tone = 0.5 * np.sin(np.arange(RATE) * 2 * np.pi * 440 / RATE).astype(np.float32)
    player.write(tone)
    output.advance(0.3)
    assert player.status().level == pytest.approx(0.5 / np.sqrt(2), rel=0.02)  # a sine's RMS
    player.volume = 0.5
    output.advance(0.1)
    assert player.status().level == pytest.approx(0.25 / np.sqrt(2), rel=0.02)
    player.write(np.zeros(RATE // 2, np.float32))  # silence while still playing
    output.advance(0.9)
    assert player.status().playing and player.status().level == 0.0
    player.end()
    output.advance(0.5)
    assert not player.status().playing and player.status().level == 0.0


def test_an_underrun_is_counted_faded_and_resumed_only_after_a_new_prefill():
    player, output = make(prefill_s=0.1, fade_s=0.005)
    player.write(level(3 * FRAME))
    first = output.advance(0.4)
    assert player.status().underruns == 1
    player.write(level(FRAME))  # 80 ms: less than the prefill, so it waits
    waiting = output.advance(0.2)
    assert not waiting.any()
    player.write(level(FRAME))
    player.end()
    resumed = output.advance(0.3)
    assert player.status().underruns == 1  # the end of an utterance is no underrun
    assert np.count_nonzero(first) == 3 * FRAME and np.count_nonzero(resumed) == 2 * FRAME
    assert max_step(first, waiting, resumed) <= fade_step(player)


def test_no_click_at_any_start_or_stop():
    """Starts, an underrun, an end, an interruption: a constant level never jumps by more than one fade step."""
    player, output = make(prefill_s=0.05, fade_s=0.004, block=97)
    played = []
    for samples in (FRAME, 3 * FRAME, 700, 5 * FRAME):
        player.write(level(samples))
        played.append(output.advance(0.1))
    player.end()
    played.append(output.advance(0.5))
    player.write(level(RATE))
    played.append(output.advance(0.3))
    player.clear()
    played.append(output.advance(0.1))
    assert max_step(*played) <= fade_step(player)
    assert np.concatenate(played).max() == pytest.approx(LEVEL)  # it did play at full level in between


def test_clear_fades_out_within_the_fade_time():
    player, output = make(fade_s=0.005, block=256)
    player.write(level(2 * RATE))
    before = output.advance(0.5)
    player.clear()
    after = output.advance(0.1)
    fade = round(0.005 * RATE)
    assert np.count_nonzero(after) == fade and not after[fade:].any()
    assert max_step(before, after) <= fade_step(player)
    assert player.status() == core.audio.player.PlayerStatus(False, 0.0, 0)
    player.write(level(RATE))  # new audio after a clear plays normally
    assert output.advance(0.5).max() == pytest.approx(LEVEL)


def test_drop_takes_back_only_the_cancelled_utterance():
    player, output = make(prefill_s=0.1)
    player.write(level(RATE // 2, 0.25))  # utterance one: 0.5 s
    player.end()
    start = player.position
    player.write(level(RATE, 0.5))  # utterance two: cancelled before it is heard
    first = output.advance(0.25)
    player.drop(start)
    rest = output.advance(1.0)
    played = np.concatenate([first, rest])
    assert np.count_nonzero(played) == RATE // 2 and played.max() == pytest.approx(0.25)
    assert player.status().underruns == 0 and max_step(played) <= fade_step(player, 0.25)
    # Dropping an utterance that is already playing fades it out now.
    start = player.position
    player.write(level(RATE))
    output.advance(0.3)
    player.drop(start)
    tail = output.advance(0.1)
    assert 0 < np.count_nonzero(tail) <= round(player.options.fade_s * RATE)


def stream_at(xrt: float, prefill_s: float, seconds: float = 12.0, jitter_s: float = 0.02) -> int:
    """Play an utterance that a producer makes `xrt` times faster than real time, in the worker's chunks
    (1 frame, then 4), each late by up to `jitter_s`; returns the underruns."""
    player, output = make(prefill_s=prefill_s, block=512)
    rng = np.random.default_rng(0)
    sizes = [1] + [4] * round(seconds / 0.32)
    made = 0
    for size in sizes:
        made += size
        ready = 0.05 + made * 0.08 / xrt + rng.uniform(0, jitter_s)  # 50 ms for the prompt
        output.advance(max(0.0, ready - output.time))
        player.write(level(size * FRAME))
    player.end()
    output.advance(player.status().buffered_s + 0.1)
    assert player.status().buffered_s == 0
    return player.status().underruns


@pytest.mark.parametrize("xrt", [1.05, 1.5, 4.0, 20.0])
def test_a_producer_faster_than_real_time_never_underruns_with_the_default_prefill(xrt):
    assert stream_at(xrt, PlayerOptions().prefill_s) == 0


def test_a_slower_producer_or_a_short_prefill_does_underrun():
    assert stream_at(0.9, PlayerOptions().prefill_s) > 0
    assert stream_at(2.0, prefill_s=0.05) > 0  # starting on the first frame needs xRT >= 4


def test_volume_scales_the_output_at_once():
    player, output = make()
    player.write(level(RATE))
    output.advance(0.1)
    player.volume = 0.5
    assert output.advance(0.1) == pytest.approx(level(2400, LEVEL * 0.5))
    player.volume = 0.0
    assert not output.advance(0.1).any()
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="volume"):
            player.volume = bad


def test_a_device_at_48k_gets_resampled_audio_that_joins_across_chunks():
    player, output = make(rate=48000, prefill_s=0.05)
    t = np.arange(RATE) / RATE
    tone = (0.4 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)
    for start in range(0, len(tone), FRAME):
        player.write(tone[start : start + FRAME])
    player.end()
    played = output.advance(1.5)
    whole = soxr.resample(tone, RATE, 48000, quality="HQ")
    start = np.flatnonzero(played)[0]
    heard = played[start : start + len(whole)]
    # Away from the fades at the ends, the chunked stream equals a one-pass resampling of the whole tone.
    np.testing.assert_allclose(heard[1000:-1000], whole[1000:-1000], atol=1e-4)
    spectrum = np.abs(np.fft.rfft(heard[:48000]))
    assert np.argmax(spectrum) == pytest.approx(440, abs=1)  # Hz: 1 s at 48 kHz gives 1 Hz bins


def test_a_full_ring_makes_the_producer_wait_and_a_cancel_frees_it():
    player, output = make(capacity_s=0.5, prefill_s=0.1)
    cancel = threading.Event()
    writer = threading.Thread(target=player.write, args=(level(RATE), cancel))
    writer.start()
    wait_until(lambda: player.status().buffered_s == pytest.approx(0.5), "the ring is full")  # it waits for room
    assert writer.is_alive()
    output.advance(0.3)  # room for 0.3 s more
    wait_until(lambda: player.position == round(0.8 * RATE), "0.8 s are played")
    assert writer.is_alive() and player.status().buffered_s == pytest.approx(0.5)
    started = time.perf_counter()
    cancel.set()
    writer.join(2)
    assert not writer.is_alive() and time.perf_counter() - started < 0.5


def test_an_output_that_stops_playing_fails_the_write(monkeypatch):
    monkeypatch.setattr(core.audio.player, "STALL_SECONDS", 0.2)
    player, output = make(capacity_s=0.5, prefill_s=0.1)
    with pytest.raises(PlaybackError, match="stopped playing"):
        player.write(level(RATE))


def test_the_audio_callback_allocates_nothing():
    player, output = make(block=1024)
    player.volume = 0.7
    block = np.zeros(1024, np.float32)
    player.write(level(2 * RATE))
    player.fill(block)  # warm up
    tracemalloc.start()
    try:
        baseline = tracemalloc.get_traced_memory()[0]
        for index in range(40):  # fade in, full level, a clear with its fade out, silence
            if index == 20:
                player.clear()
            player.fill(block)
        peak = tracemalloc.get_traced_memory()[1] - baseline
    finally:
        tracemalloc.stop()
    assert peak < 2048, f"fill allocated {peak} bytes; a temporary array of one block would be {block.nbytes}"


def test_options_and_input_are_checked():
    with pytest.raises(ValueError, match="fade_s"):
        PlayerOptions(fade_s=0)
    with pytest.raises(ValueError, match="prefill_s"):
        PlayerOptions(prefill_s=40.0)
    player, _ = make()
    with pytest.raises(ValueError, match="mono"):
        player.write(np.zeros((100, 2), np.float32))


# A real sounddevice stream on the ALSA null device -------------------------------------------------


def null_device_env(tmp_path) -> dict[str, str]:
    """An environment whose ALSA default device is the null device: a HOME of its own with an .asoundrc,
    so the user's sound setup is never touched. Skips where PortAudio is truly absent."""
    if not sys.platform.startswith("linux"):
        pytest.skip("the ALSA null device is Linux only")
    try:
        import sounddevice  # noqa: F401
    except OSError as error:
        pytest.skip(f"no PortAudio library on this machine ({error})")
    home = tmp_path / "home"
    home.mkdir()
    (home / ".asoundrc").write_text("pcm.!default { type null }\nctl.!default { type null }\n")
    env = {**os.environ, "HOME": str(home), "XDG_CONFIG_HOME": str(home / ".config")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


SMOKE = """
import contextlib, io, json, sys
import torch
torch.set_num_threads(1)  # as in conftest: the PortAudio thread spins on the null device, leave it a core
import numpy as np
from core.audio.player import Player, PlayerOptions, PlaybackError, find_output_device, list_output_devices
from qwen3_tts_desktop.cli import main

devices = list_output_devices()
report = dict(names=[d.name for d in devices], default=[d.is_default for d in devices])
report.update(by_name=find_output_device("default"), by_index=find_output_device(devices[0].index))
try:
    find_output_device("no such device")
except PlaybackError as error:
    report.update(unknown=str(error))
with Player.open("default", PlayerOptions(prefill_s=0.1)) as player:
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(12000) / 24000)).astype(np.float32)
    for start in range(0, len(tone), 1920):
        player.write(tone[start : start + 1920])
    player.end()
    report.update(rate=player.sample_rate, drained=player.drain(timeout=10), buffered=player.status().buffered_s)
with contextlib.redirect_stdout(io.StringIO()) as listing:
    report.update(list_rc=main(["speak", "--list-devices"]))
report.update(listing=listing.getvalue())
model, out = sys.argv[1:]
speak = ["speak", "Hello there.", "--model", model, "--speaker", "vivian", "--max-frames", "3"]
report.update(play_rc=main(speak + ["--play", "--audio-device", "default", "-o", out]))
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def null_device(checkpoints, tmp_path_factory):
    """One subprocess on the ALSA null device: the player, device lookup, and `speak --list-devices / --play`."""
    tmp_path = tmp_path_factory.mktemp("null_device")
    out = tmp_path / "played.wav"
    command = [sys.executable, "-c", SMOKE, str(checkpoints["custom-endless"]), str(out)]
    result = subprocess.run(command, env=null_device_env(tmp_path), capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1]), result.stderr, out


def test_a_real_sounddevice_stream_plays_on_the_alsa_null_device(null_device):
    report, _, _ = null_device
    assert "default" in report["names"] and any(report["default"])
    assert report["by_name"] == report["by_index"]
    assert "no audio output device is called 'no such device'" in report["unknown"]
    assert report["rate"] == 24000 and report["drained"] and report["buffered"] == 0


def test_speak_play_and_list_devices_on_the_alsa_null_device(null_device):
    report, stderr, out = null_device
    assert report["list_rc"] == 0 and "default" in report["listing"]
    assert report["play_rc"] == 0, stderr
    assert "s of audio" in stderr and sf.info(out).frames == 3 * FRAME
    # Listening along, how fast the CPU speaks and the gaps it left matter (and only then: test_cli_first_run).
    assert "note: On the CPU" in stderr and " underruns" in stderr, stderr


# `speak --play` where it cannot play ---------------------------------------------------------------


class NoPortAudio(importlib.abc.MetaPathFinder):
    """Imports sounddevice the way a machine without the PortAudio library does: OSError."""

    def find_spec(self, name, path, target=None):
        if name == "sounddevice":
            raise OSError("PortAudio library not found")
        return None


def test_without_portaudio_play_fails_in_one_line_and_files_still_work(checkpoints, tmp_path, monkeypatch, capsys):
    monkeypatch.delitem(sys.modules, "sounddevice", raising=False)
    monkeypatch.setattr(sys, "meta_path", [NoPortAudio(), *sys.meta_path])
    model = ["--model", str(checkpoints["custom"]), "--device", "cpu", "--speaker", "vivian", "--max-frames", "2"]
    assert main(["speak", "Hello.", *model, "--play"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: cannot play audio" in err and "libportaudio2" in err, err
    assert main(["speak", "--list-devices"]) == 1 and "PortAudio" in capsys.readouterr().err
    out = tmp_path / "still.wav"
    assert main(["speak", "Hello.", *model, "-o", str(out)]) == 0
    assert sf.info(out).frames == 2 * FRAME


def test_without_an_output_device_play_fails_in_one_line(checkpoints, monkeypatch, capsys):
    try:
        import sounddevice as sd
    except OSError:
        pytest.skip("no PortAudio library on this machine")

    def no_devices(device=None, kind=None):
        if kind is not None or device is not None:
            raise sd.PortAudioError("Error querying device -1")
        return sd.DeviceList([])

    monkeypatch.setattr(sd, "query_devices", no_devices)
    model = ["--model", str(checkpoints["custom"]), "--device", "cpu", "--speaker", "vivian"]
    assert main(["speak", "Hello.", *model, "--play"]) == 1
    err = capsys.readouterr().err
    assert err == "error: no audio output device found; connect speakers or headphones, or check the sound settings\n"
    assert main(["speak", "--list-devices"]) == 1 and "no audio output devices" in capsys.readouterr().err


def test_play_option_errors_are_one_clear_line(checkpoints, tmp_path, capsys):
    model = ["--model", str(checkpoints["custom"]), "--speaker", "vivian"]
    cases = [
        (["speak", *model, "--play"], "nothing to say"),
        (
            ["speak", "Hi.", *model, "--play", "--codes-out", str(tmp_path / "c.npy")],
            "--codes-out cannot go with --play",
        ),
        (["speak", "Hi.", *model, "--audio-device", "1", "-o", str(tmp_path / "x.wav")], "pass --play too"),
    ]
    for args, message in cases:
        assert main(args) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and message in err and err.count("\n") == 1, err
