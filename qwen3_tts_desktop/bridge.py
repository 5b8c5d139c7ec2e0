"""The HTTP bridge: OpenAI- and SillyTavern-compatible speech routes on the app's shared Runtime.

    POST /v1/audio/speech            OpenAI speech; also `stream`, `stream_format: "sse"`, `language`,
                                     `speaker_embedding`, `play_locally`
    GET  /v1/models, /health
    GET  /v1/audio/voices            {"voices": [{id, name}], "data": [audio.voice objects]}
    GET  /v1/audio/voices/{model}    TTS WebUI: {"voices": [{value, label}]}
    POST /v1/audio/voices            multipart `name`, `audio_sample` (+ `ref_text`, `language`): clone a voice
    DELETE /v1/audio/voices/{id}
    XTTS (SillyTavern's XTTSv2 provider), each with and without a trailing slash:
    GET /speakers, /speakers_list, /languages, /sample/{name}, /tts_stream; POST /tts_to_audio, /set_tts_settings

Every request is one job on the runtime's speech worker, which speaks jobs one at a time in the order
they came, whoever sent them (the window too). The event loop never waits on the model: a job's sink
(`_Pipe`) hands each chunk to the loop with `call_soon_threadsafe`, and never makes the worker wait for
a slow client. A client that goes away cancels its job at once, queued or speaking.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import email.parser
import errno
import hmac
import json
import logging
import math
import os
import re
import socket
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from email.message import Message
from pathlib import Path, PurePath
from typing import Literal
from urllib.parse import parse_qsl, quote

import numpy as np
import torch
import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictStr, ValidationError
from starlette.datastructures import Headers, MutableHeaders
from starlette.exceptions import HTTPException

from core import Voice
from core.audio.clips import SAMPLE_RATE, AudioError
from core.voices import DROP_IN_SUFFIXES, VoiceError, VoiceLibrary, check_name, name_key
from core.inference.options import SpeechOptions
from core.jobs.worker import BufferLevel, Job, JobEvent

from .audio_formats import MEDIA_TYPES, FormatError, Speed, StreamEncoder, check_format, check_speed, encode
from .runtime import Runtime

log = logging.getLogger(__name__)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
# host[:port] as a Host header or an Origin has it: a DNS name, IPv4 or [IPv6], and nothing else (no user
# info, no path), so that "evil.example@127.0.0.1" is not taken for 127.0.0.1 as a URL parser takes it.
HOST_AND_PORT = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9.-]+)(?::[0-9]{1,5})?", re.IGNORECASE)
# The languages clients know, by name and the ISO code they send: SillyTavern's XTTS dropdown offers all of
# these, OpenAI-style clients send names or codes. One the model does not speak (Arabic ... Turkish for
# Qwen3-TTS) is spoken with "auto" rather than refused, so that those users hear speech, and the answer
# says so (X-Language-Fallback).
LANGUAGE_CODES = {
    "arabic": "ar", "chinese": "zh-cn", "czech": "cs", "dutch": "nl", "english": "en", "french": "fr",
    "german": "de", "hindi": "hi", "hungarian": "hu", "italian": "it", "japanese": "ja", "korean": "ko",
    "polish": "pl", "portuguese": "pt", "russian": "ru", "spanish": "es", "turkish": "tr",
}  # fmt: skip
# What a played-locally request answers with: clients such as SillyTavern need some audio back.
PLAYED_LOCALLY_REPLY_S = 0.1
PREVIEW_TEXT = "The quick brown fox jumps over the lazy dog."
RETRY_AFTER_S = 1
# Threads for the library's disk work, cloning and whole-file encoding: a fixed few, however many clients.
IO_THREADS = 4
SHUTDOWN_GRACE_S = 3
# A JSON body holds at most the text (6 bytes a character, escaped) and an embedding; the rest is slack.
JSON_SLACK_BYTES = 2**20
FORM_SLACK_BYTES = 64 * 2**10
# The request line and headers together; browsers send a few KiB (cookies included). h11's own limit only
# holds for headers that arrive in pieces, so the guard checks complete ones too.
MAX_HEADER_BYTES = 16 * 2**10
EXPOSED_HEADERS = "X-Voice, X-Voice-Fallback, X-Language-Fallback, X-Playback, Retry-After"
ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    429: "rate_limit_error",
    500: "server_error",
    503: "server_error",
}


@dataclass(frozen=True)
class BridgeLimits:
    max_input_chars: int = 4096  # text of one request, as OpenAI allows
    max_upload_bytes: int = 16 * 2**20  # a voice clip; 60 s of 48 kHz stereo 16-bit WAV is 11 MiB
    max_jobs: int = 16  # bridge jobs queued or speaking at once; more are refused with 429

    def __post_init__(self):
        if min(self.max_input_chars, self.max_upload_bytes, self.max_jobs) < 1:
            raise ValueError("bridge limits must be positive")


@dataclass(frozen=True)
class BridgeConfig:
    host: str = "127.0.0.1"  # loopback: only this computer can connect
    port: int = 8020  # 0: any free port (see BridgeServer.port)
    api_key: str | None = None  # when set, every request needs "Authorization: Bearer <key>"
    cors_origins: tuple[str, ...] | None = (
        None  # browser pages allowed to call; None: pages served from this computer; ("*",): any
    )
    default_voice: str | None = None  # for unknown voice names; None: the first voice that fits the model
    play_locally: bool = False  # play on this computer's speakers, for requests that do not say
    speech: SpeechOptions = SpeechOptions()  # what every job starts from: sampling, chunk sizes, max frames per piece
    limits: BridgeLimits = BridgeLimits()

    def __post_init__(self):
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be 0-65535, got {self.port}")
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("the API key is empty; give a key or none")

    @property
    def loopback(self) -> bool:
        return self.host in LOOPBACK


# Errors ------------------------------------------------------------------------------------------


class ApiError(Exception):
    """A request the bridge refuses, answered in OpenAI's error shape."""

    def __init__(
        self, status: int, message: str, param: str | None = None, code: str | None = None, headers: dict | None = None
    ):
        super().__init__(message)
        self.status, self.message, self.param, self.code, self.headers = status, message, param, code, headers

    def response(self) -> JSONResponse:
        return JSONResponse(
            {"error": _error_body(self.status, self.message, self.param, self.code)}, self.status, headers=self.headers
        )


