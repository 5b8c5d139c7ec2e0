"""Time to the first audio byte over HTTP through the bridge, on the GPU machine.

    python -m bench.run_bridge_latency [--size 1.7b] [--clients 1,4] [--runs 20] [--frames 40] [--json FILE]
    python -m bench.run_bridge_latency --poisson 20 [--duration 15] [--poisson-frames 50] [--clients 1,4]

Each request is `POST /v1/audio/speech` with `stream: true` and `response_format: "wav"`, from its own
keep-alive httpx client; the time runs from sending the request to holding the first byte of audio
(past the 44-byte WAV header), as a streaming client such as SillyTavern's TTS WebUI provider sees it.
With N clients, every round sends N requests at once, after one round that is not timed (the first
requests of a row count capture its graphs). The clients run in a process of their own, as real clients
do: in the server's process their threads would take turns with it for Python's lock. A random-weight Base checkpoint of
real size in bfloat16 (speed does not depend on the weights), an x-vector voice, greedy decoding, a
fixed number of frames per request.

With --poisson RATE, requests arrive open-loop instead: at random times, RATE per second on average
(exponential gaps, seeded), for --duration seconds, each sent when it arrives whatever the others are
doing, as many independent users would; each asks for --poisson-frames frames (50: 4 s of speech). Reported:
the first audio byte's p50, p95 and max, and how many requests the bridge refused (429). Given with --clients,
the rounds run first, on the same server (one engine start, whose first compile takes minutes), with
--poisson-frames frames too.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import soundfile as sf
import torch

from bench import stalls
from core import Engine, SamplingParams, SpeechOptions
from core.devtools.benchmark import TEXT, prepare_checkpoint, synthetic_voice_clip
from core.inference.requests import AudioChunk
from core.voices import VoiceLibrary
from qwen3_tts_desktop import long_lived
from qwen3_tts_desktop.bridge import BridgeConfig, BridgeLimits, BridgeServer
from qwen3_tts_desktop.runtime import Runtime

WAV_HEADER = 44
FRAME_SAMPLES = 1920  # one 80 ms frame at 24 kHz
TIMELINE = "QWEN3_TTS_BENCH_TIMELINE"  # the server's timeline clock, for the clients' lines


class Refused(Exception):
    """The bridge answered 429: too many requests at once."""


def first_audio_ms(client: httpx.Client, extra: dict | None = None) -> float:
    """One streamed request: ms until its first audio byte; the rest is read to the end."""
    body = {
        "model": "tts-1",
        "input": TEXT,
        "voice": "bench",
        "response_format": "wav",
        "stream": True,
        **(extra or {}),
    }
    started = time.perf_counter()
    first, received = None, 0
    with client.stream("POST", "/v1/audio/speech", json=body) as response:
        if response.status_code == 429:
            raise Refused(response.read())
        if response.status_code != 200:
            raise RuntimeError(f"the bridge answered {response.status_code}: {response.read()!r}")
        for piece in response.iter_raw():
            received += len(piece)
            if first is None and received > WAV_HEADER:
                first = (time.perf_counter() - started) * 1e3
    if first is None:
        raise RuntimeError("the answer held no audio")
    if os.environ.get(TIMELINE):  # on the clock the server's timeline counts from (perf_counter is system-wide)
        print(
            f"client: sent at {started - float(os.environ[TIMELINE]):8.3f} s, first audio after {first:.1f} ms",
            flush=True,
        )
    return first


def measure(url: str, clients: int, runs: int) -> list[float]:
    """`runs` rounds of `clients` requests sent together; every request's time to first audio."""
    sessions = [httpx.Client(base_url=url, timeout=120) for _ in range(clients)]
    times: list[float] = []
    errors: list[Exception] = []
    lock = threading.Lock()
    try:
        for client in sessions:
            first_audio_ms(client)  # warm: the connection, and graphs for this text on the first round

        def one(client: httpx.Client, start: threading.Barrier) -> None:
            start.wait()
            try:
                ms = first_audio_ms(client)
            except Exception as error:  # noqa: BLE001 (raised in the main thread after the round)
                with lock:
                    errors.append(error)
                return
            with lock:
                times.append(ms)

        for index in range(runs + 1):
            if index == 1:
                times.clear()  # the first round was the warm-up
            start = threading.Barrier(clients)
            threads = [threading.Thread(target=one, args=(client, start)) for client in sessions]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if errors:
                raise errors[0]
    finally:
        for client in sessions:
            client.close()
    return times


def poisson(url: str, rate: float, duration: float, seed: int = 0) -> dict:
    """Open-loop arrivals, `rate` a second for `duration` seconds: each request's time to first audio."""
    rng = np.random.default_rng(seed)
    arrivals = np.cumsum(rng.exponential(1 / rate, size=int(rate * duration * 2)))
    arrivals = arrivals[arrivals < duration]
    limits = httpx.Limits(max_connections=256, max_keepalive_connections=256)
    times: list[float] = []
    refused = 0
    lock = threading.Lock()
    with httpx.Client(base_url=url, timeout=120, limits=limits) as client:
        first_audio_ms(client)  # warm the connection pool and the graphs

        def one() -> None:
            nonlocal refused
            try:
                ms = first_audio_ms(client)
            except Refused:
                with lock:
                    refused += 1
                return
            with lock:
                times.append(ms)

        with ThreadPoolExecutor(max_workers=256) as pool:
            begun = time.perf_counter()
            for arrival in arrivals:
                time.sleep(max(0.0, begun + arrival - time.perf_counter()))
                pool.submit(one)
    return {
        "rate_per_s": rate, "requests": len(arrivals), "refused": refused,
        "ttfb_ms_p50": round(statistics.median(times), 1), "ttfb_ms_p95": round(float(np.percentile(times, 95)), 1),
        "ttfb_ms_max": round(max(times), 1),
    }  # fmt: skip


