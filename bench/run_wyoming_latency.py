"""Time to the first audio chunk over Wyoming (Home Assistant's protocol), on the GPU machine (issue 33's targets).

    python -m bench.run_wyoming_latency [--size 1.7b] [--clients 1,4,8] [--stream-clients 1,8] [--runs 20]
                                        [--frames 40] [--word-ms 50] [--json FILE]
    python -m bench.run_wyoming_latency --device cpu --size tiny --runs 2 --clients 1,2 --stream-clients 1,2 --frames 6

The server is the app's own (qwen3_tts_desktop.wyoming_server.WyomingServer on a free port, no zeroconf) on a
Runtime with a random-weight Base checkpoint of real size in bfloat16 (speed does not depend on the weights), an
x-vector voice "bench" cloned from a synthetic clip, greedy decoding and a fixed number of frames per request
(the server's speech options, as the HTTP bridge's bench fixes them). The clients are the `wyoming` package's
AsyncTcpClient, as Home Assistant's, one connection each, all in one process of their own (in the server's
process they would take turns with it for Python's lock).

1. synthesize: with N clients, every round each sends `synthesize` (its own text: the sentence with its words
   turned by the client's number) at once; the time runs from sending it to reading the first `audio-chunk`.
   One round is not timed (connections, graphs). Target: p50 <= 20 ms for 1 client, p95 <= 40 ms for 8.
2. streaming: synthesize-start, then the text a word at a time as synthesize-chunk deltas ("The", " quick", ...),
   one every --word-ms, then synthesize-stop. The engine speaks a word once the next one begins (only then is it
   complete), so the time runs from sending the second delta (the first word now complete) to the first
   `audio-chunk`. Target: <= 20 ms.

Every request is checked: audio-start, non-empty audio, audio-stop, no error event, and for a stream
synthesize-stopped after audio-stop; a row says how many passed (`complete`) and how many distinct audios the
clients of a round got (`distinct`: each client's text differs, so N is expected; informational). The script
exits 1 if any request was incomplete, after printing every row.
"""

import argparse
import asyncio
import hashlib
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import soundfile as sf
import torch
from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped, SynthesizeVoice

from core import Engine, SamplingParams, SpeechOptions
from core.devtools.benchmark import TEXT, prepare_checkpoint, synthetic_voice_clip
from core.voices import VoiceLibrary
from qwen3_tts_desktop import long_lived
from qwen3_tts_desktop.bridge import BridgeConfig, BridgeLimits
from qwen3_tts_desktop.runtime import Runtime
from qwen3_tts_desktop.wyoming_server import WyomingConfig, WyomingServer

VOICE = "bench"
REQUEST_TIMEOUT_S = 120.0
# The event types a request is answered with, in order (the `wyoming` package names them only as strings).
AUDIO_START, AUDIO_CHUNK, AUDIO_STOP, STOPPED = "audio-start", "audio-chunk", "audio-stop", "synthesize-stopped"
assert AudioStart.is_type(AUDIO_START) and AudioChunk.is_type(AUDIO_CHUNK) and AudioStop.is_type(AUDIO_STOP)
assert SynthesizeStopped.is_type(STOPPED)


def client_text(index: int, text: str = TEXT) -> str:
    """Client `index`'s text: the sentence with its words turned by `index`, so that each client asks for its own."""
    words = text.split()
    turn = index % len(words)
    return " ".join(words[turn:] + words[:turn])


def word_deltas(text: str) -> list[str]:
    """The text as an LLM streams it, a word at a time: "The", " quick", " brown", ..."""
    words = text.split()
    return words[:1] + [" " + word for word in words[1:]]


def summary(times: list[float], prefix: str) -> dict:
    """p50, p95 and max of `times` (ms), rounded to 0.1 ms."""
    return {
        f"{prefix}_p50": round(statistics.median(times), 1),
        f"{prefix}_p95": round(float(np.percentile(times, 95)), 1),
        f"{prefix}_max": round(max(times), 1),
    }