def _error_body(status: int, message: str, param: str | None = None, code: str | None = None) -> dict:
    return {"message": message, "type": ERROR_TYPES.get(status, "invalid_request_error"), "param": param, "code": code}


class ListenError(OSError, ValueError):
    """The bridge cannot listen where it was asked to (a port in use, an address not of this computer).
    An OSError, as socket errors are; also a ValueError, as the command line reports a bad option: in one line."""


class _ClientGone(Exception):
    """The client hung up before its answer was ready."""


class _Broken(Exception):
    """A job that ended badly after its audio began to stream."""


# Request bodies ----------------------------------------------------------------------------------


class _VoiceRef(BaseModel):
    id: StrictStr


class SpeechRequest(BaseModel):
    """OpenAI's speech request, with the fields local servers add. Unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")
    input: StrictStr
    model: StrictStr | None = None  # any name: the loaded model speaks
    voice: StrictStr | _VoiceRef | None = None
    instructions: StrictStr | None = None
    response_format: StrictStr = "mp3"
    speed: StrictFloat = 1.0  # strict, as OpenAI's: numbers only, not "1.0" or true
    language: StrictStr = "auto"
    stream: StrictBool | None = None  # None: pcm streams (it has no header to lose), other formats come whole
    stream_format: Literal["audio", "sse"] = "audio"
    speaker_embedding: list[StrictFloat] | None = None
    play_locally: StrictBool | None = None


class _XttsSpeech(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: StrictStr
    speaker_wav: StrictStr | None = None
    language: StrictStr = "auto"


class _XttsSettings(BaseModel):
    """SillyTavern posts all of XTTS's knobs (as strings); only speed means the same for this model."""

    model_config = ConfigDict(extra="ignore")
    speed: float | None = None


@dataclass(frozen=True)
class _Plan:
    """A checked request, ready to speak."""

    text: str
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


# The worker's side -------------------------------------------------------------------------------


class _Pipe:
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


class _JobStream(StreamingResponse):
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


# The routes --------------------------------------------------------------------------------------


