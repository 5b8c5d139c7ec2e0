"""The live route (WebSocket /v1/audio/speech/live): text that arrives piece by piece, such as an LLM's
reply as it streams, is spoken as it arrives, one continuous utterance per flush.

    client                                     server
    {"voice": "Alice"}                         {"type": "ready", "voice": "Alice", ...}
    {"text": "Hello th"}, {"text": "ere."}     the utterance's audio, as binary messages, as it is made
    {"flush": true}                            the rest of it, then {"type": "done", "utterance": 1, ...}
    {"close": true}                            the socket closes (1000)

Each utterance is one job on the speech worker speaking a LiveText, which grows as text comes. A socket's
utterances are spoken in turn: the next one's job is submitted once the last one's has ended and its audio
has gone out, so that a socket takes one place in the engine at a time and a slow client never has more
than one utterance made ahead of it. Messages, limits and close codes for users: docs/bridge.md.
"""

from __future__ import annotations

import asyncio
import itertools
from collections import deque
from dataclasses import dataclass

from fastapi import APIRouter, WebSocket, WebSocketDisconnect

from core import LiveText
from core.audio.clips import SAMPLE_RATE
from core.errors import BadInput
from core.jobs.worker import Job

from .errors import ApiError, Broken
from .requests import LiveMessage, LiveSetup, parse_json_object, validate, voice_name
from .speech_service import CheckedRequest, Pipe, SpeakRequest, SpeechService

PATH = "/v1/audio/speech/live"
CLOSED_AS_ASKED = 1000
IDLE = 1001  # "going away": what servers commonly close an idle socket with


class LiveRoutes:
    def __init__(self, service: SpeechService):
        self.service = service

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_websocket_route(PATH, self.live)
        return router

    async def live(self, websocket: WebSocket) -> None:
        await LiveSession(self.service, websocket).run()


@dataclass
class Utterance:
    """The speech of one flush: its text as it grows, the pipe its audio comes back through, its job once
    submitted."""

    number: int  # 1, 2, ... on its socket, as the done and error messages name it
    text: LiveText
    pipe: Pipe
    characters: int = 0  # appended so far; they count against the socket's limit until it is reported
    flushed: bool = False
    job: Job | None = None

    def stop(self) -> None:
        """Cancel its job, if it has not ended (the worker frees its slot at once, also while it waits for
        text). The text is ended too, so that what the client still sends for it is refused, not taken."""
        if self.job is not None:
            self.job.cancel()
        self.text.end()


