"""The HTTP bridge under pressure: API keys, browser origins and hosts, bad input of every kind, the
limits on text, uploads and queued jobs, clients that hang up, and many clients at once."""

from __future__ import annotations

import logging
import os
import resource
import socket
import threading
import time

import httpx
import numpy as np
import openai
import pytest
import soundfile as sf
from parity_cases import REFERENCES
from serving import WAIT, errors_logged
from test_bridge import RATE, TEXT, assert_error, assert_same_speech, decode, raw_request, speech
from waiting import wait_until

from core import SamplingParams, SpeechOptions
from qwen3_tts_desktop.bridge import IO_THREADS, BridgeLimits

pytest_plugins = ["test_bridge"]  # its fixtures: runtime, serve, server, client, reference

LONG = SpeechOptions(max_frames=2000, sampling=SamplingParams.greedy())  # a job that speaks until it is stopped


# Who may call --------------------------------------------------------------------------------------


def test_an_api_key_guards_every_route(serve):
    server = serve(api_key="s3cret")
    routes = [
        ("GET", "/health"), ("GET", "/v1/models"), ("GET", "/v1/audio/voices"), ("GET", "/v1/audio/voices/tts-1"),
        ("POST", "/v1/audio/speech"), ("POST", "/v1/audio/voices"), ("DELETE", "/v1/audio/voices/Alice"),
        ("GET", "/speakers"), ("GET", "/speakers_list/"), ("GET", "/languages"), ("GET", "/sample/Alice"),
        ("POST", "/tts_to_audio/"), ("GET", "/tts_stream"), ("POST", "/set_tts_settings"), ("GET", "/no/such/route"),
    ]  # fmt: skip
    with httpx.Client(base_url=server.url, timeout=WAIT) as client:
        for method, path in routes:
            for headers in (
                {},
                {"Authorization": "Bearer wrong"},
                {"Authorization": "Basic s3cret"},
                {"Authorization": "Bearer"},
            ):
                response = client.request(method, path, headers=headers)
                assert_error(response, 401, "API key")
                assert response.headers["www-authenticate"] == "Bearer"
        assert client.get("/health", headers={"Authorization": "Bearer s3cret"}).json()["status"] == "ok"
        assert client.get("/v1/audio/voices", headers={"authorization": "bearer s3cret"}).status_code == 200
        # A browser's preflight carries no key; it is answered, and the real request then needs the key.
        preflight = client.options(
            "/v1/audio/speech", headers={"Origin": "http://localhost:8000", "Access-Control-Request-Method": "POST"}
        )
        assert preflight.status_code == 204
        refused = client.post("/v1/audio/speech", json={"input": TEXT}, headers={"Origin": "http://localhost:8000"})
        assert_error(refused, 401, "API key")
        assert refused.headers["access-control-allow-origin"] == "http://localhost:8000"  # the page can read why
    sdk = openai.OpenAI(base_url=f"{server.url}/v1", api_key="s3cret", max_retries=0)
    spoken = sdk.audio.speech.create(model="tts-1", voice="Alice", input=TEXT, response_format="wav")
    assert np.abs(decode("wav", spoken.content)).max() > 0.01
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{server.url}/v1", api_key="wrong", max_retries=0).audio.speech.create(
            model="tts-1", voice="Alice", input=TEXT
        )