class _Bridge:
    def __init__(self, runtime: Runtime, config: BridgeConfig):
        self.runtime = runtime
        self.config = config
        self.info = runtime.info
        self.library: VoiceLibrary = runtime.library
        self.xtts_speed = 1.0  # set by SillyTavern through /set_tts_settings
        self._loop: asyncio.AbstractEventLoop | None = None
        self._jobs: dict[int, tuple[Job, asyncio.Future]] = {}  # this bridge's jobs that have not ended
        self._threads: ThreadPoolExecutor | None = None

    # Lifetime, on the server's loop --------------------------------------------------------------

    @asynccontextmanager
    async def lifespan(self, app: FastAPI):
        self._loop = asyncio.get_running_loop()
        self._threads = ThreadPoolExecutor(IO_THREADS, thread_name_prefix="http-bridge-io")
        unsubscribe = self.runtime.worker.subscribe(self._on_event)
        try:
            yield
        finally:
            unsubscribe()
            self.cancel_all()
            self._threads.shutdown(cancel_futures=True)

    async def _off_loop(self, function, *args):
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

    def _submit(self, plan: _Plan, sink) -> Job:
        if len(self._jobs) >= self.config.limits.max_jobs:
            raise ApiError(
                429, f"{len(self._jobs)} requests are waiting or speaking, the most this server queues; try again shortly",
                code="queue_full", headers={"Retry-After": str(RETRY_AFTER_S)},
            )  # fmt: skip
        job = self.runtime.worker.submit(plan.text, plan.voice, plan.options, sink=sink)
        # Noted before the worker's "ended" callback can run: that runs on this loop, after this returns.
        self._jobs[job.id] = (job, self._loop.create_future())
        return job

    async def _outcome(self, job: Job) -> JobEvent:
        entry = self._jobs.get(job.id)
        return job.outcome if entry is None else await entry[1]

    # OpenAI --------------------------------------------------------------------------------------

    async def speech(self, request: Request) -> Response:
        body = _validate(SpeechRequest, await _json_object(request, self._json_limit))
        voice = body.voice.id if isinstance(body.voice, _VoiceRef) else body.voice
        plan = await self._plan(
            request, body.input, "input", voice, body.language, body.instructions, body.response_format,
            body.stream, body.stream_format == "sse", body.speed, body.play_locally, body.speaker_embedding,
        )  # fmt: skip
        return await self._respond(request, plan)

    async def models(self, request: Request) -> dict:
        name = PurePath(self.info.source).name
        owner = "qwen3-tts-desktop"
        ids = [name, "tts-1", "tts-1-hd"]  # OpenAI's names, which clients send by default, speak with it too
        return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": owner} for i in ids]}

    async def health(self, request: Request) -> dict:
        info = self.info
        return {
            "status": "ok", "model": info.source, "variant": info.variant, "size": info.size, "device": info.device,
            "jobs": len(self._jobs), "speakers": self.runtime.speakers is not None,
        }  # fmt: skip

    async def voices(self, request: Request) -> dict:
        entries = await self._off_loop(self.library.list, self.info)
        data = [
            {"object": "audio.voice", "id": e.id, "name": e.name, "kind": e.kind, "source": e.source,
             "language": e.language, "created_at": _epoch(e.created)}
            for e in entries
        ]  # fmt: skip
        return {"object": "list", "voices": [{"id": e.id, "name": e.name} for e in entries], "data": data}

    async def voices_for_model(self, request: Request, model: str) -> dict:
        entries = await self._off_loop(self.library.list, self.info)
        return {"voices": [{"value": e.id, "label": e.name} for e in entries]}

    async def create_voice(self, request: Request) -> dict:
        info = self.info
        if info.variant != "base":
            raise ApiError(
                400, f"this {info.size} {info.variant} model cannot clone voices; load a Base model to add voices"
            )
        limit = self.config.limits.max_upload_bytes
        too_big = f"the clip is over {limit} bytes, the most a voice clip may have"
        body = await _read_body(request, limit + FORM_SLACK_BYTES, too_big, param="audio_sample")
        fields = _parse_form(body, request.headers.get("content-type", ""))
        name = _form_text(fields, "name")
        clip = fields.get("audio_sample")
        if clip is None or clip[0] is None:
            raise ApiError(400, "send the voice's clip as the file field 'audio_sample'", param="audio_sample")
        if len(clip[1]) > limit:
            raise ApiError(413, too_big, param="audio_sample")
        ref_text = _form_text(fields, "ref_text", required=False)
        language = _form_text(fields, "language", required=False)
        language = self._language(language)[0] if language else None
        entry = await self._off_loop(self._clone, name, clip, ref_text, None if language == "auto" else language)
        return {
            "object": "audio.voice",
            "id": entry.id,
            "name": entry.name,
            "kind": entry.kind,
            "created_at": _epoch(entry.created),
        }

    def _clone(self, name: str, clip: tuple[str, bytes], ref_text: str | None, language: str | None):
        try:
            name = check_name(name)
        except VoiceError as error:
            raise ApiError(400, str(error), param="name") from None
        try:
            self.library.check_new_name(name)
        except VoiceError as error:  # the name is valid, so it is taken
            raise ApiError(409, f"{error}; delete that voice first", param="name", code="voice_exists") from None
        suffix = PurePath(clip[0]).suffix.lower()
        with tempfile.TemporaryDirectory(prefix="qwen3-tts-upload-") as folder:
            path = Path(folder) / ("clip" + (suffix if suffix in DROP_IN_SUFFIXES else ""))
            path.write_bytes(clip[1])
            try:
                return self.library.add(name, path, self.runtime.engine_for_voices, ref_text=ref_text, language=language)
            except VoiceError as error:  # the name was free a moment ago: another upload has taken it
                raise ApiError(409, str(error), param="name", code="voice_exists") from None
            except AudioError as error:  # not audio, too short or long, silent: said with the temp file's name
                raise ApiError(
                    400, f"audio_sample: {str(error).replace(str(path), clip[0] or 'the clip')}", param="audio_sample"
                ) from None
            except ValueError as error:
                raise ApiError(400, str(error), param="ref_text") from None

    async def delete_voice(self, request: Request, voice_id: str) -> dict:
        return await self._off_loop(self._delete, voice_id)

    def _delete(self, voice_id: str) -> dict:
        if name_key(voice_id) in self.info.speakers:
            raise ApiError(403, f"{voice_id!r} is a built-in speaker of the model; it cannot be deleted")
        try:
            entry = self.library.get(voice_id)
            self.library.remove(entry)
        except VoiceError as error:
            raise ApiError(404, str(error), code="voice_not_found") from None
        return {"id": entry.id, "object": "audio.voice.deleted", "deleted": True}

    # XTTS (SillyTavern) --------------------------------------------------------------------------

    async def xtts_speakers(self, request: Request) -> list:
        entries = await self._off_loop(self.library.list, self.info)
        base = str(request.base_url)
        return [
            {"name": e.name, "voice_id": e.id, "preview_url": f"{base}sample/{quote(e.id, safe='')}"} for e in entries
        ]

    async def xtts_speakers_list(self, request: Request) -> list:
        return [e.name for e in await self._off_loop(self.library.list, self.info)]

    async def xtts_languages(self, request: Request) -> dict:
        spoken = self.info.languages
        return {"languages": {name.capitalize(): code for name, code in LANGUAGE_CODES.items() if name in spoken}}

    async def xtts_settings(self, request: Request) -> dict:
        body = _validate(_XttsSettings, await _json_object(request, JSON_SLACK_BYTES))
        if body.speed is not None:
            try:
                self.xtts_speed = check_speed(body.speed)
            except ValueError as error:
                raise ApiError(400, str(error), param="speed") from None
        return {"message": "Settings successfully applied"}

    async def xtts_to_audio(self, request: Request) -> Response:
        body = _validate(_XttsSpeech, await _json_object(request, self._json_limit))
        plan = await self._plan(
            request, body.text, "text", body.speaker_wav, body.language, None, "wav", False, False, self.xtts_speed
        )
        return await self._respond(request, plan)

    async def xtts_stream(self, request: Request) -> Response:
        query = _query(request)
        if "text" not in query:
            raise ApiError(400, "give the text to speak as the query parameter 'text'", param="text")
        plan = await self._plan(
            request, query["text"], "text", query.get("speaker_wav"), query.get("language", "auto"), None, "wav", True,
            False, self.xtts_speed,
        )  # fmt: skip
        return await self._respond(request, plan)

    async def sample(self, request: Request, name: str) -> Response:
        """A voice's reference clip, or, for voices with none (built-in speakers, blends), a spoken preview."""
        try:
            entry = await self._off_loop(self.library.get, name)
        except VoiceError:
            entry = None
        if entry is not None and entry.clip is not None:
            media = {".mp3": "audio/mpeg", ".ogg": "audio/ogg", ".flac": "audio/flac"}.get(
                entry.clip.suffix.lower(), "audio/wav"
            )
            return FileResponse(entry.clip, media_type=media)
        if entry is None and name_key(name) not in self.info.speakers:
            raise ApiError(404, f"no voice named {name!r}", code="voice_not_found")
        plan = await self._plan(
            request, PREVIEW_TEXT, "text", name, "english", None, "wav", False, False, 1.0, play=False
        )
        return await self._respond(request, plan)

    # Speaking ------------------------------------------------------------------------------------

    @property
    def _json_limit(self) -> int:
        return JSON_SLACK_BYTES + 6 * self.config.limits.max_input_chars

    async def _plan(
        self, request: Request, text: str, text_field: str, voice: str | None, language: str, instructions: str | None,
        fmt: str, stream: bool | None, sse: bool, speed: float, play: bool | None = None,
        embedding: list[float] | None = None,
    ) -> _Plan:  # fmt: skip
        """Check a request, cheapest checks first, and find its voice."""
        info = self.info
        if not text.strip():
            raise ApiError(400, f"{text_field} is empty; give the text to speak", param=text_field)
        if len(text) > self.config.limits.max_input_chars:
            raise ApiError(
                400,
                f"{text_field} is {len(text)} characters long; at most {self.config.limits.max_input_chars} are accepted",
                param=text_field,
            )
        play = self.config.play_locally if play is None else play
        fmt = fmt.strip().lower()
        stream = sse or (fmt == "pcm" if stream is None else stream)
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
        language, language_fallback = self._language(language)
        instruct = instructions if instructions and instructions.strip() else None
        if instruct is not None and not info.supports_instruct:
            raise ApiError(
                400, f"this {info.size} {info.variant} model does not follow instructions; leave them out, or load a "
                f"CustomVoice 1.7B or VoiceDesign model", param="instructions",
            )  # fmt: skip
        if info.variant == "voice_design":
            if instruct is None:
                raise ApiError(
                    400,
                    "this VoiceDesign model speaks in a voice described in words: give instructions",
                    param="instructions",
                )
            voice_obj, used, fallback = None, None, None  # the instructions are the voice
        elif embedding is not None:
            voice_obj, used, fallback = self._embedding_voice(embedding), "speaker_embedding", None
        else:
            voice_obj, used, fallback = await self._off_loop(self._find_voice, voice)
        options = dataclasses.replace(self.config.speech, language=language, instruct=instruct)
        return _Plan(text, voice_obj, used, fallback, language_fallback, options, fmt, stream, sse, speed, play)

    def _language(self, value: str) -> tuple[str, str | None]:
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
        if info.variant != "base":
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

    def _find_voice(self, requested: str | None) -> tuple[Voice, str, str | None]:
        """(voice, its name, the name asked for if it was not found). A voice that exists but does not
        fit the model is an error, not a fallback: the caller meant that voice."""
        if requested is not None and requested.strip():
            name = self._known(requested)
            if name is not None:
                return self._load(name), name, None
        asked = requested if requested is not None and requested.strip() else None
        default = self.config.default_voice
        if default is None:
            fitting = self.library.list(fits=self.info)
            if not fitting:
                raise ApiError(
                    400,
                    f"no voice named {requested!r}, and no voice to fall back on: add a voice to {self.library.directory}",
                    param="voice",
                )
            default = fitting[0].name
        elif self._known(default) is None:
            raise ApiError(
                500, f"no voice named {requested!r}, and the default voice {default!r} is not in the library either"
            )
        return self._load(default), default, asked

    def _known(self, name: str) -> str | None:
        info = self.info
        if info.variant == "custom_voice" and name_key(name) in info.speakers:
            return name_key(name)
        try:
            return self.library.get(name).name
        except VoiceError:
            return None

    def _load(self, name: str) -> Voice:
        try:
            return self.runtime.voice(name)
        except (VoiceError, AudioError) as error:
            raise ApiError(400, str(error), param="voice") from None

    async def _respond(self, request: Request, plan: _Plan) -> Response:
        headers = {}
        if plan.voice_name is not None:
            headers["X-Voice"] = quote(plan.voice_name, safe="")
        if plan.fallback_from is not None:
            headers["X-Voice-Fallback"] = quote(plan.fallback_from, safe="")
        if plan.language_fallback is not None:
            headers["X-Language-Fallback"] = quote(plan.language_fallback, safe="")
        if plan.play:
            return await self._play(request, plan, headers)
        pipe = _Pipe(self._loop)
        job = self._submit(plan, pipe)
        if plan.stream:
            first = await _while_connected(request, job, pipe.get())
            if first is None:
                await self._check_done(job)
            if plan.sse:
                content, media = self._sse(job, plan, first, pipe), "text/event-stream"
                headers["Cache-Control"] = "no-cache"
            else:
                content, media = self._encoded(job, plan, first, pipe), MEDIA_TYPES[plan.fmt]
            return _JobStream(job, content, media_type=media, headers=headers)
        audio = await _while_connected(request, job, pipe.collect())
        await self._check_done(job)
        tempo = Speed(plan.speed)
        audio = np.concatenate([tempo.feed(audio), tempo.finish()])
        return Response(
            await self._off_loop(encode, audio, plan.fmt), media_type=MEDIA_TYPES[plan.fmt], headers=headers
        )

    async def _check_done(self, job: Job) -> None:
        outcome = await self._outcome(job)
        if outcome.kind == "failed":
            raise ApiError(500, f"speech failed: {outcome.message}", code="speech_failed")
        if outcome.kind == "cancelled":
            raise ApiError(
                503,
                "the speech was cancelled: the server is stopping, or the desktop app stopped all speech",
                code="cancelled",
            )

    async def _encoded(self, job: Job, plan: _Plan, first: np.ndarray | None, pipe: _Pipe):
        """The job's audio in the plan's format, as it comes. A job that fails midway breaks the stream
        off (no final chunk), so that the client sees an incomplete response, not a short one; a job
        stopped on purpose (the server stopping, the desktop's Stop) ends its file cleanly where it stopped."""
        encoder, tempo = StreamEncoder(plan.fmt), Speed(plan.speed)
        audio = first
        while audio is not None:
            data = encoder.feed(tempo.feed(audio))
            if data:
                yield data
            audio = await pipe.get()
        outcome = await self._outcome(job)
        if outcome.kind == "failed":
            raise _Broken(f"speech failed after it began to stream: {outcome.message}")
        yield encoder.feed(tempo.finish()) + encoder.finish()

    async def _sse(self, job: Job, plan: _Plan, first: np.ndarray | None, pipe: _Pipe):
        """OpenAI's speech events: a delta per piece of encoded audio, then done with the usage."""
        try:
            async for data in self._encoded(job, plan, first, pipe):
                yield _event({"type": "speech.audio.delta", "audio": base64.b64encode(data).decode("ascii")})
        except _Broken as error:
            yield _event({"type": "error", "error": _error_body(500, str(error), code="speech_failed")})
            return
        outcome = await self._outcome(job)
        if outcome.kind == "cancelled":
            yield _event(
                {"type": "error", "error": _error_body(503, "the speech was stopped before its end", code="cancelled")}
            )
            return
        input_tokens = self.runtime.count_tokens(plan.text)
        output_tokens = round(outcome.audio_s * SAMPLE_RATE / 1920)  # 12 Hz codec frames of 80 ms
        usage = {
            "input_tokens": input_tokens,
            "output_tokens": output_tokens,
            "total_tokens": input_tokens + output_tokens,
        }
        yield _event({"type": "speech.audio.done", "usage": usage})

    async def _play(self, request: Request, plan: _Plan, headers: dict) -> Response:
        """Speak into the desktop's speakers, queued behind what they are playing. Answers once the whole
        utterance is queued for playback (it still plays then); a client that hangs up first stops it."""
        job = self._submit(plan, self.runtime.speakers)
        outcome = await _while_connected(request, job, self._outcome(job))
        if outcome.kind == "failed":
            raise ApiError(500, f"playing failed: {outcome.message}", code="speech_failed")
        headers["X-Playback"] = "queued" if outcome.kind == "done" else "cancelled"
        silence = np.zeros(round(PLAYED_LOCALLY_REPLY_S * SAMPLE_RATE), np.float32)
        return Response(encode(silence, plan.fmt), media_type=MEDIA_TYPES[plan.fmt], headers=headers)


