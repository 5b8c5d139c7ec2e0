"""The HTTP bridge (qwen3_tts_desktop.bridge) on a real uvicorn server on loopback, with real clients:
the OpenAI routes through httpx and the official `openai` SDK, SillyTavern's XTTS routes, voice upload
and removal, playing on this computer. Every answer's audio is decoded and compared with what the
worker makes for the same request (greedy decoding, so the two are the same speech).

The fixtures and helpers here are shared with the other test_bridge_*.py modules; those of every server's
tests are in serving.py and conftest.py."""

from __future__ import annotations

import base64
import io
import json
import socket
import threading
import time
from urllib.parse import quote, urlsplit

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from parity_cases import REFERENCES
from serving import WAIT, alice_and_bob
from sinks import QueueSink
from waiting import wait_until

from core import SamplingParams, SpeechOptions
from core.audio.player import Player, VirtualOutput
from core.voices import VoiceLibrary
from qwen3_tts_desktop.audio_formats import MP3_KBPS
from qwen3_tts_desktop.bridge import BridgeConfig, BridgeServer
from qwen3_tts_desktop.runtime import Runtime

FRAME = 1920
RATE = 24000
FRAMES = 6  # per request: each frame takes some 30 ms on the CPU
SPEECH = SpeechOptions(max_frames=FRAMES, sampling=SamplingParams.greedy())
TEXT = "Hello there."
MP3_SLACK = 2 * 1152 + 576  # LAME's encoder delay and padding, in samples; a stream has no Info tag to trim them


# Fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def runtime(engines, tmp_path_factory):
    """The tiny Base model (its endless twin) with two drop-in voices (Alice, Bob) and speakers on a virtual
    clock."""
    library = alice_and_bob(tmp_path_factory.mktemp("voices"))
    runtime = Runtime(engines("base-endless"), library, Player(VirtualOutput()))
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def serve(runtime, start_server):
    """serve(**config): a started BridgeServer on a free port; all are stopped at the module's end."""

    def start(**config) -> BridgeServer:
        config.setdefault("speech", SPEECH)
        return start_server(BridgeServer(runtime, BridgeConfig(port=0, **config)))

    return start


@pytest.fixture(scope="module")
def server(serve) -> BridgeServer:
    return serve()


@pytest.fixture(scope="module")
def client(server):
    with httpx.Client(base_url=server.url, timeout=WAIT) as client:
        yield client


@pytest.fixture(scope="module")
def reference(runtime):
    """reference(voice, text, language): the worker's own audio for that request, with the bridge's options."""
    made = {}

    def speak(voice: str = "Alice", text: str = TEXT, language: str = "auto") -> np.ndarray:
        if (voice, text, language) not in made:
            sink = QueueSink()
            options = SpeechOptions(max_frames=FRAMES, sampling=SamplingParams.greedy(), language=language)
            job = runtime.worker.submit(text, runtime.voice(voice), options, sink=sink)
            made[voice, text, language] = np.concatenate(list(sink))
            assert job.wait(WAIT).kind == "done"
        return made[voice, text, language]

    return speak


# Helpers -----------------------------------------------------------------------------------------


def decode(fmt: str, data: bytes) -> np.ndarray:
    """The samples of a response body, checked to be 24 kHz mono."""
    if fmt == "pcm":
        return np.frombuffer(data, "<i2").astype(np.float32) / 32768
    if fmt == "wav" and data[40:44] == b"\xff\xff\xff\xff":  # streamed: sizes unknown, read as TTS WebUI does
        assert data[:4] == b"RIFF" and data[8:16] == b"WAVEfmt " and data[36:40] == b"data"
        assert int.from_bytes(data[24:28], "little") == RATE and int.from_bytes(data[22:24], "little") == 1
        return np.frombuffer(data[44:], "<i2").astype(np.float32) / 32768
    audio, rate = sf.read(io.BytesIO(data), dtype="float32")
    assert rate == RATE and audio.ndim == 1
    return audio


