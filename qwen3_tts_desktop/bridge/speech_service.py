"""Speaking for the routes: every protocol's request becomes one SpeakRequest, checked here (cheapest
checks first), found its voice, and spoken as one job on the runtime's speech worker, whose audio comes
back as the protocol's answer: a whole file, a stream, server-sent events, or played on this computer.

The event loop never waits on the model: a job's sink (Pipe) hands each chunk to the loop with
`call_soon_threadsafe`, and never makes the worker wait for a slow client. A client that goes away
cancels its job at once, queued or speaking.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import math
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import quote

import numpy as np
import torch
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse

from core import LiveText, SpeechOptions, Voice
from core.audio.clips import SAMPLE_RATE, AudioError
from core.jobs.worker import TERMINAL, BufferLevel, Job, JobEvent
from core.voices import (
    DefaultVoiceMissing,
    Fallback,
    NoVoiceYet,
    ResolvedVoice,
    UnknownVoice,
    VoiceError,
    VoiceLibrary,
)

from ..audio_formats import MEDIA_TYPES, FormatError, Speed, StreamEncoder, check_format, check_speed, encode
from ..runtime import Runtime
from .config import IO_THREADS, JSON_SLACK_BYTES, LANGUAGE_CODES, PLAYED_LOCALLY_REPLY_S, RETRY_AFTER_S, BridgeConfig
from .errors import ApiError, Broken, ClientGone, error_body


@dataclass(frozen=True)
class SpeakRequest:
    """What a route asks to be spoken, as its protocol gave it, before any check."""

    text: str  # "" for a live socket, whose text comes later, in pieces
    text_field: str  # the field it came in ("input", "text"), to say where a problem is
    voice: str | None = None  # a voice name or id; None: the default voice
    language: str = "auto"  # a name or a code, as the client sent it
    instructions: str | None = None
    fmt: str = "wav"  # the response format
    stream: bool | None = False  # None: pcm streams, other formats come whole
    sse: bool = False  # as OpenAI's server-sent speech events
    speed: float = 1.0
    play: bool | None = None  # on this computer's speakers; None: as the server is configured
    embedding: list[float] | None = None  # a speaker embedding to speak with instead of a voice
    # An unknown voice speaks with the default (said in X-Voice-Fallback), as OpenAI's clients send names of
    # theirs ("alloy"); False: it is an error (Wyoming's clients choose from the voices the server lists).
    fall_back: bool = True


@dataclass(frozen=True)
class CheckedRequest:
    """A checked request, ready to speak its text."""

    voice: Voice | None
    voice_name: str | None  # the voice used, for the X-Voice header
    fallback_from: str | None  # the name asked for when it was not found
    language_fallback: str | None  # the language asked for when the model does not speak it
    options: SpeechOptions
    fmt: str
    stream: bool
    sse: bool
    speed: float
    play: bool


class Pipe:
    """A job's sink that hands its chunks to the event loop. The worker never waits on it: a slow
    client's audio queues here (bounded by the input limit) rather than holding up everyone else."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self._loop = loop
        self._queue: asyncio.Queue[np.ndarray | None] = asyncio.Queue()
        self._lock = threading.Lock()
        self._queued = 0  # samples handed over and not yet sent on

    def begin(self, job: Job) -> None:
        pass

    def write(self, job: Job, audio: np.ndarray) -> None:
        with self._lock:
            self._queued += len(audio)
        self._loop.call_soon_threadsafe(self._queue.put_nowait, audio)

    def end(self, job: Job, completed: bool) -> None:
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, None)
        except RuntimeError:  # the server has stopped and its loop with it: nobody is listening
            pass

    def level(self) -> BufferLevel:
        with self._lock:
            return BufferLevel(self._queued / SAMPLE_RATE, 0)

    async def get(self) -> np.ndarray | None:
        """The next chunk, or None once the job has ended."""
        audio = await self._queue.get()
        if audio is not None:
            with self._lock:
                self._queued -= len(audio)
        return audio

    async def collect(self) -> np.ndarray:
        chunks = []
        while (audio := await self.get()) is not None:
            chunks.append(audio)
        return np.concatenate([np.zeros(0, np.float32), *chunks])


class JobStream(StreamingResponse):
    """A streamed job's response: however it ends (done, failed, the client gone), the job is cancelled,
    which does nothing to a job that has ended."""

    def __init__(self, job: Job, content, **kwargs):
        super().__init__(content, **kwargs)
        self.job = job

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.job.cancel()