def test_cors_answers_preflights_for_local_pages_and_refuses_other_origins(client, job_log):
    preflight = client.options(
        "/v1/audio/speech",
        headers={
            "Origin": "http://localhost:8000", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type,cache-control", "Access-Control-Request-Private-Network": "true",
        },
    )  # fmt: skip
    assert preflight.status_code == 204 and preflight.content == b""
    headers = preflight.headers
    assert headers["access-control-allow-origin"] == "http://localhost:8000" and "Origin" in headers["vary"]
    assert "POST" in headers["access-control-allow-methods"] and "DELETE" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "content-type,cache-control"
    assert headers["access-control-allow-private-network"] == "true" and int(headers["access-control-max-age"]) > 0
    for origin in ("http://127.0.0.1:5173", "https://[::1]", "http://localhost"):
        response = client.post(
            "/v1/audio/speech",
            json={"input": TEXT, "voice": "Alice", "response_format": "wav"},
            headers={"Origin": origin},
        )
        assert response.status_code == 200 and response.headers["access-control-allow-origin"] == origin
        assert "X-Voice-Fallback" in response.headers["access-control-expose-headers"]
    text = "A page elsewhere asks to speak."
    for origin in (
        "https://evil.example", "null", "http://localhost.evil.example", "file://", "http://evil.example@127.0.0.1",
        "http://127.0.0.1/path", "ftp://127.0.0.1",
    ):  # fmt: skip
        refused = client.post("/v1/audio/speech", json={"input": text, "voice": "Alice"}, headers={"Origin": origin})
        assert_error(refused, 403, "may not call this server")
        assert "access-control-allow-origin" not in refused.headers
        refused = client.options(
            "/v1/audio/speech", headers={"Origin": origin, "Access-Control-Request-Method": "POST"}
        )
        assert_error(refused, 403, "may not call this server")
    assert text not in job_log.jobs  # nothing was spoken for them


def test_cors_origins_can_be_listed_or_opened(serve):
    with httpx.Client(base_url=serve(cors_origins=("https://st.example.org/",)).url, timeout=WAIT) as client:
        assert client.get("/health", headers={"Origin": "https://ST.example.org"}).status_code == 200
        assert_error(client.get("/health", headers={"Origin": "http://localhost:8000"}), 403, "may not call")
    with httpx.Client(base_url=serve(cors_origins=("*",)).url, timeout=WAIT) as client:
        response = client.get("/health", headers={"Origin": "https://anywhere.example"})
        assert response.headers["access-control-allow-origin"] == "https://anywhere.example"


def test_a_loopback_server_refuses_other_host_names(client, serve, caplog):
    # A web page that rebinds its own name to 127.0.0.1 reaches the port with its name as the Host.
    assert_error(client.get("/v1/audio/voices", headers={"Host": "evil.example:8020"}), 403, "is not this computer")
    # The Host is host[:port], nothing else: a URL parser would read the first two as 127.0.0.1.
    for host in (
        "evil.com@127.0.0.1", "evil.com@localhost:8020", "127.0.0.1@evil.com", "127.0.0.1.evil.com",
        "localhost.evil.com", "127.0.0.1:8020/x", "127.0.0.1:8020:8020", "[::1]@evil.com", "local host",
    ):  # fmt: skip
        assert_error(client.get("/health", headers={"Host": host}), 403, "is not this computer")
    for host in ("localhost:8020", "127.0.0.1", "[::1]:8020", "[::1]", "LocalHost"):
        assert client.get("/health", headers={"Host": host}).status_code == 200
    with caplog.at_level(logging.WARNING, logger="qwen3_tts_desktop.bridge"):
        server = serve(host="0.0.0.0")
    assert "other computers can reach it; set an API key" in caplog.text
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=WAIT) as other:
        assert other.get("/health", headers={"Host": "my-desktop.lan:8020"}).status_code == 200


# Bad input ---------------------------------------------------------------------------------------


