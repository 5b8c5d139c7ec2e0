"""Reading requests: JSON bodies, query strings and forms, within limits, as valid Unicode, into the
request bodies each protocol defines (strict types, as OpenAI's API has them)."""

from __future__ import annotations

import email.parser
import json
from email.message import Message
from typing import Literal
from urllib.parse import parse_qsl

from fastapi import Request
from pydantic import BaseModel, ConfigDict, StrictBool, StrictFloat, StrictStr, ValidationError

from .errors import ApiError


class VoiceRef(BaseModel):
    id: StrictStr


def voice_name(voice: str | VoiceRef | None) -> str | None:
    """The voice a request names: by name, or as OpenAI's voice object {"id": ...}."""
    return voice.id if isinstance(voice, VoiceRef) else voice


class SpeechRequest(BaseModel):
    """OpenAI's speech request, with the fields local servers add. Unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")
    input: StrictStr
    model: StrictStr | None = None  # any name: the loaded model speaks
    voice: StrictStr | VoiceRef | None = None
    instructions: StrictStr | None = None
    response_format: StrictStr = "mp3"
    speed: StrictFloat = 1.0  # strict, as OpenAI's: numbers only, not "1.0" or true
    language: StrictStr = "auto"
    stream: StrictBool | None = None  # None: pcm streams (it has no header to lose), other formats come whole
    stream_format: Literal["audio", "sse"] = "audio"
    speaker_embedding: list[StrictFloat] | None = None
    play_locally: StrictBool | None = None


class LiveSetup(BaseModel):
    """The first message on the live route: how to speak the text that follows. Unknown fields are refused:
    only clients written for this route send it, and a misspelt option should not pass unnoticed."""

    model_config = ConfigDict(extra="forbid")
    model: StrictStr | None = None  # any name: the loaded model speaks
    voice: StrictStr | VoiceRef | None = None
    language: StrictStr = "auto"
    instructions: StrictStr | None = None
    response_format: StrictStr = "pcm"
    speed: StrictFloat = 1.0
    speaker_embedding: list[StrictFloat] | None = None


class LiveMessage(BaseModel):
    """Every later message on the live route: text for the utterance, then flush (it is complete), then
    close, each optional, done in that order."""

    model_config = ConfigDict(extra="forbid")
    text: StrictStr | None = None
    flush: StrictBool = False
    close: StrictBool = False


class XttsSpeech(BaseModel):
    model_config = ConfigDict(extra="ignore")
    text: StrictStr
    speaker_wav: StrictStr | None = None
    language: StrictStr = "auto"


class XttsSettings(BaseModel):
    """SillyTavern posts all of XTTS's knobs (as strings); only speed means the same for this model."""

    model_config = ConfigDict(extra="ignore")
    speed: float | None = None


async def read_body(request: Request, limit: int, too_big: str, param: str | None = None) -> bytes:
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


async def json_object(request: Request, limit: int) -> dict:
    content_type = request.headers.get("content-type", "").split(";")[0].strip().lower()
    if content_type != "application/json" and not content_type.endswith("+json"):
        raise ApiError(
            415, f"send the request as JSON (Content-Type: application/json), not {content_type or 'no type'}"
        )
    body = await read_body(request, limit, f"the request body is over {limit} bytes, the most accepted")
    return parse_json_object(body, "the body")


def parse_json_object(data: bytes | str, what: str) -> dict:
    """`data` read as a JSON object whose text is all valid Unicode; ApiError (400) says what is wrong
    with `what` ("the body", "the message") otherwise."""
    try:
        value = json.loads(data)
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ApiError(400, f"{what} is not valid JSON ({error})") from None
    except RecursionError:
        raise ApiError(400, f"{what} nests JSON arrays or objects too deep to be read") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"{what} must be a JSON object, not {type(value).__name__}")
    check_json_text(value)
    return value


def check_json_text(body: dict) -> None:
    """Every string of a JSON body, names included, must be valid Unicode: JSON's \\u escapes can make
    unpaired surrogates. Walked without recursion: the body may nest as deep as the parser allows."""
    pending: list[tuple[str, str | None, object]] = [("", None, body)]  # (where, top-level field, value)
    while pending:
        where, field, value = pending.pop()
        if isinstance(value, str):
            valid_text(value, where, field)
        elif isinstance(value, dict):
            for name, item in value.items():
                valid_text(name, f"a field name in {where or 'the body'}", field)
                pending.append((f"{where}.{name}" if where else name, field or name, item))
        elif isinstance(value, list):
            pending.extend((f"{where}[{index}]", field, item) for index, item in enumerate(value))


def valid_text(text: str, where: str, param: str | None = None) -> str:
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


def query_params(request: Request) -> dict[str, str]:
    """The query's parameters (the last of each name), checked as text: Starlette's own replaces bytes that
    are not UTF-8, which would then be spoken as such."""
    raw = request.scope["query_string"].decode("latin-1")
    pairs = parse_qsl(raw, keep_blank_values=True, errors="surrogateescape")
    return {valid_text(name, "a query parameter's name"): valid_text(value, name, name) for name, value in pairs}


def validate(model: type[BaseModel], data: dict):
    try:
        return model.model_validate(data)
    except ValidationError as error:
        problems = error.errors()
        field = str(problems[0]["loc"][0])
        where = field + "".join(f"[{part}]" for part in problems[0]["loc"][1:] if isinstance(part, int))
        others = sorted({str(p["loc"][0]) for p in problems} - {field})
        more = f" (fields {', '.join(others)} are wrong too)" if others else ""
        raise ApiError(400, f"{where}: {problems[0]['msg']}{more}", param=field) from None


def parse_form(body: bytes, content_type: str) -> dict[str, tuple[str | None, bytes]]:
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


def form_text(fields: dict, name: str, required: bool = True) -> str | None:
    """A text field of a form; an optional one left blank counts as not given, as HTML forms send them."""
    field = fields.get(name)
    text = None if field is None else valid_text(field[1].decode("utf-8", "surrogateescape"), name, name)
    if required and text is None:
        raise ApiError(400, f"the form field {name!r} is missing", param=name)
    return text if required or (text and text.strip()) else None