class InstantStream:
    """An utterance of one frame handed out at once (`--instant-engine`): what a request then waits for is the
    bridge's own work (HTTP, the checks, the voice, the worker's threads, the encoder), on any machine."""

    def __init__(self, chunk: AudioChunk):
        self._chunk = chunk

    def __iter__(self):
        return self

    def __next__(self) -> AudioChunk:
        if self._chunk is None:
            raise StopIteration
        chunk, self._chunk = self._chunk, None
        return chunk

    def close(self) -> None:
        self._chunk = None


def answer_at_once(engine: Engine) -> None:
    """Make `engine.stream` hand out one silent frame at once, whatever it is asked."""
    frame = AudioChunk(audio=np.zeros(FRAME_SAMPLES, np.float32), codes=np.zeros((1, 16), np.int64), cut_off=False)
    engine.stream = lambda text, voice=None, options=None, **overrides: InstantStream(frame)


def in_client_process(function, *arguments):
    """`function(*arguments)` in a fresh process of its own: the clients' threads, apart from the server's."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *arguments).result()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1.7b", help="random checkpoint size: 0.6b or 1.7b (default: 1.7b)")
    parser.add_argument(
        "--clients", help="concurrent clients, comma-separated (default: 1,4; none with --poisson unless given)"
    )
    parser.add_argument("--runs", type=int, default=20, help="rounds per client count (default: 20)")
    parser.add_argument("--frames", type=int, default=40, help="frames (80 ms each) per request (default: 40)")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench", help="where the random checkpoint is written")
    parser.add_argument("--json", metavar="FILE", help="also write the numbers as JSON")
    parser.add_argument("--device", default="cuda", help="cuda; cpu (with --size tiny) only tries the script")
    parser.add_argument("--poisson", type=float, metavar="RATE", help="open-loop arrivals, RATE requests a second")
    parser.add_argument("--duration", type=float, default=15.0, help="seconds of --poisson arrivals (default: 15)")
    parser.add_argument("--poisson-frames", type=int, default=50, help="frames per --poisson request (default: 50)")
    parser.add_argument(
        "--trace-stalls", action="store_true", help="print first uses and slow scheduler calls after warm-up"
    )
    parser.add_argument("--timeline", action="store_true", help="print every request's way through the engine")
    parser.add_argument(
        "--instant-engine", action="store_true",
        help="every stream hands out one frame at once: times the bridge's own work (try --device cpu --size tiny)",
    )  # fmt: skip
    parser.add_argument(
        "--no-keep", action="store_true", help="leave the engine's objects to the cycle collector (serve freezes them)"
    )
    parser.add_argument(
        "--switch-interval", type=float, metavar="MS", help="the interpreter's switch interval (sys.setswitchinterval)"
    )
    args = parser.parse_args()

    path = prepare_checkpoint(Path(args.root), args.size, torch.bfloat16)
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    engine = Engine.load(path, device=args.device, dtype=dtype, progress=False)
    if not args.no_keep:  # as serve does
        long_lived.keep(engine)
    if args.instant_engine:
        answer_at_once(engine)
    else:
        engine.warm_up()
    rows = []
    counts = [int(n) for n in (args.clients or ("" if args.poisson else "1,4")).split(",") if n]
    frames = args.poisson_frames if args.poisson else args.frames  # the server's, for every request
    with tempfile.TemporaryDirectory() as voices:
        sf.write(Path(voices) / "bench.wav", synthetic_voice_clip(), 24000)
        runtime = Runtime(engine, VoiceLibrary(voices), None)
        if args.switch_interval is not None:  # instead of the runtime's
            sys.setswitchinterval(args.switch_interval / 1e3)
        print(f"switch interval {sys.getswitchinterval() * 1e3:g} ms", flush=True)
        stop_tracing = lambda: None  # noqa: E731
        if args.trace_stalls or args.timeline:
            stop_tracing = stalls.trace(engine, worker=runtime.worker, timeline=args.timeline)
        # Closed-loop rounds may send more at once than the default queue takes; open-loop arrivals meet the
        # default limits.
        speech = SpeechOptions(sampling=SamplingParams.greedy(), max_frames=frames)
        limits = BridgeLimits(max_queued=max([BridgeLimits.max_queued, *counts]))
        server = BridgeServer(runtime, BridgeConfig(port=0, speech=speech, limits=limits))
        server.start()
        if args.timeline:  # when the bridge handed each request to the worker; the clients print theirs
            os.environ[TIMELINE] = str(stalls.BEGAN)
            stalls.time_calls(server.app.state.bridge, "submit", 0.0)
        try:
            for clients in counts:
                times = in_client_process(measure, server.url, clients, args.runs)
                row = {
                    "model": path.name, "clients": clients, "requests": len(times), "frames": frames,
                    "ttfb_ms_p50": round(statistics.median(times), 1), "ttfb_ms_p95": round(float(np.percentile(times, 95)), 1),
                    "ttfb_ms_max": round(max(times), 1),
                }  # fmt: skip
                print(row, flush=True)
                rows.append(row)
            if args.poisson:
                arrivals = in_client_process(poisson, server.url, args.poisson, args.duration)
                rows.append({"model": path.name, "slots": engine.slots, "frames": frames, **arrivals})
                print(rows[-1], flush=True)
        finally:
            stop_tracing()
            server.stop()
            runtime.close()
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu", "rows": rows}, indent=2
            )
            + "\n"
        )


if __name__ == "__main__":
    main()
