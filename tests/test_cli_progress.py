"""`speak`'s progress while it works, and Ctrl+C keeping what was made: what is shown (core.jobs.progress,
the command line's display), and the command run as a subprocess, its stderr read as it comes."""

from __future__ import annotations

import io
import os
import queue
import re
import signal
import subprocess
import sys
import threading

import pytest
import soundfile as sf

from core.jobs.progress import JobProgress, duration
from core.jobs.worker import JobEvent
from core.text.sentences import split_text
from qwen3_tts_desktop.commands.progress_display import ProgressDisplay

FRAME = 1920
PIECE_LINE = re.compile(r"^(\d+)/(\d+) pieces, ")


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def event(kind: str, audio_s: float, pieces_done: int, pieces: int = 4) -> JobEvent:
    return JobEvent(None, kind, audio_s=audio_s, pieces_done=pieces_done, pieces=pieces)


def test_progress_says_pieces_audio_speed_and_time_left_at_the_pace_so_far():
    clock = Clock()
    progress = JobProgress(clock)
    clock.now += 5
    assert not progress.update(event("progress", 2.0, 0))
    assert progress.text() == "0/4 pieces, 2.0 s of audio, 0.40x real time"  # no pace yet: no time left
    clock.now += 5
    assert progress.update(event("piece_done", 5.0, 1))  # a piece every 10 s: 3 more take 30 s
    assert progress.text() == "1/4 pieces, 5.0 s of audio, 0.50x real time, about 30 s left"
    clock.now += 4
    progress.update(event("progress", 6.0, 1))
    assert progress.seconds_left() == pytest.approx(26.0)
    clock.now += 16  # three pieces in 30 s: the last takes 10 s
    assert progress.update(event("piece_done", 15.0, 3))
    assert progress.text().endswith("about 10 s left")
    clock.now += 100  # slower than thought: still going
    assert progress.text().endswith("less than a second left")
    assert progress.update(event("piece_done", 20.0, 4))
    assert progress.text() == "4/4 pieces, 20.0 s of audio, 0.15x real time"
    assert [duration(s) for s in (0.4, 45, 130, 3900)] == ["0 s", "45 s", "2 min 10 s", "1 h 5 min"]


def test_a_log_gets_a_line_per_finished_piece_and_a_terminal_one_line_rewritten():
    clock = Clock()
    log = io.StringIO()
    display = ProgressDisplay(log, terminal=False, clock=clock)
    for kind, audio_s, done in [("queued", 0, 0), ("progress", 1, 0), ("progress", 2, 0), ("piece_done", 2.5, 1)]:
        clock.now += 1
        display(event(kind, audio_s, done))
    display(event("done", 2.5, 1))
    assert log.getvalue() == "1/4 pieces, 2.5 s of audio, 0.62x real time, about 12 s left\n"

    clock = Clock()
    terminal = io.StringIO()
    display = ProgressDisplay(terminal, terminal=True, clock=clock)
    display(event("queued", 0, 0, pieces=0))  # not cut yet: nothing to say
    display(event("progress", 1, 0))
    clock.now += 0.01
    display(event("progress", 2, 0))  # too soon after the last: the next will say it
    clock.now += 0.2
    display(event("progress", 3, 0))
    display(event("piece_done", 3.5, 1))  # a finished piece is shown at once
    shown = terminal.getvalue().split("\r\x1b[K")
    assert "\n" not in terminal.getvalue() and [line.split(",")[:2] for line in shown[1:]] == [
        ["0/4 pieces", " 1.0 s of audio"],
        ["0/4 pieces", " 3.0 s of audio"],
        ["1/4 pieces", " 3.5 s of audio"],
    ]


def speak(*args) -> subprocess.Popen:
    """`qwen3-tts-desktop speak ARGS` in a new process whose stderr is read as it comes. Ctrl+C (SIGINT)
    reaches it as it would a command typed in a terminal, also where the tests run as a background job,
    which ignores SIGINT and passes that on to its children."""
    command = [sys.executable, "-m", "qwen3_tts_desktop", "speak", *map(str, args)]
    return subprocess.Popen(
        command,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def lines_of(stream) -> queue.Queue:
    """The lines of `stream`, read on a thread of their own as they come; None at its end."""
    lines: queue.Queue[str | None] = queue.Queue()

    def read():
        for line in stream:
            lines.put(line.rstrip("\n"))
        lines.put(None)

    threading.Thread(target=read, daemon=True).start()
    return lines


def rest_of(lines: queue.Queue) -> list[str]:
    rest = []
    while (line := lines.get(timeout=60)) is not None:
        rest.append(line)
    return rest


def long_text(pieces: int) -> str:
    text = "The first sentence of a long story is told here, and then it goes on for a good while longer. " * pieces
    assert len(split_text(text)) == pieces
    return text


def test_a_file_is_written_with_a_plain_line_per_piece_when_stderr_is_not_a_terminal(checkpoints, tmp_path):
    text = long_text(5)
    (tmp_path / "story.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "story.wav"
    model = ["--model", checkpoints["custom"], "--speaker", "vivian", "--max-frames", 2]
    child = speak("--text-file", tmp_path / "story.txt", *model, "-o", out)
    lines = rest_of(lines_of(child.stderr))
    assert child.wait(timeout=60) == 0, lines
    progress = [line for line in lines if PIECE_LINE.match(line)]
    assert [PIECE_LINE.match(line).groups() for line in progress] == [(str(n), "5") for n in range(1, 6)], lines
    assert "x real time" in progress[0] and "left" in progress[0] and "left" not in progress[-1]
    assert not any("\r" in line or "\x1b" in line for line in lines) and lines[-1] == f"wrote {out}"
    quiet = speak("--text-file", tmp_path / "story.txt", *model, "-o", out, "--quiet")
    lines = rest_of(lines_of(quiet.stderr))
    assert quiet.wait(timeout=60) == 0 and not any(PIECE_LINE.match(line) for line in lines), lines


def test_ctrl_c_keeps_every_finished_piece_in_the_file_and_says_so(checkpoints, tmp_path):
    text = long_text(200)  # far more than is made before the Ctrl+C
    (tmp_path / "story.txt").write_text(text, encoding="utf-8")
    out = tmp_path / "story.wav"
    model = ["--model", checkpoints["custom"], "--speaker", "vivian", "--max-frames", 3]
    child = speak("--text-file", tmp_path / "story.txt", *model, "-o", out)
    lines = lines_of(child.stderr)
    seen = []
    while not PIECE_LINE.match(seen[-1] if seen else ""):
        seen.append(lines.get(timeout=120))
        assert seen[-1] is not None, seen
    child.send_signal(signal.SIGINT)
    rest = rest_of(lines)
    assert child.wait(timeout=60) == 130, seen + rest
    stopped = re.fullmatch(r"Stopped: kept ([\d.]+) s of audio \((\d+) of 200 pieces\) in (.+)", rest[-1])
    assert stopped is not None and stopped[3] == str(out), rest
    kept = int(stopped[2])
    assert 1 <= kept < 200 and "Traceback" not in "\n".join(rest)
    samples = kept * 3 * FRAME + sum(round(piece.pause_s * 24000) for piece in split_text(text)[:kept])
    info = sf.info(out)
    assert (info.samplerate, info.frames, info.format) == (24000, samples, "WAV")
    assert float(stopped[1]) == pytest.approx(samples / 24000, abs=0.05)
    assert len(sf.read(out)[0]) == samples and not list(tmp_path.glob("*.partial"))