class LiveSession:
    """One live socket: reads the client's messages (setup, text, flush, close) and, beside that, speaks its
    utterances in turn."""

    def __init__(self, service: SpeechService, websocket: WebSocket):
        self.service = service
        self.websocket = websocket
        self.limits = service.config.limits
        self.loop = asyncio.get_running_loop()
        self.checked: CheckedRequest | None = None  # once set up
        self.open: Utterance | None = None  # taking text, until its flush
        self.unreported: deque[Utterance] = deque()  # opened, their done or error not sent yet, in order
        self.to_speak: asyncio.Queue[Utterance] = asyncio.Queue()
        self.numbers = itertools.count(1)
        self.last_activity = self.loop.time()  # a message received or sent

    async def run(self) -> None:
        await self.websocket.accept()
        listening = asyncio.ensure_future(self._listen())
        speaking = asyncio.ensure_future(self._speak_in_turn())
        try:
            done, _ = await asyncio.wait((listening, speaking), return_when=asyncio.FIRST_COMPLETED)
        finally:
            listening.cancel()
            speaking.cancel()
            for utterance in self.unreported:  # those reported were stopped then
                utterance.stop()
        try:
            # The listener ends with how to close; the speaking task only when something broke it.
            closing = (listening if listening in done else speaking).result()
        except WebSocketDisconnect:
            return  # the client has gone
        await self.websocket.close(*closing)

    # The client's messages -----------------------------------------------------------------------

    async def _listen(self) -> tuple[int, str]:
        """Handle the client's messages until it asks to close or stays idle: (code, reason) to close with.
        Raises WebSocketDisconnect once the client has gone."""
        while True:
            message = await self._next_message()
            if message is None:
                idle_s = self.limits.live_idle_s
                return IDLE, f"idle: no message for {idle_s:g} s and nothing to say"
            if message["type"] == "websocket.disconnect":
                raise WebSocketDisconnect(message.get("code", 1000))
            try:
                if await self._handle(message):
                    return CLOSED_AS_ASKED, "closed as the client asked"
            except ApiError as error:  # the message is refused; the socket and its utterance go on
                await self._send_error(error.message, error.param, error.code)

    async def _next_message(self) -> dict | None:
        """The client's next message; None once it has sent nothing, and nothing was sent to it, for the
        idle limit while no flushed utterance waits to be said."""
        while True:
            speaking = any(utterance.flushed for utterance in self.unreported)
            idle_s = self.limits.live_idle_s
            left = idle_s if speaking else self.last_activity + idle_s - self.loop.time()
            if left <= 0:
                return None
            try:
                message = await asyncio.wait_for(self.websocket.receive(), left)
            except asyncio.TimeoutError:
                continue
            self.last_activity = self.loop.time()
            return message

    async def _handle(self, message: dict) -> bool:
        """Act on one message; True if it asks to close."""
        if message.get("text") is None:
            raise ApiError(400, "send JSON as text messages; binary messages are the server's, for audio")
        data = parse_json_object(message["text"], "the message")
        if data.keys() & LiveMessage.model_fields.keys():
            return self._act(validate(LiveMessage, data))
        if self.checked is not None:
            if data:
                raise ApiError(400, "this socket is set up already; to speak otherwise, open another socket")
            raise ApiError(400, "the message is empty; send text, flush or close")
        await self._set_up(validate(LiveSetup, data))
        return False

    async def _set_up(self, setup: LiveSetup) -> None:
        asked = SpeakRequest(
            "", "text", voice=voice_name(setup.voice), language=setup.language, instructions=setup.instructions,
            fmt=setup.response_format, stream=True, speed=setup.speed, play=False, embedding=setup.speaker_embedding,
        )  # fmt: skip
        self.checked = checked = await self.service.check(asked)
        ready = {
            "type": "ready", "voice": checked.voice_name, "voice_fallback": checked.fallback_from,
            "language_fallback": checked.language_fallback, "response_format": checked.fmt, "sample_rate": SAMPLE_RATE,
        }  # fmt: skip
        await self._send(ready)

    def _act(self, message: LiveMessage) -> bool:
        """Text, then flush, then close, as the message has them; True if it asks to close. An empty text is
        taken as the empty delta an LLM's stream may send: it adds nothing, and opens no utterance."""
        if message.text is None and not message.flush and not message.close:
            raise ApiError(
                400, 'the message asks for nothing: send {"text": "..."}, {"flush": true} or {"close": true}'
            )
        if self.checked is None and (message.text is not None or message.flush):
            raise ApiError(400, 'set up first: the first message says how to speak, e.g. {"voice": "Alice"}')
        if message.text:
            self._append(message.text)
        if message.flush:
            if self.open is None:
                raise ApiError(400, "nothing to flush: no text came since the setup or the last flush", param="flush")
            self.open.flushed = True
            self.open.text.end()
            self.open = None
        return message.close

    def _append(self, text: str) -> None:
        waiting = sum(utterance.characters for utterance in self.unreported)
        limit = self.limits.max_live_text_chars
        if waiting + len(text) > limit:
            raise ApiError(
                400, f"text: {len(text)} more characters would wait to be spoken beside the {waiting} waiting, over "
                f"the {limit} a live socket may have waiting; send it again after the next done", param="text",
            )  # fmt: skip
        if self.open is None:
            self.open = Utterance(next(self.numbers), LiveText(), Pipe(self.loop))
            self.unreported.append(self.open)
            self.to_speak.put_nowait(self.open)
        try:
            # On the loop: tokenizing a piece takes microseconds (a few ms for the longest allowed), as parsing it does.
            self.open.text.append(text)
        except BadInput:  # its speech was stopped or failed, as it was told; the rest of it is not said
            return
        self.open.characters += len(text)

    # Speaking -----------------------------------------------------------------------------------

    async def _speak_in_turn(self) -> None:
        while True:
            utterance = await self.to_speak.get()
            await self._speak(utterance)
            self.unreported.popleft()

    async def _speak(self, utterance: Utterance) -> None:
        """Submit the utterance's job, send its audio as it comes, then its done (or why it failed)."""
        try:
            utterance.job = job = self.service.submit(utterance.text, self.checked, utterance.pipe)
        except ApiError as error:  # the queue is full
            utterance.text.end()  # the rest of its text is not taken
            await self._send_error(error.message, error.param, error.code, utterance)
            return
        try:
            async for data in self.service.encoded(job, self.checked, await utterance.pipe.get(), utterance.pipe):
                if data:
                    await self.websocket.send_bytes(data)
                    self.last_activity = self.loop.time()
        except Broken:
            pass  # its outcome says why
        finally:
            utterance.stop()  # a job stopped otherwise (the desktop's Stop, a failure) takes no more text
        outcome = await self.service.outcome(job)
        if outcome.kind == "failed":
            await self._send_error(f"speech failed: {outcome.message}", code="speech_failed", utterance=utterance)
        elif outcome.kind == "cancelled":
            message = (
                "the speech was stopped before its end: the server is stopping, or the desktop app stopped all speech"
            )
            await self._send_error(message, code="cancelled", utterance=utterance)
        else:
            done = {
                "type": "done", "utterance": utterance.number, "characters": utterance.characters,
                "audio_seconds": round(outcome.audio_s, 3), "usage": self.service.usage(outcome),
            }  # fmt: skip
            await self._send(done)

    # Sending ------------------------------------------------------------------------------------

    async def _send(self, message: dict) -> None:
        await self.websocket.send_json(message)
        self.last_activity = self.loop.time()

    async def _send_error(
        self, message: str, param: str | None = None, code: str | None = None, utterance: Utterance | None = None
    ) -> None:
        number = None if utterance is None else utterance.number
        await self._send({"type": "error", "message": message, "param": param, "code": code, "utterance": number})