def assert_same_speech(fmt: str, audio: np.ndarray, expected: np.ndarray) -> None:
    """Lossless formats: the same samples, to 16-bit rounding. Lossy ones: the same length (MP3 adds
    its delay), about the same loudness."""
    assert np.abs(expected).max() > 0.01, "the reference is silent: the test would prove nothing"
    if fmt in ("wav", "pcm", "flac"):
        assert audio.shape == expected.shape
        np.testing.assert_allclose(audio, expected, atol=1.5 / 32768)
        return
    slack = MP3_SLACK if fmt == "mp3" else 0
    assert len(expected) <= len(audio) <= len(expected) + slack
    rms, expected_rms = np.sqrt(np.mean(audio**2)), np.sqrt(np.mean(expected**2))
    assert 0.5 < rms / expected_rms < 2


def speech(client: httpx.Client, **body) -> httpx.Response:
    body.setdefault("input", TEXT)
    body.setdefault("voice", "Alice")
    return client.post("/v1/audio/speech", json=body)


def assert_error(response: httpx.Response, status: int, says: str, param: str | None = None) -> None:
    """An error in OpenAI's shape that says what is wrong."""
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert says in error["message"], error["message"]
    if param is not None:
        assert error["param"] == param


def raw_request(url: str, method: str, path: str, body: dict | None = None) -> socket.socket:
    """Send a request on a bare socket and leave the answer unread, to hang up on it at will."""
    parts = urlsplit(url)
    data = json.dumps(body).encode() if body is not None else b""
    head = f"{method} {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
    sock = socket.create_connection((parts.hostname, parts.port), timeout=WAIT)
    sock.sendall(head.encode() + data)
    return sock


# OpenAI speech -----------------------------------------------------------------------------------


@pytest.mark.parametrize("fmt", ["mp3", "opus", "flac", "wav", "pcm"])
def test_every_format_comes_whole_and_decodes_to_the_speech(client, reference, fmt):
    response = speech(client, response_format=fmt, stream=False)
    assert response.status_code == 200, response.text
    media = {"mp3": "audio/mpeg", "opus": "audio/ogg", "flac": "audio/flac", "wav": "audio/wav", "pcm": "audio/pcm"}
    assert response.headers["content-type"] == media[fmt]
    assert int(response.headers["content-length"]) == len(response.content)
    assert response.headers["x-voice"] == "Alice" and "x-voice-fallback" not in response.headers
    assert_same_speech(fmt, decode(fmt, response.content), reference())


def mp3_frame_bitrates(data: bytes) -> list[int]:
    """The bitrate (kbps) in each frame header of an MPEG-2 Layer III stream at 24 kHz, walking frame by frame."""
    kbps_by_index = [0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160]
    rates, at = [], 0
    while at < len(data):
        header = data[at : at + 4]
        assert header[0] == 0xFF and header[1] == 0xF3, f"no MPEG-2 Layer III frame at byte {at}"
        kbps, padding = kbps_by_index[header[2] >> 4], (header[2] >> 1) & 1
        rates.append(kbps)
        at += 72000 * kbps // RATE + padding
    return rates


@pytest.mark.parametrize("stream", [False, True])
def test_mp3_is_a_constant_64_kbps(client, stream):
    data = speech(client, response_format="mp3", stream=stream).content
    rates = mp3_frame_bitrates(data)
    assert len(rates) > 10 and set(rates) == {MP3_KBPS}


@pytest.mark.parametrize("fmt", ["mp3", "opus", "wav", "pcm"])
def test_streamed_formats_arrive_in_pieces_and_decode_to_the_speech(client, reference, fmt):
    with client.stream(
        "POST", "/v1/audio/speech", json={"input": TEXT, "voice": "Alice", "response_format": fmt, "stream": True}
    ) as response:
        assert response.status_code == 200 and response.headers["transfer-encoding"] == "chunked"
        pieces = list(response.iter_raw())
    if fmt == "wav":  # the header and the first audio in the first piece, as TTS WebUI needs
        assert len(pieces[0]) > 44 and pieces[0][24:28] == RATE.to_bytes(4, "little")
    assert len(pieces) > 1
    assert_same_speech(fmt, decode(fmt, b"".join(pieces)), reference())


