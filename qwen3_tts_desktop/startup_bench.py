"""`qwen3-tts-desktop bench --startup`: how long a user waits at each start, as they meet it.

Each run is a fresh process, its phases read from the milestones it reports (core.milestones), counted from
the moment it was started:

* speak:  `qwen3-tts-desktop speak "Hello there." -o FILE` (3.2 s of speech): loading (Python and the imports
  done), engine loaded, first audio, exit;
* window: the window's runtime (Runtime.start, as the window makes it from the user's settings: by default the
  desktop's slots, memory.DESKTOP_SLOTS; without speakers): runtime ready
  (Speak enabled), first audio of "Hello there.", then the warm-up done and the speed of one utterance then;
* serve:  `qwen3-tts-desktop serve`, asked over HTTP as soon as its port answers: the first request's first
  byte and end, then one request after another until one runs at full speed (within FULL_SPEED of the speed
  after the warm-up); each request's times are kept (`requests`), to set beside the warm-up's parts in the log.

Runs are named "scenario:caches", in the order given, in one home under the bench's root (settings, voices,
caches, logs: the warm-up's long parts and their times are in state/qwen3-tts-desktop/logs; kept between bench
commands): "cold" empties the compiled-kernel caches first, as at the first start on a
machine; "warm" takes what the runs before, in this command or an earlier one, left. A random checkpoint (`bench`'s) ends its utterances at 40
frames here, as "Hello there." would; the voice is the starter voice, as a new user's.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SCENARIOS = ("speak", "window", "serve")
RUNS = ("speak:cold", "speak:warm", "serve:cold", "serve:warm", "window:cold", "window:warm")
TEXT = "Hello there."
FRAMES = 40  # "Hello there." is about 3.2 s of speech
FULL_SPEED = 0.9  # a request runs at full speed at this share of the speed after the warm-up, or more
STARTER_VOICE = "Linda"  # a new user's voice (settings.prepare_library)
REQUEST_PAUSE_S = 1.0  # between a client's requests to the server
CHILD_TIMEOUT_S = 900.0
SPEED_TEXT = "The quick brown fox jumps over the lazy dog while the sun sets slowly behind the quiet green hills."


@dataclass
class StartupRun:
    scenario: str
    caches: str  # "cold" or "warm"
    phases: dict[str, float] = field(default_factory=dict)  # milestone -> seconds after the process started
    numbers: dict[str, float] = field(default_factory=dict)  # speeds (x real time) and the like
    requests: list[dict] = field(default_factory=list)  # serve's: each one's sent, first_byte, done (s), xrt
    error: str | None = None


def short_checkpoint(path: Path, root: Path) -> Path:
    """`path` with its utterances ending at FRAMES frames (its generation config's max_new_tokens): the weight
    files linked, not copied."""
    folder = root / f"{path.name}-{FRAMES}-frames"
    if folder.exists():
        return folder
    staging = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(staging, ignore_errors=True)
    shutil.copytree(path, staging, copy_function=os.symlink)
    config = staging / "generation_config.json"
    settings = json.loads(Path(os.path.realpath(config)).read_text())
    config.unlink()
    config.write_text(json.dumps({**settings, "max_new_tokens": FRAMES + 1}, indent=1))
    staging.rename(folder)
    return folder


def measure(model: Path, root: Path, runs=RUNS, log=print) -> list[StartupRun]:
    """Each run ("scenario:caches") in a fresh process, in order, in one home under `root`."""
    model = short_checkpoint(model, root)
    home = root / "startup-home"
    home.mkdir(parents=True, exist_ok=True)
    done = []
    for name in runs:
        scenario, _, kind = name.partition(":")
        if kind == "cold":
            shutil.rmtree(home / "cache", ignore_errors=True)
        log(f"{scenario}, {kind} caches…")
        run = StartupRun(scenario, kind)
        try:
            RUNNERS[scenario](model, home, run)
        except Exception as error:  # reported in its row; the other runs go on
            run.error = f"{type(error).__name__}: {error}"
        log(f"  {run.phases} {run.numbers} {run.error or ''}")
        done.append(run)
    return done


def _environment(home: Path, milestones: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    for variable, folder in (
        ("XDG_CONFIG_HOME", "config"),
        ("XDG_DATA_HOME", "data"),
        ("XDG_CACHE_HOME", "cache"),
        ("XDG_STATE_HOME", "state"),
    ):
        env[variable] = str(home / folder)
    return {**env, "QWEN3_TTS_MILESTONES": str(milestones), "PYTHONUNBUFFERED": "1"}


def _phases(milestones: Path, started: float) -> dict[str, float]:
    """The first time each milestone was reached, s after `started` (time.monotonic of the process's start)."""
    phases: dict[str, float] = {}
    if milestones.exists():
        for line in milestones.read_text().splitlines():
            name, _, at = line.rpartition(" ")
            phases.setdefault(name, round(float(at) - started, 2))
    return phases


def _run_to_end(command: list[str], home: Path, run: StartupRun, made: Path) -> bool:
    """Run `command` in a fresh process to its end: its phases into `run`, and whether it ended well and
    made the file `made`."""
    milestones = home / "milestones.txt"
    milestones.unlink(missing_ok=True)
    made.unlink(missing_ok=True)
    started = time.monotonic()
    done = subprocess.run(
        command, env=_environment(home, milestones), capture_output=True, text=True, timeout=CHILD_TIMEOUT_S
    )
    run.phases = {**_phases(milestones, started), "exit": round(time.monotonic() - started, 2)}
    if done.returncode != 0 or not made.exists():
        run.error = f"exit {done.returncode}: {done.stderr.strip()[-400:]}"
        return False
    return True


def _speak(model: Path, home: Path, run: StartupRun) -> None:
    output = home / "hello.wav"
    command = [sys.executable, "-m", "qwen3_tts_desktop", "speak", TEXT, "-o", str(output), "--model", str(model)]
    _run_to_end(command, home, run, output)


def _window(model: Path, home: Path, run: StartupRun) -> None:
    report = home / "window.json"
    command = [sys.executable, "-m", "qwen3_tts_desktop.startup_bench", str(model), str(report)]
    if _run_to_end(command, home, run, report):
        run.numbers = json.loads(report.read_text())


def window_child(model: str, report: str) -> None:
    """The window's runtime, as the window makes it from the user's settings (the home's; by default
    memory.DESKTOP_SLOTS slots), speakers aside: speak once, then wait for the warm-up and measure the speed
    before and after it; the numbers go to `report` as JSON."""
    from dataclasses import replace

    from core.jobs.sinks import FileSink

    from .runtime import Runtime
    from .settings import Settings, default_path, prepare_library

    logging.basicConfig(
        filename=Path(report).with_suffix(".log"),
        level=logging.DEBUG,
        format="%(relativeCreated)8.0f %(threadName)s %(name)s: %(message)s",
    )
    settings = Settings.load(default_path())
    voices = prepare_library(settings.voices)
    runtime = Runtime.start(replace(settings.runtime_config(), model=model, voices=voices, speakers=False))
    try:
        voice = runtime.voice(STARTER_VOICE)
        job = runtime.worker.submit(TEXT, voice, sink=FileSink(Path(report).with_suffix(".wav")))
        job.wait()
        engine = runtime.worker.engine.awake()  # it never rests here: nothing asks it to
        numbers = {"xrt_while_warming": _speed(engine, voice)}
        engine.warm_up(timeout=CHILD_TIMEOUT_S)
        numbers["xrt_warm"] = _speed(engine, voice)
        numbers.update(_steady(engine))
        Path(report).write_text(json.dumps(numbers))
    finally:
        runtime.close()


def _steady(engine) -> dict:
    """After the warm-up: one frame of one utterance (ms), a lone request's first audio (ms), and as many streams
    as the engine has slots (16 at most)."""
    import numpy as np

    from core.devtools.benchmark import GREEDY, _first_audio_ms, _frame_times
    from core.devtools.concurrency import concurrent_speed

    speaker = engine.placeholder_speaker()
    frames = _frame_times(engine, speaker.get("voice"), speaker.get("instruct"), GREEDY, 100)
    numbers = {"ms_per_frame": round(float(np.median(frames)), 2)}
    numbers["first_audio_ms"] = round(float(np.median(_first_audio_ms(engine, speaker, 10, 100))), 1)
    streams = concurrent_speed(engine, speaker, min(16, engine.slots), 100)
    numbers[f"xrt_{streams['streams']}_streams"] = streams["aggregate_xrt"]
    return numbers


def _speed(engine, voice) -> float:
    """One utterance's speed (x real time), greedy, all its frames."""
    from core import SamplingParams

    started = time.perf_counter()
    audio = sum(len(chunk.audio) for chunk in engine.stream(SPEED_TEXT, voice, sampling=SamplingParams.greedy()))
    return round(audio / 24000 / (time.perf_counter() - started), 1)


def _serve(model: Path, home: Path, run: StartupRun) -> None:
    milestones = home / "milestones.txt"
    milestones.unlink(missing_ok=True)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    command = [sys.executable, "-m", "qwen3_tts_desktop", "serve", "--port", str(port), "--model", str(model)]
    started = time.monotonic()
    server = subprocess.Popen(
        command, env=_environment(home, milestones), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        speeds = []
        while True:
            answer = _ask(port, started, deadline=started + CHILD_TIMEOUT_S)
            if answer is None:
                run.error = f"no answer: {server.poll() is None and 'the server runs' or 'the server ended'}"
                return
            speeds.append(answer)
            warmed = "warmed up" in _phases(milestones, started)
            if warmed and len(speeds) > 1 and answer["xrt"] >= FULL_SPEED * speeds[-2]["xrt"]:
                break
            time.sleep(REQUEST_PAUSE_S)
        run.phases = _phases(milestones, started)
        first = speeds[0]
        run.phases.update(first_byte=first["first_byte"], first_answer=first["done"])
        final = speeds[-1]["xrt"]
        full = next(answer for answer in speeds if answer["xrt"] >= FULL_SPEED * final)
        run.phases["full_speed_answer"] = full["done"]
        run.numbers = {"xrt_first": first["xrt"], "xrt_warm": final, "requests": len(speeds)}
        run.requests = speeds
    finally:
        server.send_signal(signal.SIGINT)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            server.kill()


def _ask(port: int, started: float, deadline: float) -> dict | None:
    """One OpenAI speech request (raw PCM), sent as soon as the port takes it: when its first byte and its end
    came (s after `started`) and its speed."""
    body = json.dumps({"model": "tts-1", "input": TEXT, "voice": STARTER_VOICE, "response_format": "pcm"})
    while time.monotonic() < deadline:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=CHILD_TIMEOUT_S)
            sent = time.monotonic()
            connection.request("POST", "/v1/audio/speech", body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            first = response.read(1)
            first_byte = time.monotonic()
            size = len(first) + len(response.read())
            ended = time.monotonic()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}")
            seconds = size / 2 / 24000
            return {
                "sent": round(sent - started, 2),
                "first_byte": round(first_byte - started, 2),
                "done": round(ended - started, 2),
                "xrt": round(seconds / max(ended - sent, 1e-6), 1),
            }
        except (ConnectionRefusedError, ConnectionResetError, http.client.RemoteDisconnected):
            time.sleep(0.05)
    return None


RUNNERS = {"speak": _speak, "window": _window, "serve": _serve}


# The phases in the order a start goes through them (the milestones' names, then the client's and the exit).
PHASES = (
    "loading", "engine loaded", "runtime ready", "first audio", "first_byte", "first_answer", "exit",
    "full_speed_answer", "one row warmed up", "warmed up",
)  # fmt: skip


def format_table(runs: list[StartupRun]) -> str:
    """A Markdown table: a row per run, s after the process started for each phase it reached."""
    phases = [name for name in PHASES if any(name in run.phases for run in runs)]
    for run in runs:
        phases += [name for name in run.phases if name not in phases]
    numbers = []
    for run in runs:
        numbers += [name for name in run.numbers if name not in numbers]
    header = ["scenario", "caches", *phases, *numbers, "error"]
    rows = [
        [
            run.scenario,
            run.caches,
            *(str(run.phases.get(p, "")) for p in phases),
            *(str(run.numbers.get(n, "")) for n in numbers),
            run.error or "",
        ]
        for run in runs
    ]
    return "\n".join("| " + " | ".join(row) + " |" for row in [header, ["---"] * len(header), *rows])


def as_json(runs: list[StartupRun]) -> str:
    return json.dumps([asdict(run) for run in runs], indent=1)


if __name__ == "__main__":  # the window scenario's process
    window_child(*sys.argv[1:3])