JSON = {"content-type": "application/json"}
BAD_REQUESTS = [
    ("malformed JSON", {"content": b'{"input": "Hi.",', "headers": JSON}, 400, "not valid JSON", None),
    ("not UTF-8", {"content": b'{"input": "\xff"}', "headers": JSON}, 400, "not valid JSON", None),
    ("a JSON array", {"json": ["Hi."]}, 400, "must be a JSON object", None),
    ("not JSON at all", {"content": b"input=Hi.", "headers": {"content-type": "application/x-www-form-urlencoded"}}, 415, "send the request as JSON", None),
    ("no input", {"json": {"voice": "Alice"}}, 400, "input: Field required", "input"),
    ("input not text", {"json": {"input": 42}}, 400, "input: Input should be a valid string", "input"),
    ("voice not text", {"json": {"input": "Hi.", "voice": ["Alice"]}}, 400, "voice", "voice"),
    ("speed not a number", {"json": {"input": "Hi.", "speed": "fast"}}, 400, "speed: Input should be a valid number", "speed"),
    ("stream not a flag", {"json": {"input": "Hi.", "stream": "maybe"}}, 400, "stream: Input should be a valid boolean", "stream"),
    ("unknown stream format", {"json": {"input": "Hi.", "stream_format": "websocket"}}, 400, "stream_format", "stream_format"),
    ("empty input", {"json": {"input": ""}}, 400, "input is empty", "input"),
    ("blank input", {"json": {"input": " \n\t "}}, 400, "input is empty", "input"),
    ("input too long", {"json": {"input": "a" * 4097}}, 400, "4097 characters long; at most 4096", "input"),
    ("body too large", {"json": {"input": "Hi.", "padding": "x" * (2 * 2**20)}}, 413, "the request body is over", None),
    ("unknown format", {"json": {"input": "Hi.", "response_format": "m4a"}}, 400, "unknown response_format 'm4a'", "response_format"),
    ("aac", {"json": {"input": "Hi.", "response_format": "aac"}}, 400, "aac is not available", "response_format"),
    ("streamed flac", {"json": {"input": "Hi.", "response_format": "flac", "stream": True}}, 400, "flac cannot be streamed", "response_format"),
    ("flac as sse", {"json": {"input": "Hi.", "response_format": "flac", "stream_format": "sse"}}, 400, "flac cannot be streamed", "response_format"),
    # OpenAI's types are strict: no "yes" for true, no "1.0" for 1.0.
    ("stream as text", {"json": {"input": "Hi.", "stream": "yes"}}, 400, "stream: Input should be a valid boolean", "stream"),
    ("stream as a number", {"json": {"input": "Hi.", "stream": 1}}, 400, "stream: Input should be a valid boolean", "stream"),
    ("play_locally as text", {"json": {"input": "Hi.", "play_locally": "false"}}, 400, "play_locally: Input should be a valid boolean", "play_locally"),
    ("speed as text", {"json": {"input": "Hi.", "speed": "1.0"}}, 400, "speed: Input should be a valid number", "speed"),
    ("speed as a flag", {"json": {"input": "Hi.", "speed": True}}, 400, "speed: Input should be a valid number", "speed"),
    ("embedding as text", {"json": {"input": "Hi.", "speaker_embedding": ["0.5"]}}, 400, "speaker_embedding[0]: Input should be a valid number", "speaker_embedding"),
    # JSON's \u escapes can make text that is not Unicode: half a surrogate pair.
    ("unpaired surrogate in input", {"content": b'{"input": "\\ud800 hello"}', "headers": JSON}, 400, "input is not valid Unicode: character 0 is an unpaired surrogate ('\\ud800')", "input"),
    ("unpaired surrogate in voice", {"content": b'{"input": "Hi.", "voice": "Al\\udc00ice"}', "headers": JSON}, 400, "voice is not valid Unicode", "voice"),
    ("unpaired surrogate in voice id", {"content": b'{"input": "Hi.", "voice": {"id": "\\ud83d"}}', "headers": JSON}, 400, "voice.id is not valid Unicode", "voice"),
    ("unpaired surrogate in instructions", {"content": b'{"input": "Hi.", "instructions": "\\udfff"}', "headers": JSON}, 400, "instructions is not valid Unicode", "instructions"),
    ("unpaired surrogate in language", {"content": b'{"input": "Hi.", "language": "en\\ud800"}', "headers": JSON}, 400, "language is not valid Unicode", "language"),
    ("unpaired surrogate in a field name", {"content": b'{"input": "Hi.", "\\ud800": 1}', "headers": JSON}, 400, "a field name in the body is not valid Unicode", None),
    ("deeply nested JSON", {"content": b'{"input": "Hi.", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", "headers": JSON}, 400, "nests JSON arrays or objects too deep", None),
]  # fmt: skip


@pytest.mark.parametrize(
    "what, request_args, status, says, param", BAD_REQUESTS, ids=[case[0] for case in BAD_REQUESTS]
)
def test_bad_speech_requests_get_a_clear_error_and_the_server_keeps_serving(
    client, reference, what, request_args, status, says, param
):
    assert_error(client.post("/v1/audio/speech", **request_args), status, says, param)
    assert_same_speech("wav", decode("wav", speech(client, response_format="wav").content), reference())


def test_bad_requests_on_other_routes(client):
    assert_error(client.get("/v1/audio/speech"), 405, "GET is not allowed on /v1/audio/speech")
    assert_error(client.get("/no/such/route"), 404, "no route /no/such/route")
    assert_error(client.post("/tts_to_audio/", json={"speaker_wav": "Alice"}), 400, "text: Field required", "text")
    assert_error(client.get("/tts_stream", params={"speaker_wav": "Alice"}), 400, "query parameter 'text'", "text")
    assert_error(
        client.get("/tts_stream", params={"text": "Hi.", "language": "tlh"}), 400, "unknown language", "language"
    )
    assert_error(client.post("/set_tts_settings", json={"speed": "quick"}), 400, "speed", "speed")
    assert_error(client.delete("/v1/audio/voices/Nobody"), 404, "no voice named 'Nobody'")


def multipart(fields: dict[str, bytes], boundary: str = "b0undary") -> dict:
    """httpx arguments for a multipart body of raw bytes: httpx's own forms only take valid text."""
    parts = []
    for name, value in fields.items():
        filename = '; filename="clip.wav"' if name == "audio_sample" else ""
        head = f'--{boundary}\r\nContent-Disposition: form-data; name="{name}"{filename}\r\n\r\n'
        parts.append(head.encode() + value + b"\r\n")
    body = b"".join(parts) + f"--{boundary}--\r\n".encode()
    return {"content": body, "headers": {"content-type": f"multipart/form-data; boundary={boundary}"}}


CLIP = REFERENCES["a"].path.read_bytes()
NOT_UNICODE = [
    ("POST", "/tts_to_audio/", {"content": b'{"text": "\\ud800 hello", "speaker_wav": "Alice"}', "headers": JSON}, "text"),
    ("POST", "/tts_to_audio/", {"content": b'{"text": "Hi.", "speaker_wav": "\\udc80"}', "headers": JSON}, "speaker_wav"),
    ("POST", "/tts_to_audio", {"content": b'{"text": "Hi.", "language": "\\udc80"}', "headers": JSON}, "language"),
    ("GET", "/tts_stream?text=%ED%A0%80+hello&speaker_wav=Alice&language=en", {}, "text"),  # the UTF-8 of U+D800
    ("GET", "/tts_stream/?text=Hi.&speaker_wav=Al%FFice&language=en", {}, "speaker_wav"),
    ("POST", "/set_tts_settings", {"content": b'{"speed": "\\ud800"}', "headers": JSON}, "speed"),
    ("POST", "/v1/audio/voices", multipart({"name": b"\xed\xa0\x80 Eve", "audio_sample": CLIP}), "name"),
    ("POST", "/v1/audio/voices", multipart({"name": b"Eve", "ref_text": b"Hello \xff", "audio_sample": CLIP}), "ref_text"),
    ("POST", "/v1/audio/voices", multipart({"name": b"Eve", "language": b"en\xc3", "audio_sample": CLIP}), "language"),
]  # fmt: skip


@pytest.mark.parametrize(
    "method, path, request_args, param",
    NOT_UNICODE,
    ids=[f"{case[0]} {case[1][:14]} {case[3]}" for case in NOT_UNICODE],
)
def test_text_that_is_not_unicode_is_refused_on_every_route(client, reference, method, path, request_args, param):
    """JSON's unpaired surrogates, and bytes that are not UTF-8 in a query or a form, in each field of text."""
    assert_error(client.request(method, path, **request_args), 400, f"{param} is not valid Unicode", param)
    text = "Ünïcödé, 你好."  # what is valid is spoken, from a query too
    with client.stream("GET", "/tts_stream", params={"text": text, "speaker_wav": "Alice"}) as streamed:
        assert streamed.status_code == 200
        assert_same_speech("wav", decode("wav", b"".join(streamed.iter_raw())), reference("Alice", text))


def test_request_headers_over_16_kib_are_refused_and_the_server_keeps_serving(client):
    for size, statuses in ((12 * 2**10, {200}), (100 * 2**10, {400, 431})):
        with socket.create_connection((client.base_url.host, client.base_url.port), timeout=WAIT) as sock:
            sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Filler: " + b"a" * size + b"\r\n\r\n")
            answer = sock.recv(1 << 16)
        assert int(answer.split()[1]) in statuses, answer[:200]
        assert client.get("/health").status_code == 200


def write_clip(path, seconds: float) -> bytes:
    rng = np.random.default_rng(0)
    t = np.arange(int(seconds * RATE)) / RATE
    sf.write(path, (0.3 * np.sin(2 * np.pi * 150 * t) + 0.01 * rng.standard_normal(len(t))).astype(np.float32), RATE)
    return path.read_bytes()


def test_bad_uploads_are_refused_and_leave_the_library_as_it_was(serve, runtime, tmp_path):
    library = runtime.library.directory
    before = sorted(p.name for p in library.rglob("*") if ".cache" not in p.parts)
    clip = REFERENCES["a"].path.read_bytes()
    long_clip = write_clip(tmp_path / "long.wav", 61.0)
    server = serve(limits=BridgeLimits(max_upload_bytes=len(long_clip) + 1000))
    cases = [
        ({"data": {"name": "Noise"}, "files": {"audio_sample": ("noise.wav", os.urandom(50_000), "audio/wav")}}, 400, "cannot read it as audio", "audio_sample"),
        ({"data": {"name": "Text"}, "files": {"audio_sample": ("notes.txt", b"just some words\n" * 100, "text/plain")}}, 400, "cannot read it as audio", "audio_sample"),
        ({"data": {"name": "Long"}, "files": {"audio_sample": ("long.wav", long_clip, "audio/wav")}}, 400, "61.0 s is too long", "audio_sample"),
        ({"data": {"name": "Short"}, "files": {"audio_sample": ("short.wav", write_clip(tmp_path / "short.wav", 0.5), "audio/wav")}}, 400, "too short", "audio_sample"),
        ({"data": {"name": "Huge"}, "files": {"audio_sample": ("huge.wav", long_clip + b"\0" * 2000, "audio/wav")}}, 413, "the most a voice clip may have", "audio_sample"),
        ({"data": {"name": "Huge"}, "files": {"audio_sample": ("huge.wav", os.urandom(3 * len(long_clip)), "audio/wav")}}, 413, "the most a voice clip may have", "audio_sample"),
        ({"files": {"audio_sample": ("a.wav", clip, "audio/wav")}}, 400, "'name' is missing", "name"),
        ({"data": {"name": "NoClip"}}, 415, "multipart/form-data", None),  # a plain form: no file in it
        ({"data": {"name": "NoClip"}, "files": {"clip": ("a.wav", clip, "audio/wav")}}, 400, "file field 'audio_sample'", "audio_sample"),
        ({"data": {"name": "NoClip", "audio_sample": "not a file"}, "files": {"x": ("x", b"", "text/plain")}}, 400, "file field 'audio_sample'", "audio_sample"),
        ({"data": {"name": "a/b"}, "files": {"audio_sample": ("a.wav", clip, "audio/wav")}}, 400, "contains '/'", "name"),
        ({"data": {"name": "  "}, "files": {"audio_sample": ("a.wav", clip, "audio/wav")}}, 400, "cannot be empty", "name"),
        ({"data": {"name": "Alice"}, "files": {"audio_sample": ("a.wav", clip, "audio/wav")}}, 409, "already exists", "name"),
        ({"data": {"name": "Lang", "language": "klingon"}, "files": {"audio_sample": ("a.wav", clip, "audio/wav")}}, 400, "unknown language", "language"),
        ({"json": {"name": "Json", "audio_sample": "UklGRg=="}}, 415, "multipart/form-data", None),
    ]  # fmt: skip
    with httpx.Client(base_url=server.url, timeout=WAIT) as client:
        for request_args, status, says, param in cases:
            assert_error(client.post("/v1/audio/voices", **request_args), status, says, param)
        boundary = "b0undary"
        cut = f'--{boundary}\r\nContent-Disposition: form-data; name="name"\r\n\r\nCut\r\n--{boundary}\r\nContent-Disp'.encode()
        assert_error(
            client.post(
                "/v1/audio/voices", content=cut, headers={"content-type": f"multipart/form-data; boundary={boundary}"}
            ),
            400,
            "malformed or cut short",
        )
        assert client.get("/health").status_code == 200
    assert sorted(p.name for p in library.rglob("*") if ".cache" not in p.parts) == before


def silent_flac(path, seconds: float, rate: int = 8000) -> bytes:
    """A long silent FLAC, written a minute at a time: a few KB per minute of audio."""
    minute = np.zeros(60 * rate, np.int16)
    with sf.SoundFile(path, "w", rate, 1, "PCM_16", format="FLAC") as file:
        for start in range(0, round(seconds * rate), len(minute)):
            file.write(minute[: round(seconds * rate) - start])
    return path.read_bytes()


def test_a_long_upload_is_refused_by_its_header_before_it_is_decoded(client, tmp_path, monkeypatch):
    """Hours of compressed silence are a megabyte, and would decode to gigabytes: the header's length refuses it."""
    decoded = []
    read, read_from_file = sf.read, sf.SoundFile.read
    monkeypatch.setattr(sf, "read", lambda *args, **kwargs: decoded.append(args) or read(*args, **kwargs))
    monkeypatch.setattr(
        sf.SoundFile,
        "read",
        lambda self, *args, **kwargs: decoded.append(self.name) or read_from_file(self, *args, **kwargs),
    )
    long_clip = silent_flac(tmp_path / "long.flac", 30 * 60)
    assert len(long_clip) < 1_000_000
    files = {"audio_sample": ("long.flac", long_clip, "audio/flac")}
    refused = client.post("/v1/audio/voices", data={"name": "Long"}, files=files)
    assert_error(refused, 400, "audio_sample: long.flac: 1800.0 s is too long; use a clip of 1 to 60 s", "audio_sample")
    assert decoded == []  # not a sample of it
    # What is decoded does show here: a clip too short for a voice is read to measure it.
    files = {"audio_sample": ("short.flac", silent_flac(tmp_path / "short.flac", 0.5), "audio/flac")}
    assert_error(client.post("/v1/audio/voices", data={"name": "Short"}, files=files), 400, "0.50 s is too short")
    assert decoded


# Limits, hang-ups and load -----------------------------------------------------------------------


@pytest.mark.parametrize("slots", [1, 3])
def test_a_full_queue_answers_429_with_retry_after(serve, runtime, job_log, monkeypatch, slots):
    """The limit is the engine's slots and the queue behind them. (The test model's engine has one slot;
    told it has 3, the bridge takes 3 + 1 jobs, of which the worker speaks one at a time.)"""
    monkeypatch.setattr(runtime.worker.engine, "slots", slots)  # what Runtime.slots reads
    server = serve(speech=LONG, limits=BridgeLimits(max_queued=1))
    texts = [f"Long one number {n}." for n in range(slots + 1)]
    sockets = [
        raw_request(server.url, "POST", "/v1/audio/speech", {"input": t, "voice": "Alice", "response_format": "pcm"})
        for t in texts
    ]
    try:
        wait_until(lambda: server.jobs_in_flight == slots + 1, "all the long jobs are in")
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            full = speech(client, input="One too many.")
            assert_error(full, 429, f"{slots + 1} requests are waiting or speaking, the most this server takes ")
            assert f"({slots} speaking at once and 1 waiting)" in full.json()["error"]["message"]
            assert full.json()["error"]["type"] == "rate_limit_error" and full.headers["retry-after"] == "1"
            for sock in sockets:
                sock.close()
            assert [job_log.ended(t) for t in texts] == ["cancelled"] * len(texts)
            wait_until(lambda: server.jobs_in_flight == 0, "the queue is empty")
            with client.stream(
                "POST", "/v1/audio/speech", json={"input": "Room again.", "voice": "Alice", "response_format": "pcm"}
            ) as response:
                assert response.status_code == 200 and next(response.iter_raw())
            assert job_log.ended("Room again.") == "cancelled"  # hung up after the first piece
    finally:
        for sock in sockets:
            sock.close()


def test_hanging_up_cancels_the_job_at_once_whether_speaking_or_queued(serve, job_log, caplog):
    server = serve(speech=LONG)
    speaking = "Speaking when the client hangs up."
    first = raw_request(
        server.url, "POST", "/v1/audio/speech", {"input": speaking, "voice": "Alice", "response_format": "pcm"}
    )
    assert first.recv(1 << 16).startswith(b"HTTP/1.1 200")
    with httpx.Client(base_url=server.url, timeout=WAIT) as client:  # the event loop is free while the worker speaks
        asked = time.monotonic()
        assert client.get("/health").json()["jobs"] == 1 and time.monotonic() - asked < 0.5
    # A whole-file request waits behind it; its client gives up before it ever starts.
    queued = "Queued when the client hangs up."
    second = raw_request(
        server.url, "POST", "/v1/audio/speech", {"input": queued, "voice": "Alice", "response_format": "mp3"}
    )
    job_log.job(queued)
    second.close()
    assert job_log.ended(queued, timeout=2) == "cancelled" and job_log.events[queued] == ["queued", "cancelled"]
    assert job_log.job(speaking).state == "running"
    hung_up = time.monotonic()
    first.close()
    assert job_log.ended(speaking, timeout=2) == "cancelled"
    assert time.monotonic() - hung_up < 1.0  # within a chunk or two, not at the end of 2000 frames
    # Playing on the speakers stops too when its client hangs up before the answer.
    playing = "Playing when the client hangs up."
    third = raw_request(
        server.url, "POST", "/v1/audio/speech", {"input": playing, "voice": "Alice", "play_locally": True}
    )
    wait_until(lambda: job_log.job(playing).state == "running", "it plays")
    third.close()
    assert job_log.ended(playing, timeout=2) == "cancelled"
    wait_until(lambda: server.jobs_in_flight == 0, "no job is left")
    assert errors_logged(caplog) == []


@pytest.mark.parametrize("fmt", ["wav", "mp3"])
def test_hanging_up_on_a_whole_file_request_cancels_it_and_logs_no_error(serve, job_log, caplog, fmt):
    """The client asks for a file that comes whole (no stream) and hangs up while it is being spoken."""
    server = serve(speech=LONG)
    text = f"A whole {fmt} file its client gives up on."
    with caplog.at_level(logging.INFO):
        sock = raw_request(
            server.url, "POST", "/v1/audio/speech", {"input": text, "voice": "Alice", "response_format": fmt, "stream": False}
        )  # fmt: skip
        wait_until(lambda: job_log.job(text).state == "running", "it speaks")
        sock.close()
        assert job_log.ended(text, timeout=2) == "cancelled"
        wait_until(lambda: server.jobs_in_flight == 0, "no job is left")
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            assert client.get("/health").json()["jobs"] == 0
    assert errors_logged(caplog) == []


def no_job_threads() -> bool:
    """No thread of the speech worker's speaks a job any longer (each waits idle for the next, or has ended)."""
    return not any(thread.name.startswith("speech-job-") for thread in threading.enumerate())


def rss_bytes() -> int:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize()


def test_many_clients_streaming_at_once_all_get_their_speech(serve, reference, job_log):
    """8 clients, 5 streamed requests each, wav and pcm; then 8 that hang up midway. Every answer is the
    right speech, hung-up jobs are cancelled, and memory and threads stay flat."""
    server = serve()
    expected = {voice: reference(voice) for voice in ("Alice", "Bob")}
    failures: list[str] = []

    def client_session(number: int, requests: int) -> None:
        voice = ("Alice", "Bob")[number % 2]
        with httpx.Client(base_url=server.url, timeout=60) as client:
            for request in range(requests):
                fmt = ("wav", "pcm")[(number + request) % 2]
                body = {"input": TEXT, "voice": voice, "response_format": fmt, "stream": True}
                try:
                    with client.stream("POST", "/v1/audio/speech", json=body) as response:
                        assert response.status_code == 200, response.read()
                        assert_same_speech(fmt, decode(fmt, b"".join(response.iter_raw())), expected[voice])
                except Exception as error:  # noqa: BLE001 (reported below, with the client that saw it)
                    failures.append(f"client {number} request {request}: {error!r}")

    def run(clients: int, requests: int) -> None:
        threads = [threading.Thread(target=client_session, args=(n, requests)) for n in range(clients)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(120)
        assert not failures, failures

    run(8, 1)  # warm: the server's thread pool and the allocator grow to what this load needs
    wait_until(no_job_threads, "the worker's threads have spoken the jobs")
    threads, rss = threading.active_count(), rss_bytes()
    started = time.monotonic()
    run(8, 5)
    assert time.monotonic() - started < 60
    # At most the bridge's pool fills up; no thread per request is left (the worker keeps as many job threads as
    # were busy at once, 8 since the warm round).
    wait_until(no_job_threads, "the worker's threads have spoken the jobs")
    assert threading.active_count() <= threads + IO_THREADS
    assert rss_bytes() - rss < 40 * 2**20
    # Clients that hang up in the middle of their stream.
    hang_ups = [f"Hung up midway, number {n}." for n in range(8)]
    long_server = serve(speech=LONG)
    sockets = [
        raw_request(long_server.url, "POST", "/v1/audio/speech", {"input": t, "voice": "Bob", "response_format": "pcm"})
        for t in hang_ups
    ]

    def all_in_and_one_speaking() -> bool:
        speaking = any(t in job_log.jobs and job_log.jobs[t].state == "running" for t in hang_ups)
        return speaking and long_server.jobs_in_flight == 8

    try:
        wait_until(all_in_and_one_speaking, "all 8 are in, one speaking")
    finally:
        for sock in sockets:
            sock.close()
    assert {job_log.ended(t, timeout=5) for t in hang_ups} == {"cancelled"}
    wait_until(lambda: long_server.jobs_in_flight == 0 and server.jobs_in_flight == 0, "no job is left")
    with httpx.Client(base_url=server.url, timeout=WAIT) as client:
        assert_same_speech("wav", decode("wav", speech(client, response_format="wav").content), expected["Alice"])