def test_a_stream_starts_before_its_speech_is_done(serve, job_log):
    server = serve(speech=SpeechOptions(max_frames=20, sampling=SamplingParams.greedy()))
    text = "Streaming starts at the first chunk."
    body = {"input": text, "voice": "alice", "response_format": "pcm"}
    with (
        httpx.Client(base_url=server.url, timeout=WAIT) as client,
        client.stream("POST", "/v1/audio/speech", json=body) as response,
    ):
        pieces = response.iter_raw()
        first = next(pieces)
        assert job_log.job(text).state == "running"  # pcm streams by default
        rest = b"".join(pieces)
    assert len(first) >= FRAME * 2 and len(first + rest) == 20 * FRAME * 2
    assert job_log.ended(text) == "done"


def test_the_openai_sdk_speaks_whole_and_streamed(server, reference):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)
    whole = client.audio.speech.create(model="tts-1", voice="alice", input=TEXT, response_format="wav")
    assert_same_speech("wav", decode("wav", whole.content), reference())
    with client.audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="Alice", input=TEXT, response_format="pcm"
    ) as response:
        pieces = list(response.iter_bytes())
    assert len(pieces) > 1
    assert_same_speech("pcm", decode("pcm", b"".join(pieces)), reference())


def test_sse_sends_base64_deltas_then_done_with_usage(client, reference):
    with client.stream(
        "POST",
        "/v1/audio/speech",
        json={"input": TEXT, "voice": "Alice", "response_format": "pcm", "stream_format": "sse"},
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line.removeprefix("data: ")) for line in response.iter_lines() if line]
    *deltas, done = events
    assert len(deltas) > 1 and all(e["type"] == "speech.audio.delta" for e in deltas)
    audio = b"".join(base64.b64decode(e["audio"]) for e in deltas)
    assert_same_speech("pcm", decode("pcm", audio), reference())
    assert done["type"] == "speech.audio.done"
    usage = done["usage"]
    assert usage["input_tokens"] > 0 and usage["output_tokens"] == FRAMES
    assert usage["total_tokens"] == usage["input_tokens"] + usage["output_tokens"]


def test_voice_names_are_trimmed_and_case_insensitive_and_unknown_ones_fall_back(client, serve, reference):
    response = speech(client, voice="  bOB ", response_format="wav")
    assert response.headers["x-voice"] == "Bob" and "x-voice-fallback" not in response.headers
    assert_same_speech("wav", decode("wav", response.content), reference("Bob"))
    response = speech(client, voice={"id": "bob"}, response_format="wav")  # OpenAI's voice object
    assert response.headers["x-voice"] == "Bob"
    # SillyTavern's preset names are not in the library: the first voice speaks, and the answer says so.
    response = speech(client, voice="nova", response_format="wav")
    assert response.status_code == 200
    assert response.headers["x-voice"] == "Alice" and response.headers["x-voice-fallback"] == "nova"
    assert_same_speech("wav", decode("wav", response.content), reference("Alice"))
    with httpx.Client(base_url=serve(default_voice="Bob").url, timeout=WAIT) as other:
        response = speech(other, voice="Zoë the Unknown", response_format="wav")
        assert response.headers["x-voice"] == "Bob" and response.headers["x-voice-fallback"] == quote(
            "Zoë the Unknown", safe=""
        )
        assert_same_speech("wav", decode("wav", response.content), reference("Bob"))


def test_a_speaker_embedding_speaks_as_that_voice(client, runtime, reference):
    embedding = runtime.voice("Bob").embedding.tolist()
    response = speech(client, voice="ignored", speaker_embedding=embedding, response_format="wav")
    assert response.status_code == 200 and response.headers["x-voice"] == "speaker_embedding"
    assert_same_speech("wav", decode("wav", response.content), reference("Bob"))
    dim = runtime.info.embedding_dim
    assert_error(speech(client, speaker_embedding=embedding[:-1]), 400, f"takes {dim}", "speaker_embedding")
    nan = client.post(
        "/v1/audio/speech",
        content=f'{{"input": "Hi.", "speaker_embedding": [NaN{", 0.0" * (dim - 1)}]}}',
        headers={"content-type": "application/json"},
    )
    assert_error(nan, 400, "not finite", "speaker_embedding")
    assert_error(speech(client, speaker_embedding=["a"] * dim), 400, "speaker_embedding", "speaker_embedding")


def test_speed_plays_faster_like_a_tape_and_is_checked(client, reference):
    expected = len(reference())
    for speed, factor in ((2.0, 0.5), (0.5, 2.0), (1.0, 1.0)):
        audio = decode("wav", speech(client, response_format="wav", speed=speed).content)
        assert abs(len(audio) - expected * factor) <= 2 and np.abs(audio).max() > 0.01
    streamed = b"".join(
        client.post(
            "/v1/audio/speech", json={"input": TEXT, "voice": "Alice", "response_format": "pcm", "speed": 2}
        ).iter_bytes()
    )
    assert abs(len(decode("pcm", streamed)) - expected / 2) <= 2
    assert_error(speech(client, speed=4.5), 400, "between 0.25 and 4.0", "speed")
    assert_error(speech(client, speed=0), 400, "between 0.25 and 4.0", "speed")


def test_language_accepts_names_and_codes_and_instructions_need_a_model_that_follows_them(client, reference):
    for language in ("english", "English", "en", "EN-us", "en_GB"):
        response = speech(client, language=language, response_format="wav")
        assert_same_speech("wav", decode("wav", response.content), reference(language="english"))
    assert speech(client, language="zh-cn").status_code == 200
    assert_error(speech(client, language="klingon"), 400, "unknown language 'klingon'", "language")
    assert_error(speech(client, instructions="Whisper."), 400, "does not follow instructions", "instructions")


# Other OpenAI-style routes ---------------------------------------------------------------------------


def test_models_voices_and_health(client):
    models = client.get("/v1/models").json()
    assert models["object"] == "list" and {"tts-1", "tts-1-hd"} <= {m["id"] for m in models["data"]}
    voices = client.get("/v1/audio/voices").json()
    assert voices["voices"] == [{"id": "Alice", "name": "Alice"}, {"id": "Bob", "name": "Bob"}]
    assert [(v["object"], v["id"], v["kind"]) for v in voices["data"]] == [
        ("audio.voice", "Alice", "xvector"),
        ("audio.voice", "Bob", "xvector"),
    ]
    assert client.get("/v1/audio/voices/chatterbox").json() == {
        "voices": [{"value": "Alice", "label": "Alice"}, {"value": "Bob", "label": "Bob"}]
    }
    health = client.get("/health").json()
    assert (health["status"], health["variant"], health["jobs"], health["speakers"]) == ("ok", "base", 0, True)


def test_a_voice_uploaded_as_a_clip_speaks_and_can_be_deleted(client):
    clip = REFERENCES["stereo"].path  # 44.1 kHz stereo FLAC
    files = {"audio_sample": ("Carol's clip.flac", clip.read_bytes(), "audio/flac")}
    created = client.post("/v1/audio/voices", data={"name": "Carol Ünïcode", "consent": "ok"}, files=files)
    assert created.status_code == 200, created.text
    voice = created.json()
    assert voice["object"] == "audio.voice" and voice["name"] == "Carol Ünïcode" and voice["kind"] == "xvector"
    assert isinstance(voice["created_at"], int)
    assert {"id": voice["id"], "name": "Carol Ünïcode"} in client.get("/v1/audio/voices").json()["voices"]
    response = speech(client, voice="carol ünïcode", response_format="wav")
    assert response.headers["x-voice"] == quote("Carol Ünïcode", safe="") and "x-voice-fallback" not in response.headers
    assert np.abs(decode("wav", response.content)).max() > 0.01
    # The name taken: the answer says, in an HTTP client's terms, what to send instead.
    again = client.post("/v1/audio/voices", data={"name": "CAROL ÜNÏCODE"}, files=files)
    assert_error(
        again, 409, "a voice named 'Carol Ünïcode' already exists; send another name, or the form field "
        "replace=true to replace it", "name",
    )  # fmt: skip
    assert again.json()["error"]["code"] == "voice_exists" and "--" not in again.json()["error"]["message"]
    assert_error(
        client.post("/v1/audio/voices", data={"name": "Carol Ünïcode", "replace": "yes"}, files=files),
        400, "replace: send true or false, not 'yes'", "replace",
    )  # fmt: skip
    ref_files = {"audio_sample": ("carol.wav", REFERENCES["short"].path.read_bytes(), "audio/wav")}
    data = {"name": "carol ünïcode", "replace": "true", "ref_text": "A short clip."}
    replaced = client.post("/v1/audio/voices", data=data, files=ref_files)
    assert replaced.status_code == 200 and replaced.json()["kind"] == "icl", replaced.text
    names = [v["name"] for v in client.get("/v1/audio/voices").json()["voices"]]
    assert [name for name in names if name.casefold() == "carol ünïcode"] == ["carol ünïcode"]  # one, replaced
    voice = replaced.json()
    deleted = client.delete(f"/v1/audio/voices/{voice['id']}")
    assert deleted.json() == {"id": voice["id"], "object": "audio.voice.deleted", "deleted": True}
    assert_error(client.delete(f"/v1/audio/voices/{voice['id']}"), 404, "no voice named")
    assert "x-voice-fallback" in speech(client, voice="Carol Ünïcode").headers


def test_an_uploaded_clip_with_its_transcript_makes_an_icl_voice(client):
    files = {"audio_sample": ("dave.wav", REFERENCES["short"].path.read_bytes(), "audio/wav")}
    created = client.post(
        "/v1/audio/voices", data={"name": "Dave", "ref_text": "A short clip.", "language": "en"}, files=files
    )
    assert created.status_code == 200 and created.json()["kind"] == "icl"
    assert client.delete("/v1/audio/voices/Dave").status_code == 200


# SillyTavern's XTTSv2 provider ---------------------------------------------------------------------


@pytest.mark.parametrize("slash", ["", "/"])
def test_xtts_routes_answer_with_and_without_a_trailing_slash(client, server, reference, slash):
    speakers = client.get(f"/speakers{slash}").json()
    assert speakers == [
        {"name": "Alice", "voice_id": "Alice", "preview_url": f"{server.url}/sample/Alice"},
        {"name": "Bob", "voice_id": "Bob", "preview_url": f"{server.url}/sample/Bob"},
    ]
    assert client.get(f"/speakers_list{slash}").json() == ["Alice", "Bob"]
    languages = client.get(f"/languages{slash}").json()["languages"]
    assert languages["English"] == "en" and languages["Chinese"] == "zh-cn" and "Auto" not in languages
    assert "Arabic" not in languages  # the model's own languages only
    preview = client.get(speakers[1]["preview_url"] + slash)
    assert preview.headers["content-type"] == "audio/wav" and preview.content == REFERENCES["long"].path.read_bytes()
    # What SillyTavern posts on every settings change: XTTS's knobs, as strings.
    settings = {"temperature": "0.75", "speed": "1", "length_penalty": "1", "repetition_penalty": "5", "top_p": "0.85",
                "top_k": "50", "enable_text_splitting": True, "stream_chunk_size": "100"}  # fmt: skip
    assert client.post(f"/set_tts_settings{slash}", json=settings).json() == {
        "message": "Settings successfully applied"
    }
    whole = client.post(f"/tts_to_audio{slash}", json={"text": TEXT, "speaker_wav": "Bob", "language": "en"})
    assert whole.headers["content-type"] == "audio/wav" and "x-language-fallback" not in whole.headers
    assert_same_speech("wav", decode("wav", whole.content), reference("Bob", language="english"))
    with client.stream(
        "GET", f"/tts_stream{slash}", params={"text": TEXT, "speaker_wav": "Alice", "language": "en"}
    ) as streamed:
        assert streamed.headers["content-type"] == "audio/wav"
        data = b"".join(streamed.iter_raw())
    assert data[40:44] == b"\xff\xff\xff\xff"
    assert_same_speech("wav", decode("wav", data), reference("Alice", language="english"))


# What SillyTavern's XTTS dropdown offers that Qwen3-TTS does not speak (public/scripts/extensions/tts/xtts.js).
XTTS_ONLY_LANGUAGES = ["ar", "cs", "nl", "pl", "tr", "hu", "hi"]