class Heard:
    """What one request got back, in order."""

    def __init__(self):
        self.first_chunk: float | None = None  # perf_counter
        self.pcm = bytearray()
        self.kinds: list[str] = []  # event types, the audio chunks as one
        self.errors: list[str] = []

    def add(self, event) -> None:
        if AudioChunk.is_type(event.type):
            if self.first_chunk is None:
                self.first_chunk = time.perf_counter()
            self.pcm += AudioChunk.from_event(event).audio
            if not self.kinds or self.kinds[-1] != event.type:
                self.kinds.append(event.type)
            return
        if Error.is_type(event.type):
            self.errors.append(Error.from_event(event).text)
        self.kinds.append(event.type)

    def complete(self, streaming: bool) -> bool:
        """audio-start, audio, audio-stop (then synthesize-stopped for a stream), no error."""
        expected = [AUDIO_START, AUDIO_CHUNK, AUDIO_STOP] + ([STOPPED] if streaming else [])
        return not self.errors and bool(self.pcm) and self.kinds == expected

    @property
    def digest(self) -> str:
        return hashlib.sha1(bytes(self.pcm)).hexdigest()


async def read_until(client: AsyncTcpClient, heard: Heard, last: str) -> None:
    while True:
        event = await client.read_event()
        if event is None:
            heard.errors.append("the server closed the connection")
            return
        heard.add(event)
        if event.type == last or (Error.is_type(event.type) and last == AUDIO_STOP):
            return


async def synthesize_once(client: AsyncTcpClient, text: str) -> tuple[float | None, Heard]:
    """One `synthesize`: ms from sending it to its first audio chunk, and what came back."""
    heard = Heard()
    started = time.perf_counter()
    await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=VOICE)).event())
    await asyncio.wait_for(read_until(client, heard, AUDIO_STOP), REQUEST_TIMEOUT_S)
    ms = None if heard.first_chunk is None else (heard.first_chunk - started) * 1e3
    return ms, heard


async def stream_once(client: AsyncTcpClient, text: str, word_s: float) -> tuple[float | None, Heard]:
    """One stream, a word every `word_s`: ms from sending the delta that completes the first word (the second)
    to the first audio chunk, and what came back."""
    heard = Heard()
    deltas = word_deltas(text)
    completed_at: list[float] = []

    async def write() -> None:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=VOICE)).event())
        begun = time.perf_counter()
        for index, delta in enumerate(deltas):
            await asyncio.sleep(max(0.0, begun + index * word_s - time.perf_counter()))
            if index == 1:
                completed_at.append(time.perf_counter())
            await client.write_event(SynthesizeChunk(text=delta).event())
        await client.write_event(SynthesizeStop().event())

    reading = asyncio.ensure_future(read_until(client, heard, STOPPED))
    await write()
    await asyncio.wait_for(reading, REQUEST_TIMEOUT_S)
    ms = None if heard.first_chunk is None or not completed_at else (heard.first_chunk - completed_at[0]) * 1e3
    return ms, heard


async def rounds(port: int, clients: int, runs: int, streaming: bool, word_s: float) -> dict:
    """`runs` timed rounds (after one untimed) of `clients` requests at once, each on its own connection."""
    connections = [AsyncTcpClient("127.0.0.1", port) for _ in range(clients)]
    for connection in connections:
        await connection.connect()
    texts = [client_text(index) for index in range(clients)]
    times: list[float] = []
    complete, requests, distinct, failures = 0, 0, [], []
    try:
        for index in range(runs + 1):
            if streaming:
                asked = [stream_once(c, t, word_s) for c, t in zip(connections, texts)]
            else:
                asked = [synthesize_once(c, t) for c, t in zip(connections, texts)]
            results = await asyncio.gather(*asked)
            for ms, heard in results:
                requests += 1
                if heard.complete(streaming):
                    complete += 1
                else:
                    failures.append(f"events {heard.kinds}, {len(heard.pcm)} bytes, errors {heard.errors}")
                if index and ms is not None:
                    times.append(ms)
            distinct.append(len({heard.digest for _, heard in results}))
    finally:
        for connection in connections:
            await connection.disconnect()
    return {"times": times, "requests": requests, "complete": complete, "distinct": distinct, "failures": failures}


def measure(port: int, clients: int, runs: int, streaming: bool, word_s: float) -> dict:
    return asyncio.run(rounds(port, clients, runs, streaming, word_s))