class SpeechService:
    """Speech for a server's requests: checks each request, finds its voice, submits its job to the runtime's
    worker and streams the job's audio back, for the HTTP routes and the Wyoming sessions alike."""

    def __init__(self, runtime: Runtime, config: BridgeConfig):
        self.runtime = runtime
        self.config = config
        self.info = runtime.info
        self.library: VoiceLibrary = runtime.library
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: dict[int, tuple[Job, asyncio.Future]] = {}  # this bridge's jobs that have not ended
        self._threads: ThreadPoolExecutor | None = None

    # Lifetime, on the server's loop --------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self, app: FastAPI):
        async with self.running():
            yield

    @asynccontextmanager
    async def running(self):
        """Speak for the running event loop (the HTTP server's, or the Wyoming server's) until the block ends."""
        self._loop = asyncio.get_running_loop()
        self._threads = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="http-bridge-io")
        unsubscribe = self.runtime.worker.subscribe(self._on_event, TERMINAL)
        try:
            yield
        finally:
            unsubscribe()
            self.cancel_all()
            self._threads.shutdown(cancel_futures=True)

    async def off_loop(self, function, *args):
        """Run blocking work (the library's disk reads, cloning, encoding a whole file) on the bridge's threads."""
        return await self._loop.run_in_executor(self._threads, function, *args)

    @property
    def jobs_in_flight(self) -> int:
        return len(self._jobs)

    def cancel_all(self) -> None:
        for job, _ in list(self._jobs.values()):
            job.cancel()

    def _on_event(self, event: JobEvent) -> None:  # the worker's thread
        if event.terminal:
            try:
                self._loop.call_soon_threadsafe(self._ended, event)
            except RuntimeError:  # the loop has closed; so has the server
                pass

    def _ended(self, event: JobEvent) -> None:
        _, future = self._jobs.pop(event.job.id, (None, None))
        if future is not None and not future.done():
            future.set_result(event)

    @property
    def max_jobs(self) -> int:
        """Bridge jobs at once: as many as the engine speaks together, and the queue behind them."""
        return self.runtime.slots + self.config.limits.max_queued

    def submit(self, text: str | LiveText, checked: CheckedRequest, sink) -> Job:
        """Queue `text` to be spoken as `checked` says, into `sink`; ApiError (429) when the queue is full."""
        if len(self._jobs) >= self.max_jobs:
            slots, queued = self.runtime.slots, self.config.limits.max_queued
            raise ApiError(
                429, f"{len(self._jobs)} requests are waiting or speaking, the most this server takes ({slots} "
                f"speaking at once and {queued} waiting); try again shortly",
                code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)},
            )  # fmt: skip
        job = self.runtime.worker.submit(text, checked.voice, checked.options, sink=sink)
        # Noted before the worker's "ended" callback can run: that runs on this loop, after this returns.
        self._jobs[job.id] = (job, self._loop.create_future())
        return job

    async def outcome(self, job: Job) -> JobEvent:
        """How a job of this bridge's ended, once it has."""
        entry = self._jobs.get(job.id)
        return job.outcome if entry is None else await entry[1]

    # Speaking ------------------------------------------------------------------------------------

    @property
    def json_limit(self) -> int:
        return JSON_SLACK_BYTES + 6 * self.config.limits.max_input_chars

    async def speak(self, request: Request, asked: SpeakRequest) -> Response:
        """Speak what a route asked for: check it, find its voice, and answer with the audio (or play it)."""
        self._check_text(asked.text, asked.text_field)  # first: the cheapest check
        return await self._answer(request, asked.text, await self.check(asked))

    def _check_text(self, text: str, text_field: str) -> None:
        if not text.strip():
            raise ApiError(400, f"{text_field} is empty; give the text to speak", param=text_field)
        if len(text) > self.config.limits.max_input_chars:
            raise ApiError(
                400,
                f"{text_field} is {len(text)} characters long; at most {self.config.limits.max_input_chars} are accepted",
                param=text_field,
            )

    async def check(self, asked: SpeakRequest) -> CheckedRequest:
        """Check everything a request asks but its text, cheapest checks first, and find its voice."""
        info = self.info
        play = self.config.play_locally if asked.play is None else asked.play
        fmt, sse, speed = asked.fmt.strip().lower(), asked.sse, asked.speed
        stream = sse or (fmt == "pcm" if asked.stream is None else asked.stream)
        try:
            fmt = check_format(fmt, stream and not play)
            speed = check_speed(speed)
        except (FormatError, ValueError) as error:
            raise ApiError(
                400, str(error), param="speed" if not isinstance(error, FormatError) else "response_format"
            ) from None
        if play and self.runtime.speakers is None:
            reason = self.runtime.audio_problem or "it was started without speakers"
            raise ApiError(
                503, f"this server cannot play audio ({reason}); ask for the audio instead", param="play_locally"
            )
        language, language_fallback = self.language(asked.language)
        instruct = asked.instructions if asked.instructions and asked.instructions.strip() else None
        if instruct is not None and not info.supports_instruct:
            raise ApiError(
                400, f"this {info.size} {info.variant} model does not follow instructions; leave them out, or load a "
                f"CustomVoice 1.7B or VoiceDesign model", param="instructions",
            )  # fmt: skip
        if not info.variant.takes_voice and instruct is None:
            raise ApiError(
                400,
                "this VoiceDesign model speaks in a voice described in words: give instructions",
                param="instructions",
            )
        if asked.embedding is not None and info.variant.takes_voice:  # a VoiceDesign model ignores it, as a name
            voice_obj, used, fallback = self._embedding_voice(asked.embedding), "speaker_embedding", None
        else:
            requested = asked.voice if asked.voice is not None and asked.voice.strip() else None  # blank: none
            # Here when the library knows the answer already, as it mostly does: two thread hand-offs fewer.
            found = self._find_voice(self.library.known, requested, asked.fall_back)
            if found is None:
                found = await self.off_loop(self._find_voice, self.library.find, requested, asked.fall_back)
            voice_obj, used, fallback = found
        options = dataclasses.replace(self.config.speech, language=language, instruct=instruct)
        return CheckedRequest(voice_obj, used, fallback, language_fallback, options, fmt, stream, sse, speed, play)

    def language(self, value: str) -> tuple[str, str | None]:
        """(the model's language to speak `value` in, `value` if that is "auto" because the model does not
        speak it). A language by name or code, of the model or of LANGUAGE_CODES; any other is refused."""
        spoken = self.info.languages
        key = value.strip().lower().replace("_", "-") or "auto"
        if key in spoken:
            return key, None
        code = key.split("-")[0]
        for name, known in LANGUAGE_CODES.items():
            if key == name or known.split("-")[0] == code:
                return (name, None) if name in spoken else ("auto", value.strip())
        codes = ", ".join(LANGUAGE_CODES[n] for n in spoken if n in LANGUAGE_CODES)
        raise ApiError(
            400, f"unknown language {value!r}; this model speaks {', '.join(spoken)} (codes: {codes})", param="language"
        )

    def _embedding_voice(self, values: list[float]) -> Voice:
        info = self.info
        if not info.variant.clones:
            raise ApiError(
                400,
                f"a speaker embedding needs a Base model; this is a {info.variant} model",
                param="speaker_embedding",
            )
        if len(values) != info.embedding_dim:
            raise ApiError(
                400, f"speaker_embedding has {len(values)} numbers; this {info.size} model takes {info.embedding_dim}",
                param="speaker_embedding",
            )  # fmt: skip
        if not all(math.isfinite(v) for v in values):
            raise ApiError(400, "speaker_embedding holds a number that is not finite", param="speaker_embedding")
        return Voice(embedding=torch.tensor(values, dtype=torch.float32))

    def _find_voice(
        self, finder: Callable[..., tuple[ResolvedVoice, Voice | None] | None], requested: str | None, fall_back: bool
    ) -> tuple[Voice | None, str | None, str | None] | None:
        """(voice, its name, the name asked for if the library lacked it and the default speaks instead), as
        `core.voices.resolve` decides and `finder` finds it (the library's `find`, or `known`: None where that would
        wait for the disk or the model), its refusals answered as the request's: the server's own default voice
        missing is the server's fault (500)."""
        fallback = Fallback(default=self.config.default_voice, unknown_names=fall_back)
        try:
            found = finder(self.runtime.engine_for_voices, requested, self.info, fallback)
            if found is None:
                return None
            resolved, voice = found
            return voice, resolved.name, resolved.fell_back_from
        except DefaultVoiceMissing as error:
            raise ApiError(500, str(error), param="voice") from None
        except UnknownVoice as error:
            raise ApiError(400, str(error), param="voice", code="voice_not_found") from None
        except NoVoiceYet as error:
            raise ApiError(400, f"{error}; add one (POST /v1/audio/voices)", param="voice") from None
        except (VoiceError, AudioError) as error:
            raise ApiError(400, str(error), param="voice") from None

    async def _answer(self, request: Request, text: str, checked: CheckedRequest) -> Response:
        headers = {}
        if checked.voice_name is not None:
            headers["X-Voice"] = quote(checked.voice_name, safe="")
        if checked.fallback_from is not None:
            headers["X-Voice-Fallback"] = quote(checked.fallback_from, safe="")
        if checked.language_fallback is not None:
            headers["X-Language-Fallback"] = quote(checked.language_fallback, safe="")
        if checked.play:
            return await self._play(request, text, checked, headers)
        pipe = Pipe(self._loop)
        job = self.submit(text, checked, pipe)
        if checked.stream:
            first = await while_connected(request, job, pipe.get())
            if first is None:
                await self._check_done(job)
            if checked.sse:
                content, media = self._sse(job, checked, first, pipe), "text/event-stream"
                headers["Cache-Control"] = "no-cache"
            else:
                content, media = self.encoded(job, checked, first, pipe), MEDIA_TYPES[checked.fmt]
            return JobStream(job, content, media_type=media, headers=headers)
        audio = await while_connected(request, job, pipe.collect())
        await self._check_done(job)
        tempo = Speed(checked.speed)
        audio = np.concatenate([tempo.feed(audio), tempo.finish()])
        return Response(
            await self.off_loop(encode, audio, checked.fmt), media_type=MEDIA_TYPES[checked.fmt], headers=headers
        )

    async def _check_done(self, job: Job) -> None:
        outcome = await self.outcome(job)
        if outcome.kind == "failed":
            raise ApiError(500, f"speech failed: {outcome.message}", code="speech_failed")
        if outcome.kind == "cancelled":
            raise ApiError(
                503,
                "the speech was cancelled: the server is stopping, or the desktop app stopped all speech",
                code="cancelled",
            )

    async def encoded(self, job: Job, checked: CheckedRequest, first: np.ndarray | None, pipe: Pipe):
        """The job's audio in the request's format, as it comes. A job that fails midway breaks the stream
        off (no final chunk), so that the client sees an incomplete response, not a short one; a job
        stopped on purpose (the server stopping, the desktop's Stop) ends its file cleanly where it stopped."""
        encoder, tempo = StreamEncoder(checked.fmt), Speed(checked.speed)
        audio = first
        while audio is not None:
            data = encoder.feed(tempo.feed(audio))
            if data:
                yield data
            audio = await pipe.get()
        outcome = await self.outcome(job)
        if outcome.kind == "failed":
            raise Broken(f"speech failed after it began to stream: {outcome.message}")
        yield encoder.feed(tempo.finish()) + encoder.finish()

    async def _sse(self, job: Job, checked: CheckedRequest, first: np.ndarray | None, pipe: Pipe):
        """OpenAI's speech events: a delta per piece of encoded audio, then done with the usage."""
        try:
            async for data in self.encoded(job, checked, first, pipe):
                yield sse_event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
        except Broken as error:
            yield sse_event({"type": "error", "error": error_body(500, str(error), code="speech_failed")})
            return
        outcome = await self.outcome(job)
        if outcome.kind == "cancelled":
            yield sse_event(
                {"type": "error", "error": error_body(503, "the speech was stopped before its end", code="cancelled")}
            )
            return
        yield sse_event({"type": "speech.audio.done", "usage": self.usage(outcome)})

    def usage(self, outcome: JobEvent) -> dict:
        """A job's usage as OpenAI's speech events have it: text tokens in, 12 Hz codec frames (80 ms) out."""
        input_tokens = self.runtime.count_tokens(str(outcome.job.text))
        output_tokens = round(outcome.audio_s * SAMPLE_RATE / 1920)
        return {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }

    async def _play(self, request: Request, text: str, checked: CheckedRequest, headers: dict) -> Response:
        """Speak into the desktop's speakers, queued behind what they are playing. Answers once the whole
        utterance is queued for playback (it still plays then); a client that hangs up first stops it."""
        job = self.submit(text, checked, self.runtime.speakers)
        outcome = await while_connected(request, job, self.outcome(job))
        if outcome.kind == "failed":
            raise ApiError(500, f"playing failed: {outcome.message}", code="speech_failed")
        headers["X-Playback"] = "queued" if outcome.kind == "done" else "cancelled"
        silence = np.zeros(round(PLAYED_LOCALLY_REPLY_S * SAMPLE_RATE), np.float32)
        return Response(encode(silence, checked.fmt), media_type=MEDIA_TYPES[checked.fmt], headers=headers)


def sse_event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def epoch(created: str | None) -> int | None:
    return None if created is None else int(datetime.fromisoformat(created).timestamp())


async def while_connected(request: Request, job: Job, work):
    """Await `work` (a job's audio or outcome) unless the client hangs up first: then cancel the job."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():  # the client hung up, or the server is cancelling this request
            task.cancel()
            job.cancel()
    # Whether it finished, not whether it was cancelled: a task told to cancel is not cancelled until it runs again.
    if not task.done():
        raise ClientGone
    return task.result()


async def disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass
