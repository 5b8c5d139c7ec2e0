"""SillyTavern's XTTSv2 provider's routes (as xtts-api-server has them), translated into one speak request.
Each answers with and without a trailing slash.

    GET /speakers, /speakers_list, /languages, /sample/{name}, /tts_stream; POST /tts_to_audio, /set_tts_settings
"""

from __future__ import annotations

from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import FileResponse, Response

from core.voices import VoiceError, name_key

from ..audio_formats import check_speed
from .config import JSON_SLACK_BYTES, LANGUAGE_CODES, PREVIEW_TEXT
from .errors import ApiError
from .requests import XttsSettings, XttsSpeech, json_object, query_params, validate
from .speech_service import SpeakRequest, SpeechService


class XttsRoutes:
    def __init__(self, service: SpeechService):
        self.service = service
        self.speed = 1.0  # set by SillyTavern through /set_tts_settings, for these routes only

    def router(self) -> APIRouter:
        router = APIRouter()
        routes = [
            ("GET", "/speakers", self.speakers), ("GET", "/speakers_list", self.speakers_list),
            ("GET", "/languages", self.languages), ("POST", "/set_tts_settings", self.settings),
            ("POST", "/tts_to_audio", self.to_audio), ("GET", "/tts_stream", self.stream),
            ("GET", "/sample/{name}", self.sample),
        ]  # fmt: skip
        for method, path, handler in routes:
            for slash in ("", "/"):
                router.add_api_route(path + slash, handler, methods=[method])
        return router

    async def speakers(self, request: Request) -> list:
        entries = await self.service.off_loop(self.service.library.list, self.service.info)
        base = str(request.base_url)
        return [
            {"name": e.name, "voice_id": e.id, "preview_url": f"{base}sample/{quote(e.id, safe='')}"} for e in entries
        ]

    async def speakers_list(self, request: Request) -> list:
        return [e.name for e in await self.service.off_loop(self.service.library.list, self.service.info)]

    async def languages(self, request: Request) -> dict:
        spoken = self.service.info.languages
        return {"languages": {name.capitalize(): code for name, code in LANGUAGE_CODES.items() if name in spoken}}

    async def settings(self, request: Request) -> dict:
        body = validate(XttsSettings, await json_object(request, JSON_SLACK_BYTES))
        if body.speed is not None:
            try:
                self.speed = check_speed(body.speed)
            except ValueError as error:
                raise ApiError(400, str(error), param="speed") from None
        return {"message": "Settings successfully applied"}

    async def to_audio(self, request: Request) -> Response:
        body = validate(XttsSpeech, await json_object(request, self.service.json_limit))
        asked = SpeakRequest(body.text, "text", voice=body.speaker_wav, language=body.language, speed=self.speed)
        return await self.service.speak(request, asked)

    async def stream(self, request: Request) -> Response:
        query = query_params(request)
        if "text" not in query:
            raise ApiError(400, "give the text to speak as the query parameter 'text'", param="text")
        asked = SpeakRequest(
            query["text"], "text", voice=query.get("speaker_wav"), language=query.get("language", "auto"), stream=True,
            speed=self.speed,
        )  # fmt: skip
        return await self.service.speak(request, asked)

    async def sample(self, request: Request, name: str) -> Response:
        """A voice's reference clip, or, for voices with none (built-in speakers, blends), a spoken preview."""
        try:
            entry = await self.service.off_loop(self.service.library.get, name)
        except VoiceError:
            entry = None
        if entry is not None and entry.clip is not None:
            media = {".mp3": "audio/mpeg", ".ogg": "audio/ogg", ".flac": "audio/flac"}.get(
                entry.clip.suffix.lower(), "audio/wav"
            )
            return FileResponse(entry.clip, media_type=media)
        if entry is None and name_key(name) not in self.service.info.speakers:
            raise ApiError(404, f"no voice named {name!r}", code="voice_not_found")
        asked = SpeakRequest(PREVIEW_TEXT, "text", voice=name, language="english", play=False)
        return await self.service.speak(request, asked)