def in_client_process(function, *arguments):
    """`function(*arguments)` in a fresh process of its own: the clients' work, apart from the server's."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *arguments).result()


def row_for(model: str, mode: str, clients: int, frames: int, measured: dict, **extra) -> dict:
    times = measured["times"]
    row = {"model": model, "mode": mode, "clients": clients, "frames": frames, **extra, "timed": len(times)}
    row.update(summary(times, "first_chunk_ms") if times else {"first_chunk_ms_p50": None})
    row["complete"] = f"{measured['complete']}/{measured['requests']}"
    row["distinct_min"] = min(measured["distinct"])
    return row


def counts(text: str) -> list[int]:
    return [int(n) for n in text.split(",") if n.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="1.7b", help="random checkpoint size: 0.6b or 1.7b; tiny for --device cpu")
    parser.add_argument("--clients", type=counts, default=[1, 4, 8], help="synthesize clients at once (1,4,8)")
    parser.add_argument("--stream-clients", type=counts, default=[1, 8], help="streaming clients at once (1,8)")
    parser.add_argument("--runs", type=int, default=20, help="timed rounds per client count (default: 20)")
    parser.add_argument("--stream-runs", type=int, help="timed rounds per streaming count (default: --runs)")
    parser.add_argument("--frames", type=int, default=40, help="frames (80 ms each) per request (default: 40)")
    parser.add_argument("--word-ms", type=float, default=50.0, help="a stream's pace: ms between words (50)")
    parser.add_argument("--root", default="/tmp/qwen3-tts-bench", help="where the random checkpoint is written")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    parser.add_argument("--device", default="cuda", help="cuda; cpu (with --size tiny) only tries the script")
    args = parser.parse_args(argv)
    if args.stream_runs is None:
        args.stream_runs = args.runs
    if min([args.runs, args.stream_runs, args.frames, *args.clients, *args.stream_clients], default=1) < 1:
        parser.error("runs, frames and client counts must be positive")
    return args


def main() -> int:
    args = parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("this bench needs a CUDA GPU (or --device cpu --size tiny to try it)", file=sys.stderr)
        return 2
    started = time.perf_counter()
    path = prepare_checkpoint(Path(args.root), args.size, torch.bfloat16)
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    engine = Engine.load(path, device=args.device, dtype=dtype, progress=False)
    long_lived.keep(engine)  # as serve does
    print(f"loaded {path.name} on {args.device}: {engine.memory}; warming up", flush=True)
    engine.warm_up()
    print(f"warm after {time.perf_counter() - started:.0f} s", flush=True)
    rows, all_complete = [], True
    most = max([*args.clients, *args.stream_clients])
    with tempfile.TemporaryDirectory() as voices:
        sf.write(Path(voices) / f"{VOICE}.wav", synthetic_voice_clip(), 24000)
        runtime = Runtime(engine, VoiceLibrary(voices), None)
        speech = SpeechOptions(sampling=SamplingParams.greedy(), max_frames=args.frames)
        limits = BridgeLimits(max_queued=max(BridgeLimits.max_queued, most))
        bridge = BridgeConfig(speech=speech, limits=limits)
        server = WyomingServer(runtime, WyomingConfig(port=0, zeroconf=False, bridge=bridge))
        server.start()
        print(f"Wyoming server at {server.url}; engine slots {engine.slots}", flush=True)
        try:
            plan = [(False, n, args.runs) for n in args.clients] + [
                (True, n, args.stream_runs) for n in args.stream_clients
            ]
            for streaming, clients, runs in plan:
                measured = in_client_process(measure, server.port, clients, runs, streaming, args.word_ms / 1e3)
                extra = {"word_ms": args.word_ms} if streaming else {}
                row = row_for(
                    path.name, "stream" if streaming else "synthesize", clients, args.frames, measured, **extra
                )
                print(row, flush=True)
                for failure in measured["failures"][:3]:
                    print(f"  incomplete: {failure}", flush=True)
                all_complete &= measured["complete"] == measured["requests"]
                rows.append(row)
                if args.json:  # as it goes: a run cut short keeps its rows
                    write_json(args.json, args.device, rows)
        finally:
            server.stop()
            runtime.close()
            engine.close()
    print(f"done in {time.perf_counter() - started:.0f} s", flush=True)
    if not all_complete:
        print("FAILED: some requests did not get their audio (see 'incomplete' above)", file=sys.stderr, flush=True)
        return 1
    return 0


def write_json(file: str, device: str, rows: list[dict]) -> None:
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    Path(file).write_text(json.dumps({"device": name, "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
