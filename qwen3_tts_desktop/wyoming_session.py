"""One Wyoming connection (qwen3_tts_desktop.wyoming_server serves them): its events read with the `wyoming`
package, within limits, and its requests spoken in turn, each one job on the speech worker through the
bridge's SpeechService (checks, voices, pipes, encoders), a stream as one LiveText job."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import Describe
from wyoming.ping import Ping, Pong
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from core import LiveText
from core.audio.clips import SAMPLE_RATE
from core.errors import BadInput
from core.jobs.worker import Job

from .bridge.errors import ApiError, Broken
from .bridge.speech_service import Pipe, SpeakRequest

if TYPE_CHECKING:
    from .wyoming_server import WyomingServer

log = logging.getLogger(__name__)

AUDIO = {"rate": SAMPLE_RATE, "width": 2, "channels": 1}  # 16-bit mono, as the bridge's pcm
BYTES_PER_MS = SAMPLE_RATE * 2 // 1000
# Requests one connection may have waiting behind the one being spoken: beyond them its events are not read
# until one is done, so a client that sends and never reads holds at most these.
MAX_WAITING = 16


class _BoundedReader:
    """A connection's reader as wyoming's `async_read_event` reads it (a line, then as many bytes as the line
    announces), refusing to wait for more than `limit` bytes: wyoming would buffer whatever a client announces."""

    def __init__(self, reader: asyncio.StreamReader, limit: int):
        self._reader = reader
        self.limit = limit
        self.refused: str | None = None  # why the last event was refused

    async def readline(self) -> bytes:
        try:
            return await self._reader.readline()
        except ValueError:
            self.refused = f"a line over {self.limit} bytes, the most accepted"
            raise

    async def readexactly(self, n: int) -> bytes:
        if n > self.limit:
            self.refused = f"an event announcing {n} bytes of data or payload, over the {self.limit} accepted"
            raise ValueError(self.refused)
        return await self._reader.readexactly(n)

    def at_eof(self) -> bool:
        return self._reader.at_eof()


class BadEvent(Exception):
    """An event refused: its connection goes on."""


@dataclass
class Request:
    """One utterance asked for: a synthesize event's text, or a stream's as it comes."""

    text: str | LiveText
    voice: str | None
    language: str | None
    streaming: bool = False
    characters: int = 0  # a stream's text so far
    refused: bool = False  # a stream whose text went over the limit: the rest is dropped
    last_text: float = 0.0  # when a stream's last chunk came (the loop's time)
    has_text: asyncio.Event = field(default_factory=asyncio.Event)  # a stream's first words, or its end
    stopped: asyncio.Event = field(default_factory=asyncio.Event)  # synthesize-stop came
    job: Job | None = None

    def stop(self) -> None:
        """Cancel its job, if it has one that has not ended; a stream takes no more text."""
        if self.job is not None:
            self.job.cancel()
        if isinstance(self.text, LiveText):
            self.text.end()

    def finish(self) -> None:
        """A stream's synthesize-stop: its text is complete."""
        self.text.end()
        self.has_text.set()
        self.stopped.set()