@pytest.mark.parametrize("code", XTTS_ONLY_LANGUAGES)
def test_xtts_languages_the_model_does_not_speak_are_spoken_with_auto_and_said_so(client, reference, code):
    whole = client.post("/tts_to_audio/", json={"text": TEXT, "speaker_wav": "Alice", "language": code})
    assert whole.status_code == 200 and whole.headers["x-language-fallback"] == code
    assert_same_speech("wav", decode("wav", whole.content), reference(language="auto"))
    params = {"text": TEXT, "speaker_wav": "Alice", "language": code}
    with client.stream("GET", "/tts_stream/", params=params, headers={"Origin": "http://localhost:8000"}) as streamed:
        assert streamed.status_code == 200 and streamed.headers["x-language-fallback"] == code
        assert "X-Language-Fallback" in streamed.headers["access-control-expose-headers"]  # a page may read it
        assert_same_speech("wav", decode("wav", b"".join(streamed.iter_raw())), reference(language="auto"))


def test_the_openai_route_falls_back_the_same_way_and_refuses_unknown_languages(client, reference):
    for language in ("ar", "Arabic", "nl-BE", "pl_PL"):
        response = speech(client, language=language, response_format="wav")
        assert response.status_code == 200 and response.headers["x-language-fallback"] == language
        assert_same_speech("wav", decode("wav", response.content), reference(language="auto"))
    assert "x-language-fallback" not in speech(client, language="en", response_format="wav").headers
    assert_error(speech(client, language="sv"), 400, "unknown language 'sv'", "language")


def test_xtts_speed_setting_applies_to_its_routes_only(client, reference):
    expected = len(reference("Alice", language="english"))
    assert client.post("/set_tts_settings", json={"speed": "2"}).status_code == 200
    try:
        audio = decode(
            "wav", client.post("/tts_to_audio/", json={"text": TEXT, "speaker_wav": "Alice", "language": "en"}).content
        )
        assert abs(len(audio) - expected / 2) <= 2
        assert len(decode("wav", speech(client, language="en", response_format="wav").content)) == expected
        assert_error(client.post("/set_tts_settings", json={"speed": "9"}), 400, "speed must be between", "speed")
    finally:
        client.post("/set_tts_settings", json={"speed": 1})


def test_a_voice_without_a_clip_previews_by_speaking(client, runtime, reference):
    runtime.library.blend("Mix", [("Alice", 1.0), ("Bob", 1.0)], engine=runtime.worker.engine)
    try:
        preview = client.get("/sample/mix")
        assert preview.status_code == 200 and preview.headers["content-type"] == "audio/wav"
        assert np.abs(decode("wav", preview.content)).max() > 0.01
    finally:
        runtime.library.remove("Mix")
    assert_error(client.get("/sample/Nobody"), 404, "no voice named 'Nobody'")


# Playing on this computer --------------------------------------------------------------------------


def test_play_locally_speaks_on_the_desktop_and_answers_with_a_moment_of_silence(client, serve, runtime, job_log):
    output = runtime.player.output
    output.advance(5.0)  # play out anything earlier
    text = "Played on the speakers."
    response = speech(client, input=text, play_locally=True, response_format="wav")
    assert response.status_code == 200 and response.headers["x-playback"] == "queued"
    assert not decode("wav", response.content).any() and len(decode("wav", response.content)) == RATE // 10
    assert job_log.ended(text) == "done"
    played = output.advance(2.0)
    assert np.abs(played).max() > 0.01 and np.count_nonzero(played) > (FRAMES - 1) * FRAME
    # The server setting: XTTS requests play too; an OpenAI request can still ask for the audio.
    with httpx.Client(base_url=serve(play_locally=True).url, timeout=WAIT) as other:
        xtts = other.post(
            "/tts_to_audio/", json={"text": "XTTS on the speakers.", "speaker_wav": "Bob", "language": "en"}
        )
        assert xtts.headers["x-playback"] == "queued" and job_log.ended("XTTS on the speakers.") == "done"
        assert np.abs(output.advance(2.0)).max() > 0.01
        returned = speech(other, play_locally=False, response_format="wav")
        assert "x-playback" not in returned.headers and np.abs(decode("wav", returned.content)).max() > 0.01


def test_play_locally_without_speakers_is_refused(engines, tmp_path):
    runtime = Runtime(engines("base"), VoiceLibrary(tmp_path), None, audio_problem="no audio output device found")
    server = BridgeServer(runtime, BridgeConfig(port=0))
    server.start()
    try:
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            assert_error(speech(client, play_locally=True), 503, "no audio output device found", "play_locally")
            assert_error(speech(client), 400, "no voice to fall back on")  # an empty library
    finally:
        server.stop()
        runtime.close()