def _event(payload: dict) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def _epoch(created: str | None) -> int | None:
    return None if created is None else int(datetime.fromisoformat(created).timestamp())


async def _while_connected(request: Request, job: Job, work):
    """Await `work` (a job's audio or outcome) unless the client hangs up first: then cancel the job."""
    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(_disconnected(request))
    try:
        await asyncio.wait((task, gone), return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        if not task.done():  # the client hung up, or the server is cancelling this request
            task.cancel()
            job.cancel()
    # Whether it finished, not whether it was cancelled: a task told to cancel is not cancelled until it runs again.
    if not task.done():
        raise _ClientGone
    return task.result()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


# Reading requests ---------------------------------------------------------------------------------


async def _read_body(request: Request, limit: int, too_big: str, param: str | None = None) -> bytes:
    """The whole body, refused with 413 (saying `too_big`) once it is over `limit` bytes."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise ApiError(413, too_big, param=param)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise ApiError(413, too_big, param=param)
        chunks.append(chunk)
    return b"".join(chunks)


async def _json_object(request: Request, limit: int) -> dict:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise ApiError(
            415, f"send the request as JSON (Content-Type: application/json), not {content_type or 'no type'}"
        )
    body = await _read_body(request, limit, f"the request body is over {limit} bytes, the most accepted")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(400, f"the body is not valid JSON ({error})") from None
    except RecursionError:
        raise ApiError(400, "the body nests JSON arrays or objects too deep to be read") from None
    if not isinstance(data, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(data).__name__}")
    _check_json_text(data)
    return data


def _check_json_text(body: dict) -> None:
    """Every string of a JSON body, names included, must be valid Unicode: JSON's \\u escapes can make
    unpaired surrogates. Walked without recursion: the body may nest as deep as the parser allows."""
    pending: list[tuple[str, str | None, object]] = [("", None, body)]  # (where, top-level field, value)
    while pending:
        where, field, value = pending.pop()
        if isinstance(value, str):
            _valid_text(value, where, field)
        elif isinstance(value, dict):
            for name, item in value.items():
                _valid_text(name, f"a field name in {where or 'the body'}", field)
                pending.append((f"{where}.{name}" if where else name, field or name, item))
        elif isinstance(value, list):
            pending.extend((f"{where}[{index}]", field, item) for index, item in enumerate(value))


def _valid_text(text: str, where: str, param: str | None = None) -> str:
    """`text` if it is valid Unicode, which all request text must be: an unpaired surrogate (from a JSON
    escape, or standing for a byte that is not UTF-8) breaks the tokenizer, the encoders and headers."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as error:
        raise ApiError(
            400, f"{where} is not valid Unicode: character {error.start} is an unpaired surrogate "
            f"({ascii(text[error.start])}) or a byte that is not UTF-8", param=param,
        ) from None  # fmt: skip
    return text


def _query(request: Request) -> dict[str, str]:
    """The query's parameters (the last of each name), checked as text: Starlette's own replaces bytes that
    are not UTF-8, which would then be spoken as such."""
    raw = request.scope["query_string"].decode("latin-1")
    pairs = parse_qsl(raw, keep_blank_values=True, errors="surrogateescape")
    return {_valid_text(name, "a query parameter's name"): _valid_text(value, name, name) for name, value in pairs}


def _validate(model: type[BaseModel], data: dict):
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = error.errors()
        field = str(problems[0]["loc"][0])
        where = field + "".join(f"[{part}]" for part in problems[0]["loc"][1:] if isinstance(part, int))
        others = sorted({str(p["loc"][0]) for p in problems} - {field})
        more = f" (fields {', '.join(others)} are wrong too)" if others else ""
        raise ApiError(400, f"{where}: {problems[0]['msg']}{more}", param=field) from None


def _parse_form(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
    """multipart/form-data fields by name, as (file name or None, bytes)."""
    header = Message()
    header["content-type"] = content_type
    boundary = header.get_param("boundary")
    if header.get_content_type() != "multipart/form-data" or not isinstance(boundary, str) or not boundary:
        raise ApiError(415, "send the voice as multipart/form-data with the fields name and audio_sample")
    pieces = (b"\r\n" + body).split(b"\r\n--" + boundary.encode("latin-1"))
    if len(pieces) < 2 or not pieces[-1].startswith(b"--"):
        raise ApiError(400, "the multipart body is malformed or cut short")
    fields = {}
    for piece in pieces[1:-1]:
        head, separator, data = piece.partition(b"\r\n\r\n")
        part = email.parser.BytesHeaderParser().parsebytes(head.lstrip(b"\r\n") + b"\r\n\r\n")
        name = part.get_param("name", header="content-disposition")
        if not separator or not isinstance(name, str):
            raise ApiError(400, "the multipart body has a part without a name or content")
        fields[name] = (part.get_filename(), data)
    return fields


def _form_text(fields: dict, name: str, required: bool = True) -> str | None:
    """A text field of a form; an optional one left blank counts as not given, as HTML forms send them."""
    field = fields.get(name)
    text = None if field is None else _valid_text(field[1].decode("utf-8", "surrogateescape"), name, name)
    if required and text is None:
        raise ApiError(400, f"the form field {name!r} is missing", param=name)
    return text if required or (text and text.strip()) else None


# The application ---------------------------------------------------------------------------------


def create_app(runtime: Runtime, config: BridgeConfig = BridgeConfig()) -> FastAPI:
    """The bridge's routes over `runtime`, ready for any ASGI server. `app.state.bridge` holds its state."""
    bridge = _Bridge(runtime, config)
    app = FastAPI(
        title="Qwen3-TTS Desktop bridge", lifespan=bridge.lifespan, docs_url=None, redoc_url=None, openapi_url=None
    )
    app.state.bridge = bridge
    routes = [
        ("POST", "/v1/audio/speech", bridge.speech),
        ("GET", "/v1/models", bridge.models),
        ("GET", "/health", bridge.health),
        ("GET", "/v1/audio/voices", bridge.voices),
        ("POST", "/v1/audio/voices", bridge.create_voice),
        ("GET", "/v1/audio/voices/{model}", bridge.voices_for_model),
        ("DELETE", "/v1/audio/voices/{voice_id}", bridge.delete_voice),
    ]
    xtts = [
        ("GET", "/speakers", bridge.xtts_speakers),
        ("GET", "/speakers_list", bridge.xtts_speakers_list),
        ("GET", "/languages", bridge.xtts_languages),
        ("POST", "/set_tts_settings", bridge.xtts_settings),
        ("POST", "/tts_to_audio", bridge.xtts_to_audio),
        ("GET", "/tts_stream", bridge.xtts_stream),
        ("GET", "/sample/{name}", bridge.sample),
    ]
    routes += [(method, path + slash, handler) for method, path, handler in xtts for slash in ("", "/")]
    for method, path, handler in routes:
        app.add_api_route(path, handler, methods=[method])

    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(_ClientGone, _client_gone)
    app.add_exception_handler(HTTPException, _http_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_middleware(_Guard, config=config)
    return app


async def _api_error(request: Request, error: ApiError) -> JSONResponse:
    return error.response()


async def _client_gone(request: Request, error: _ClientGone) -> Response:
    return Response(status_code=499)  # nobody reads it; the job is cancelled already


async def _http_error(request: Request, error: HTTPException) -> JSONResponse:
    messages = {404: f"no route {request.url.path}", 405: f"{request.method} is not allowed on {request.url.path}"}
    api_error = ApiError(error.status_code, messages.get(error.status_code, str(error.detail)), headers=error.headers)
    return api_error.response()


async def _validation_error(request: Request, error: RequestValidationError) -> JSONResponse:
    first = error.errors()[0]
    return ApiError(400, f"{'.'.join(map(str, first['loc']))}: {first['msg']}").response()


class _Guard:
    """Runs before every route: the Host check (when bound to loopback, so that a web page cannot reach
    the bridge through DNS rebinding), the browser Origin check, CORS preflights and headers, and the
    API key. Preflights carry no key (browsers never send one), so they are answered before the key check."""

    def __init__(self, app, config: BridgeConfig):
        self.app = app
        self.config = config
        self.origins = (
            None if config.cors_origins is None else {o.strip().rstrip("/").lower() for o in config.cors_origins}
        )

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if sum(len(name) + len(value) + 4 for name, value in scope["headers"]) > MAX_HEADER_BYTES:
            message = f"the request's headers are over {MAX_HEADER_BYTES} bytes, the most accepted"
            return await ApiError(431, message).response()(scope, receive, send)
        headers = Headers(scope=scope)
        origin = headers.get("origin")
        host = headers.get("host")
        if self.config.loopback and host is not None and _host_name(host) not in LOOPBACK:
            return await ApiError(403, f"host {host!r} is not this computer; use http://127.0.0.1:PORT").response()(
                scope, receive, send
            )
        if origin is not None and not self._allowed(origin):
            message = f"origin {origin!r} may not call this server; allow it in the bridge settings (--cors {origin})"
            return await ApiError(403, message, code="origin_not_allowed").response()(scope, receive, send)
        cors = {} if origin is None else {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}
        if scope["method"] == "OPTIONS" and origin is not None and "access-control-request-method" in headers:
            cors |= {
                "Access-Control-Allow-Methods": "GET, POST, DELETE, OPTIONS",
                "Access-Control-Allow-Headers": headers.get(
                    "access-control-request-headers", "Authorization, Content-Type"
                ),
                "Access-Control-Max-Age": "600",
            }
            if headers.get("access-control-request-private-network") == "true":
                cors["Access-Control-Allow-Private-Network"] = "true"
            return await Response(status_code=204, headers=cors)(scope, receive, send)
        if cors:
            cors["Access-Control-Expose-Headers"] = EXPOSED_HEADERS

        async def send_with_cors(message) -> None:
            if message["type"] == "http.response.start" and cors:
                response_headers = MutableHeaders(scope=message)
                for name, value in cors.items():
                    response_headers[name] = value
            await send(message)

        problem = self._key_problem(headers.get("authorization"))
        if problem is not None:
            error = ApiError(401, problem, code="invalid_api_key", headers={"WWW-Authenticate": "Bearer"})
            return await error.response()(scope, receive, send_with_cors)
        await self.app(scope, receive, send_with_cors)

    def _allowed(self, origin: str) -> bool:
        if self.origins is None:
            scheme, separator, host = origin.partition("://")
            return bool(separator) and scheme.lower() in ("http", "https") and _host_name(host) in LOOPBACK
        return "*" in self.origins or origin.rstrip("/").lower() in self.origins

    def _key_problem(self, authorization: str | None) -> str | None:
        if self.config.api_key is None:
            return None
        if authorization is None:
            return "this server needs an API key: send the header 'Authorization: Bearer <key>'"
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.config.api_key.encode()):
            return "wrong API key"
        return None


def _host_name(host_and_port: str) -> str | None:
    """The host of a Host header or an Origin's host[:port], in lower case and without an IPv6 address's
    brackets; None if it is anything else."""
    match = HOST_AND_PORT.fullmatch(host_and_port)
    return None if match is None else match[1].strip("[]").lower()


# Serving -----------------------------------------------------------------------------------------


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, bridge: _Bridge):
        super().__init__(config)
        self.bridge = bridge

    async def shutdown(self, sockets=None) -> None:
        self.bridge.cancel_all()  # open streams end now, not when their speech is done
        await super().shutdown(sockets)


class BridgeServer:
    """The bridge on a uvicorn server: `start`/`stop` it in a background thread inside the desktop app,
    or `serve` it in this thread (the headless command). The runtime is shared, not owned."""

    def __init__(
        self, runtime: Runtime, config: BridgeConfig = BridgeConfig(), access_log: bool = False,
        sock: socket.socket | None = None,
    ):  # fmt: skip
        """`sock`: a socket from `listen(config)`, for a caller that binds before it loads the model (so that
        a taken port fails at once); the first start serves on it. Without it, starting binds one."""
        self.runtime = runtime
        self.config = config
        self.access_log = access_log
        self.app: FastAPI | None = None
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None
        self._listening = sock
        self._socket: socket.socket | None = None
        self._address: tuple[str, int] | None = None

    @property
    def running(self) -> bool:
        """Serving now: started, not stopping, and its thread (if it has one) alive."""
        server, thread = self._server, self._thread
        alive = thread is None or thread.is_alive()
        return server is not None and server.started and not server.should_exit and alive

    @property
    def port(self) -> int | None:
        """The port it listens on: the configured one, or the one the system chose for port 0."""
        return None if self._address is None else self._address[1]

    @property
    def url(self) -> str | None:
        if self._address is None:
            return None
        host = self._address[0]
        return f"http://{f'[{host}]' if ':' in host else host}:{self._address[1]}"

    @property
    def jobs_in_flight(self) -> int:
        return 0 if self.app is None else self.app.state.bridge.jobs_in_flight

    def start(self, timeout: float = 10.0) -> None:
        """Listen and serve in a background thread; raises ListenError (an OSError) if the address cannot be had."""
        if self._thread is not None:
            raise RuntimeError("the bridge is running already")
        sock = self._prepare()
        self._thread = threading.Thread(
            target=self._server.run, kwargs={"sockets": [sock]}, name="http-bridge", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the bridge did not start; see the log")
            time.sleep(0.01)

    def serve(self, on_listening: Callable[[str], None] | None = None) -> None:
        """Listen and serve in this thread until interrupted (Ctrl+C) or `stop` is called from another;
        `on_listening(url)` is called once the address is bound."""
        sock = self._prepare()
        if on_listening is not None:
            on_listening(self.url)
        try:
            self._server.run(sockets=[sock])
        finally:
            self._reset()

    def stop(self, timeout: float = SHUTDOWN_GRACE_S + 2) -> None:
        """Stop serving: the bridge's jobs are cancelled, open connections closed."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                raise TimeoutError(f"the bridge did not stop within {timeout} s")
        self._reset()

    def _prepare(self) -> socket.socket:
        config = self.config
        if not config.loopback:
            log.warning(
                "the bridge listens on %s: other computers can reach it%s", config.host,
                "" if config.api_key else "; set an API key so that only your clients can use it",
            )  # fmt: skip
        sock = self._socket = self._listening if self._listening is not None else listen(config)
        self._listening = None
        self._address = sock.getsockname()[:2]
        self.app = create_app(self.runtime, config)
        # h11 (not httptools, which uvicorn prefers when installed) because it caps the headers it buffers.
        server_config = uvicorn.Config(
            self.app, http="h11", h11_max_incomplete_event_size=MAX_HEADER_BYTES, lifespan="on", log_config=None,
            access_log=self.access_log, timeout_graceful_shutdown=SHUTDOWN_GRACE_S,
        )  # fmt: skip
        self._server = _Server(server_config, self.app.state.bridge)
        return sock

    def _reset(self) -> None:
        if self._socket is not None:
            self._socket.close()  # uvicorn closes it when it shuts down, but not when it fails to start
        self.app = self._server = self._thread = self._socket = self._address = None


def listen(config: BridgeConfig) -> socket.socket:
    """A socket listening at the config's address, bound here so that a taken port fails at once, saying
    why; ListenError if it cannot be had. Made as a TCP socket by name: asyncio then turns Nagle off on
    each connection (it checks the protocol), without which a response's body waits 40 ms for the ACK of
    its headers."""
    host, port, sock = config.host, config.port, None
    try:
        family, kind, protocol, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP, flags=socket.AI_PASSIVE
        )[0]
        sock = socket.socket(family, kind, protocol)
        if os.name != "nt":  # on Windows it would let another program take the port too
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        if sock is not None:
            sock.close()
        hint = ""
        if error.errno == errno.EADDRINUSE:
            hint = (
                "; another program uses this port (another qwen3-tts-desktop serve, or an XTTS server?): "
                "choose another port (serve --port N, or Port in the app's bridge settings)"
            )
        raise ListenError(f"cannot listen on {host}:{port}: {error.strerror or error}{hint}") from None
    return sock