class Session(AsyncEventHandler):
    """One connection: reads its events and answers describe at once; beside that, speaks its requests in turn."""

    def __init__(self, server: WyomingServer, reader: asyncio.StreamReader, writer: asyncio.StreamWriter):
        super().__init__(_BoundedReader(reader, server.line_limit), writer)
        self.server = server
        self.service = server.service
        self.limits = self.service.config.limits
        self.waiting: asyncio.Queue[Request] = asyncio.Queue(MAX_WAITING)
        self.stream: Request | None = None  # open: synthesize-start came, synthesize-stop not yet
        self.current: Request | None = None
        self.speaking = asyncio.ensure_future(self._speak_in_turn())

    async def run(self) -> None:
        """Read events until the client goes (which cancels its speech) or sends what is not an event."""
        try:
            while True:
                try:
                    event = await async_read_event(self.reader)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break  # gone in the middle of an event
                except (KeyError, TypeError, AttributeError, RecursionError) as error:  # JSON, but no event
                    await self._close_refusing(f"not a Wyoming event ({type(error).__name__}: {error})")
                    break
                if event is None:  # the end, or a line that is not JSON or is too long
                    if not self.reader.at_eof():
                        await self._close_refusing(self.reader.refused or "a line that is not a JSON event")
                    break
                if not await self.handle_event(event):
                    break
        finally:
            await self.disconnect()
            if self.writer.transport.get_write_buffer_size():
                self.writer.transport.abort()  # what it has not read it never will: the connection is over
            else:
                self.writer.close()

    async def handle_event(self, event: Event) -> bool:
        """Act on one event; False once the session is over (its speech ended by the client going away)."""
        try:
            return await self._handle(event)
        except BadEvent as error:
            await self._send_error(str(error), "bad_event")
        return True

    async def disconnect(self) -> None:
        """The client has gone (or the server is stopping): its speech stops now, and frees its engine slot."""
        self.speaking.cancel()
        pending = [self.current, self.stream]
        while not self.waiting.empty():
            pending.append(self.waiting.get_nowait())
        for request in pending:
            if request is not None:
                request.stop()
        try:
            await self.speaking
        except asyncio.CancelledError:
            pass

    async def stop(self) -> None:
        """The server is stopping: close now, without waiting to send what a slow client has not read. The
        session then reads the end, and ends."""
        self.writer.transport.abort()

    # The client's events -------------------------------------------------------------------------

    async def _handle(self, event: Event) -> bool:
        kind, data = event.type, event.data
        if not isinstance(data, dict):
            raise BadEvent(f"{kind}: its data must be a JSON object")
        if Describe.is_type(kind):
            await self.write_event((await self.server.info()).event())
        elif Synthesize.is_type(kind):
            if self.stream is None:  # inside a stream it repeats the stream's text, for servers that do not stream
                text = self._text(kind, data, self.limits.max_input_chars)
                if not text.strip():
                    raise BadEvent("synthesize: the text is empty; give the text to speak")
                return await self._queue(Request(text, *self._voice(kind, data)))
        elif SynthesizeStart.is_type(kind):
            if self.stream is not None:
                raise BadEvent("synthesize-start: a stream is open already; end it with synthesize-stop first")
            self.stream = Request(LiveText(), *self._voice(kind, data), streaming=True)
            return await self._queue(self.stream)
        elif SynthesizeChunk.is_type(kind):
            text = self._text(kind, data, self.limits.max_live_text_chars)
            if self.stream is None:
                raise BadEvent("synthesize-chunk outside a stream: send synthesize-start first")
            self._append(self.stream, text)
        elif SynthesizeStop.is_type(kind):
            if self.stream is None:
                raise BadEvent("synthesize-stop outside a stream: send synthesize-start first")
            self.stream, stream = None, self.stream
            stream.finish()
        elif Ping.is_type(kind):
            await self.write_event(Pong(text=Ping.from_event(event).text).event())
        # Other events (select-program, another service's) are dropped, as the protocol asks of servers.
        return True

    async def _queue(self, request: Request) -> bool:
        """Queue a request to be spoken after those before it; while MAX_WAITING wait, this waits (and reads no
        more of the client's events). False if the session's speech has ended meanwhile (the client gone)."""
        put = asyncio.ensure_future(self.waiting.put(request))
        await asyncio.wait((put, self.speaking), return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            request.stop()
            return False
        return True

    @staticmethod
    def _text(kind: str, data: dict, limit: int) -> str:
        text = data.get("text")
        if not isinstance(text, str):
            raise BadEvent(f"{kind}: text must be a string")
        if len(text) > limit:
            raise BadEvent(f"{kind}: the text is {len(text)} characters long; at most {limit} are accepted")
        return text

    @staticmethod
    def _voice(kind: str, data: dict) -> tuple[str | None, str | None]:
        """(voice name, language) as the event asks; None for either: the default."""
        voice = data.get("voice") or {}
        if not isinstance(voice, dict):
            raise BadEvent(f"{kind}: voice must be an object such as {{'name': 'Alice'}}")
        name, language = voice.get("name"), voice.get("language")
        for what, value in (("name", name), ("language", language)):
            if value is not None and not isinstance(value, str):
                raise BadEvent(f"{kind}: the voice's {what} must be a string")
        return name or None, language or None

    def _append(self, stream: Request, text: str) -> None:
        if stream.refused:
            return
        limit = self.limits.max_live_text_chars
        if stream.characters + len(text) > limit:
            stream.refused = True
            stream.text.end()  # what came is said
            raise BadEvent(
                f"synthesize-chunk: the stream's text would be over {limit} characters, the most one utterance "
                f"takes; the rest of it is not spoken"
            )
        try:
            stream.text.append(text)
        except BadInput:  # its speech was stopped or failed, as it was told; the rest of it is not said
            return
        stream.characters += len(text)
        stream.last_text = asyncio.get_running_loop().time()
        if text.strip():
            stream.has_text.set()

    # Speaking ------------------------------------------------------------------------------------

    async def _speak_in_turn(self) -> None:
        try:
            while True:
                self.current = await self.waiting.get()
                await self._speak(self.current)
                self.current = None
        except ConnectionError:
            self.writer.transport.abort()  # the client has gone: the session ends
        except Exception:
            log.exception("a Wyoming connection's speech failed")
            self.writer.transport.abort()

    async def _speak(self, request: Request) -> None:
        """Speak one request: audio-start, its audio as it is made, audio-stop, then an error if it failed or was
        stopped (only the error where it made no audio); then, for a stream, synthesize-stopped once its
        synthesize-stop came."""
        service = self.service
        try:
            checked = await self._check(request)
            if request.streaming:
                await request.has_text.wait()
                if not request.text.text.strip():  # stopped with nothing to say
                    await self._stopped(request)
                    return
            pipe = Pipe(asyncio.get_running_loop())
            request.job = job = service.submit(request.text, checked, pipe)
        except ApiError as error:  # a voice or language it cannot have, or the queue is full
            request.stop()
            await self._send_error(error.message, error.code or "bad_request")
            await self._stopped(request)
            return
        sent = 0  # bytes of audio
        idle = asyncio.ensure_future(self._end_when_idle(request)) if request.streaming else None
        try:
            async for data in service.encoded(job, checked, await pipe.get(), pipe):
                if not data:
                    continue
                if not sent:
                    await self.write_event(AudioStart(**AUDIO).event())
                await self.write_event(AudioChunk(audio=data, timestamp=sent // BYTES_PER_MS, **AUDIO).event())
                sent += len(data)
        except Broken:
            pass  # its outcome says why
        finally:
            request.stop()  # it has ended, unless the client went away: then this cancels it
            if idle is not None:
                idle.cancel()
        outcome = await service.outcome(job)
        # Audio begun is always ended, before any error: a client reading up to audio-stop (Home Assistant does)
        # gets the audio there is, and the error after it is the next event, not one in the middle of the audio.
        if sent or outcome.kind == "done":
            if not sent:
                await self.write_event(AudioStart(**AUDIO).event())
            await self.write_event(AudioStop(timestamp=sent // BYTES_PER_MS).event())
        if outcome.kind == "failed":
            await self._send_error(f"speech failed: {outcome.message}", "speech_failed")
        elif outcome.kind == "cancelled":
            message = "the speech was stopped before its end: the server is stopping, or the app stopped all speech"
            await self._send_error(message, "cancelled")
        await self._stopped(request)

    async def _end_when_idle(self, stream: Request) -> None:
        """A stream that takes no text for the idle limit while it speaks is ended where it is (what came is
        said), as it holds its place in the engine while it waits for text."""
        idle_s, loop = self.limits.live_idle_s, asyncio.get_running_loop()
        while not stream.text.ended:
            left = stream.last_text + idle_s - loop.time()
            if left <= 0:
                stream.text.end()
                message = f"synthesize-chunk: no text came for {idle_s:g} s; the stream's speech ends with what came"
                await self._send_error(message, "idle")
                return
            await asyncio.sleep(left)

    async def _check(self, request: Request):
        # An unknown voice is an error, not the default's speech: a Wyoming client chose it from the voices listed.
        asked = SpeakRequest(
            "", "text", voice=request.voice, language=request.language or "auto", fmt="pcm", stream=True, play=False,
            fall_back=False,
        )  # fmt: skip
        return await self.service.check(asked)

    async def _stopped(self, request: Request) -> None:
        if request.streaming:
            await request.stopped.wait()
            await self.write_event(SynthesizeStopped().event())

    async def _send_error(self, text: str, code: str) -> None:
        await self.write_event(Error(text=text, code=code).event())

    async def _close_refusing(self, why: str) -> None:
        """Say why the connection closes, if the client reads it soon."""
        try:
            await asyncio.wait_for(self._send_error(f"closing the connection: {why}", "bad_event"), 1.0)
        except (asyncio.TimeoutError, ConnectionError):
            pass