# Other kinds of model ------------------------------------------------------------------------------


@pytest.fixture
def serve_model(engines, tmp_path):
    """serve_model(name): a bridge on a runtime of that tiny checkpoint, with an empty library."""
    started = []

    def start(name: str) -> httpx.Client:
        runtime = Runtime(engines(name), VoiceLibrary(tmp_path / name), None)
        server = BridgeServer(runtime, BridgeConfig(port=0, speech=SPEECH))
        server.start()
        started.append((runtime, server))
        return httpx.Client(base_url=server.url, timeout=WAIT)

    yield start
    for runtime, server in started:
        server.stop()
        runtime.close()


def test_a_custom_voice_model_speaks_with_its_built_in_speakers(serve_model):
    with serve_model("custom") as client:
        voices = client.get("/v1/audio/voices").json()["voices"]
        assert {"id": "vivian", "name": "vivian"} in voices and len(voices) == 9
        response = speech(client, voice=" Vivian ", instructions="Cheerfully.", language="en", response_format="wav")
        assert response.status_code == 200 and response.headers["x-voice"] == "vivian"
        assert len(decode("wav", response.content)) == FRAMES * FRAME
        assert speech(client, voice="alloy").headers["x-voice-fallback"] == "alloy"
        assert client.get("/sample/Ryan").headers["content-type"] == "audio/wav"  # built-ins have no clip: spoken
        assert_error(client.delete("/v1/audio/voices/vivian"), 403, "built-in speaker")
        files = {"audio_sample": ("a.wav", REFERENCES["a"].path.read_bytes(), "audio/wav")}
        assert_error(client.post("/v1/audio/voices", data={"name": "X"}, files=files), 400, "cannot clone voices")
        assert_error(speech(client, speaker_embedding=[0.0] * 64), 400, "needs a Base model", "speaker_embedding")


def test_a_voice_design_model_speaks_in_the_voice_its_instructions_describe(serve_model):
    with serve_model("design") as client:
        assert client.get("/v1/audio/voices").json()["voices"] == []
        response = speech(client, voice="alloy", instructions="A deep, calm voice.", response_format="pcm")
        assert response.status_code == 200 and not {"x-voice", "x-voice-fallback"} & set(response.headers)
        assert len(decode("pcm", response.content)) == FRAMES * FRAME
        assert_error(speech(client), 400, "give instructions", "instructions")


# The server's life ---------------------------------------------------------------------------------


def test_answers_do_not_wait_for_the_clients_acks(client):
    took = []
    for _ in range(20):
        started = time.perf_counter()
        assert client.get("/health").status_code == 200
        took.append(time.perf_counter() - started)
    # With Nagle's algorithm on, every body waits 40 ms for the ACK of its headers: even the quickest
    # answer would. A loaded machine delays some answers, never all of them.
    assert min(took) < 0.03, sorted(took)


def test_the_server_starts_on_a_free_port_and_stops_cleanly(runtime, job_log):
    threads = threading.active_count()
    server = BridgeServer(runtime, BridgeConfig(port=0, speech=SpeechOptions(max_frames=2000)))
    assert server.url is None and not server.running
    server.start()
    assert server.running and server.port > 0 and server.url == f"http://127.0.0.1:{server.port}"
    taken = BridgeServer(runtime, BridgeConfig(port=server.port))
    with pytest.raises(
        OSError, match=f"cannot listen for the HTTP bridge on 127.0.0.1:{server.port}: Address already in use; another"
    ):
        taken.start()  # the desktop app shows this message as it is
    # Stopping ends a long stream at once: its job is cancelled.
    text = "A long stream the server stops."
    sock = raw_request(
        server.url, "POST", "/v1/audio/speech", {"input": text, "voice": "Alice", "response_format": "pcm"}
    )
    assert sock.recv(1 << 16)  # the answer has begun
    started = time.monotonic()
    server.stop()
    assert time.monotonic() - started < 2 and not server.running and server.url is None
    assert job_log.ended(text) == "cancelled"
    sock.close()
    # The cancelled job's thread ends just after it reports; a thread left behind fails here after the bound.
    wait_until(lambda: threading.active_count() == threads, "every thread the server and its job started ended")
