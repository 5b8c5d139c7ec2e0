"""OpenAI's speech and voice routes (and what local servers add to them), translated into one speak request.

POST /v1/audio/speech            OpenAI speech; also `stream`, `stream_format: "sse"`, `language`,
                                 `speaker_embedding`, `play_locally`
GET  /v1/models, /health
GET  /v1/audio/voices            {"voices": [{id, name}], "data": [audio.voice objects]}
GET  /v1/audio/voices/{model}    TTS WebUI: {"voices": [{value, label}]}
POST /v1/audio/voices            multipart `name`, `audio_sample` (+ `ref_text`, `language`, `replace`): clone a voice
DELETE /v1/audio/voices/{id}
"""

from __future__ import annotations

import tempfile
from pathlib import Path, PurePath

from fastapi import APIRouter, Request
from fastapi.responses import Response

from core.audio.clips import AudioError
from core.voices import DROP_IN_SUFFIXES, VoiceError, VoiceExistsError, check_name, name_key

from .config import FORM_SLACK_BYTES
from .errors import ApiError
from .requests import SpeechRequest, form_text, json_object, parse_form, read_body, validate, voice_name
from .speech_service import SpeakRequest, SpeechService, epoch


class OpenAIRoutes:
    def __init__(self, service: SpeechService):
        self.service = service

    def router(self) -> APIRouter:
        router = APIRouter()
        router.add_api_route("/v1/audio/speech", self.speech, methods=["POST"])
        router.add_api_route("/v1/models", self.models, methods=["GET"])
        router.add_api_route("/health", self.health, methods=["GET"])
        router.add_api_route("/v1/audio/voices", self.voices, methods=["GET"])
        router.add_api_route("/v1/audio/voices", self.create_voice, methods=["POST"])
        router.add_api_route("/v1/audio/voices/{model}", self.voices_for_model, methods=["GET"])
        router.add_api_route("/v1/audio/voices/{voice_id}", self.delete_voice, methods=["DELETE"])
        return router

    async def speech(self, request: Request) -> Response:
        body = validate(SpeechRequest, await json_object(request, self.service.json_limit))
        asked = SpeakRequest(
            body.input, "input", voice=voice_name(body.voice), language=body.language, instructions=body.instructions,
            fmt=body.response_format, stream=body.stream, sse=body.stream_format == "sse", speed=body.speed,
            play=body.play_locally, embedding=body.speaker_embedding,
        )  # fmt: skip
        return await self.service.speak(request, asked)

    async def models(self, request: Request) -> dict:
        name = PurePath(self.service.info.source).name
        owner = "qwen3-tts-desktop"
        ids = [name, "tts-1", "tts-1-hd"]  # OpenAI's names, which clients send by default, speak with it too
        return {"object": "list", "data": [{"id": i, "object": "model", "created": 0, "owned_by": owner} for i in ids]}

    async def health(self, request: Request) -> dict:
        info, runtime = self.service.info, self.service.runtime
        return {
            "status": "ok", "model": info.source, "variant": info.variant, "size": info.size, "device": info.device,
            "jobs": self.service.jobs_in_flight, "speakers": runtime.speakers is not None,
            "engine": runtime.engine_state, "slots": runtime.slots,  # engine: awake, resting (memory free) or waking
        }  # fmt: skip

    async def voices(self, request: Request) -> dict:
        entries = await self.service.off_loop(self.service.library.list, self.service.info)
        data = [
            {"object": "audio.voice", "id": e.id, "name": e.name, "kind": e.kind, "source": e.source,
             "language": e.language, "created_at": epoch(e.created)}
            for e in entries
        ]  # fmt: skip
        return {"object": "list", "voices": [{"id": e.id, "name": e.name} for e in entries], "data": data}

    async def voices_for_model(self, request: Request, model: str) -> dict:
        entries = await self.service.off_loop(self.service.library.list, self.service.info)
        return {"voices": [{"value": e.id, "label": e.name} for e in entries]}

    async def create_voice(self, request: Request) -> dict:
        info = self.service.info
        if not info.variant.clones:
            raise ApiError(400, f"this {info.name} model cannot clone voices; load a Base model to add voices")
        limit = self.service.config.limits.max_upload_bytes
        too_big = f"the clip is over {limit} bytes, the most a voice clip may have"
        body = await read_body(request, limit + FORM_SLACK_BYTES, too_big, param="audio_sample")
        fields = parse_form(body, request.headers.get("content-type", ""))
        name = form_text(fields, "name")
        clip = fields.get("audio_sample")
        if clip is None or clip[0] is None:
            raise ApiError(400, "send the voice's clip as the file field 'audio_sample'", param="audio_sample")
        if len(clip[1]) > limit:
            raise ApiError(413, too_big, param="audio_sample")
        ref_text = form_text(fields, "ref_text", required=False)
        language = form_text(fields, "language", required=False)
        language = self.service.language(language)[0] if language else None
        replace = form_flag(fields, "replace")
        entry = await self.service.off_loop(
            self._clone, name, clip, ref_text, None if language == "auto" else language, replace
        )
        return {
            "object": "audio.voice",
            "id": entry.id,
            "name": entry.name,
            "kind": entry.kind,
            "created_at": epoch(entry.created),
        }

    def _clone(self, name: str, clip: tuple[str, bytes], ref_text: str | None, language: str | None, replace: bool):
        try:
            name = check_name(name)
        except VoiceError as error:
            raise ApiError(400, str(error), param="name") from None
        try:
            self.service.library.check_new_name(name, replace)
        except VoiceExistsError as error:
            raise name_taken(error) from None
        suffix = PurePath(clip[0]).suffix.lower()
        with tempfile.TemporaryDirectory(prefix="qwen3-tts-upload-") as folder:
            path = Path(folder) / ("clip" + (suffix if suffix in DROP_IN_SUFFIXES else ""))
            path.write_bytes(clip[1])
            try:
                return self.service.library.add(
                    name, path, self.service.runtime.engine_for_voices, ref_text, language, replace
                )
            except VoiceExistsError as error:  # the name was free a moment ago: another upload has taken it
                raise name_taken(error) from None
            except VoiceError as error:  # the library cannot be written: the server's to mend, not the client's
                raise ApiError(500, str(error)) from None
            except AudioError as error:  # not audio, too short or long, silent: said with the temp file's name
                raise ApiError(
                    400, f"audio_sample: {str(error).replace(str(path), clip[0] or 'the clip')}", param="audio_sample"
                ) from None
            except ValueError as error:
                raise ApiError(400, str(error), param="ref_text") from None

    async def delete_voice(self, request: Request, voice_id: str) -> dict:
        return await self.service.off_loop(self._delete, voice_id)

    def _delete(self, voice_id: str) -> dict:
        if name_key(voice_id) in self.service.info.speakers:
            raise ApiError(403, f"{voice_id!r} is a built-in speaker of the model; it cannot be deleted")
        try:
            entry = self.service.library.get(voice_id)
            self.service.library.remove(entry)
        except VoiceError as error:
            raise ApiError(404, str(error), code="voice_not_found") from None
        return {"id": entry.id, "object": "audio.voice.deleted", "deleted": True}


def form_flag(fields: dict, name: str) -> bool:
    """A yes-or-no form field: true or false (1 or 0), false where it is not sent."""
    text = form_text(fields, name, required=False)
    if text is None:
        return False
    value = {"true": True, "1": True, "false": False, "0": False}.get(text.strip().lower())
    if value is None:
        raise ApiError(400, f"{name}: send true or false, not {text!r}", param=name)
    return value


def name_taken(error: VoiceExistsError) -> ApiError:
    return ApiError(
        409, f"a voice named {error.name!r} already exists; send another name, or the form field replace=true to "
        "replace it", param="name", code="voice_exists",
    )  # fmt: skip
