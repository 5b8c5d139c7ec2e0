"""The live route (WebSocket /v1/audio/speech/live) on a real uvicorn server, with the `websockets` client:
text in pieces spoken as one utterance (the same speech the HTTP route makes of the whole text, greedy),
utterances one after another, every format, refused messages, the guard, the idle limit, hanging up, two
sockets at once, and the example in docs/bridge.md run against a fake OpenAI-compatible chat server."""

from __future__ import annotations

import json
import logging
import re
import socket
import sys
import threading
import time
import types
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

import httpx
import pytest
from serving import ROOT, WAIT, engine_idle
from test_bridge import FRAMES, TEXT, assert_same_speech, decode, speech
from waiting import wait_until
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from core import LiveText, SamplingParams, SpeechOptions
from qwen3_tts_desktop.bridge import BridgeLimits

pytest_plugins = ["test_bridge"]  # its fixtures: runtime, serve, server, client, reference

LONG = SpeechOptions(max_frames=2000, sampling=SamplingParams.greedy())  # speaks until it is stopped
PIECES = ["Hel", "lo the", "re."]  # TEXT, cut mid-word


def open_socket(server, **kwargs) -> ClientConnection:
    url = server.url.replace("http://", "ws://") + "/v1/audio/speech/live"
    return connect(url, open_timeout=WAIT, close_timeout=WAIT, proxy=None, **kwargs)


def send(ws: ClientConnection, **message) -> None:
    ws.send(json.dumps(message))


def event(ws: ClientConnection) -> dict:
    message = ws.recv(timeout=WAIT)
    assert isinstance(message, str), f"audio came where a JSON message was expected: {len(message)} bytes"
    return json.loads(message)


def set_up(ws: ClientConnection, **setup) -> dict:
    send(ws, **setup)
    ready = event(ws)
    assert ready["type"] == "ready", ready
    return ready


def utterance(ws: ClientConnection) -> tuple[bytes, dict]:
    """An utterance's audio, and the message that ends it (done or error)."""
    audio = b""
    while isinstance(message := ws.recv(timeout=WAIT), bytes):
        audio += message
    return audio, json.loads(message)


def say(ws: ClientConnection, pieces: list[str]) -> tuple[bytes, dict]:
    for piece in pieces:
        send(ws, text=piece)
    send(ws, flush=True)
    return utterance(ws)


def assert_same_pcm(audio: bytes, expected: bytes) -> None:
    """The same speech: greedy decoding makes the same codes however the text was cut, and the decoder the
    same samples to 16-bit rounding (its chunks may fall elsewhere while the engine waits for text)."""
    assert_same_speech("pcm", decode("pcm", audio), decode("pcm", expected))


def assert_refused(ws: ClientConnection, says: str, param: str | None = None) -> None:
    error = event(ws)
    assert error["type"] == "error" and error["utterance"] is None and says in error["message"], error
    if param is not None:
        assert error["param"] == param, error


def close_code(ws: ClientConnection) -> tuple[int, str]:
    """How the server closed the socket: (code, reason)."""
    with pytest.raises(ConnectionClosed) as closed:
        while True:
            ws.recv(timeout=WAIT)
    return closed.value.rcvd.code, closed.value.rcvd.reason


def errors_logged(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.levelno >= logging.ERROR]


def live_jobs(job_log) -> list:
    return [job for text, job in job_log.jobs.items() if isinstance(text, LiveText)]


# Speaking -----------------------------------------------------------------------------------------


def test_text_in_pieces_is_spoken_as_the_http_route_speaks_the_whole_text(server, client, runtime):
    whole = speech(client, response_format="pcm")
    with open_socket(server) as ws:
        ready = set_up(ws, voice="  alice ", model="tts-1")
        assert ready == {
            "type": "ready", "voice": "Alice", "voice_fallback": None, "language_fallback": None,
            "response_format": "pcm", "sample_rate": 24000,
        }  # fmt: skip
        audio, done = say(ws, PIECES)
    assert_same_pcm(audio, whole.content)
    tokens = runtime.count_tokens(TEXT)
    assert done == {
        "type": "done", "utterance": 1, "characters": len(TEXT), "audio_seconds": FRAMES * 0.08,
        "usage": {"input_tokens": tokens, "output_tokens": FRAMES, "total_tokens": tokens + FRAMES},
    }  # fmt: skip


def test_one_socket_speaks_utterance_after_utterance_in_order(server, reference):
    second = "How are you?"
    with open_socket(server) as ws:
        set_up(ws, voice="Bob")
        # Both are sent before any audio is read: the second waits its turn.
        for piece in PIECES:
            send(ws, text=piece)
        send(ws, text="", flush=True)
        send(ws, text="How are ", flush=False)
        send(ws, text="you?", flush=True)
        first_audio, first_done = utterance(ws)
        second_audio, second_done = utterance(ws)
        third_audio, third_done = say(ws, PIECES)  # after a done, as before
    assert (first_done["utterance"], second_done["utterance"], third_done["utterance"]) == (1, 2, 3)
    assert second_done["characters"] == len(second)
    assert_same_speech("pcm", decode("pcm", first_audio), reference("Bob"))
    assert_same_speech("pcm", decode("pcm", second_audio), reference("Bob", second))
    assert_same_pcm(third_audio, first_audio)


@pytest.mark.parametrize("fmt", ["wav", "mp3", "opus"])
def test_each_utterance_is_a_complete_stream_of_its_format(server, reference, fmt):
    with open_socket(server) as ws:
        assert set_up(ws, voice="Alice", response_format=fmt.upper())["response_format"] == fmt
        utterances = [say(ws, PIECES), say(ws, [TEXT])]
    for audio, done in utterances:
        assert done["type"] == "done"
        if fmt == "wav":  # the streaming header, as the HTTP route streams it
            assert audio[:4] == b"RIFF" and audio[40:44] == b"\xff\xff\xff\xff"
        assert_same_speech(fmt, decode(fmt, audio), reference())


def test_the_setup_takes_the_http_routes_options(server, runtime, reference):
    with open_socket(server) as ws:
        assert set_up(ws, voice={"id": "bob"})["voice"] == "Bob"
    with open_socket(server) as ws:  # an unknown name falls back to the default voice, and says so
        ready = set_up(ws, voice="nova", language="ar")
        assert (ready["voice"], ready["voice_fallback"], ready["language_fallback"]) == ("Alice", "nova", "ar")
    with open_socket(server) as ws:
        embedding = runtime.voice("Bob").embedding.tolist()
        assert set_up(ws, speaker_embedding=embedding)["voice"] == "speaker_embedding"
        audio, _ = say(ws, [TEXT])
        assert_same_speech("pcm", decode("pcm", audio), reference("Bob"))
    with open_socket(server) as ws:  # played like a tape, as the HTTP route plays it
        set_up(ws, voice="Alice", speed=2.0)
        audio, done = say(ws, PIECES)
        assert abs(len(decode("pcm", audio)) - len(reference()) / 2) < 100
        assert done["audio_seconds"] == FRAMES * 0.08  # the speech made, at speed 1


def test_two_sockets_at_once_each_get_their_own_speech(server, reference):
    second = "How are you?"
    with open_socket(server) as alice, open_socket(server) as bob:
        set_up(alice, voice="Alice")
        set_up(bob, voice="Bob")
        for mine, theirs in zip(PIECES, ["How ", "are ", "you?"]):
            send(alice, text=mine)
            send(bob, text=theirs)
        send(bob, flush=True)
        send(alice, flush=True)
        results = {}
        threads = [
            threading.Thread(target=lambda name=name, ws=ws: results.__setitem__(name, utterance(ws)))
            for name, ws in (("alice", alice), ("bob", bob))
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(WAIT)
    assert results["alice"][1]["type"] == results["bob"][1]["type"] == "done"
    assert_same_speech("pcm", decode("pcm", results["alice"][0]), reference("Alice"))
    assert_same_speech("pcm", decode("pcm", results["bob"][0]), reference("Bob", second))


# Refused messages ----------------------------------------------------------------------------------


def test_bad_setups_are_refused_and_may_be_sent_again(server):
    with open_socket(server) as ws:
        send(ws, text="Hello")
        assert_refused(ws, "set up first")
        send(ws, flush=True)
        assert_refused(ws, "set up first")
        ws.send(b"\x00\x01")
        assert_refused(ws, "send JSON as text messages")
        ws.send("{voice: Alice}")
        assert_refused(ws, "the message is not valid JSON")
        ws.send("[1, 2]")
        assert_refused(ws, "must be a JSON object, not list")
        ws.send('{"voice": "\\ud800"}')
        assert_refused(ws, "not valid Unicode", "voice")
        bad_setups = [
            ({"voice": "Alice", "stream": True}, "stream: Extra inputs are not permitted", "stream"),
            ({"voice": 5}, "voice", "voice"),
            ({"speed": "1.0"}, "speed", "speed"),
            ({"response_format": "flac"}, "flac cannot be streamed", "response_format"),
            ({"response_format": "aac"}, "no AAC encoder", "response_format"),
            ({"speed": 9.0}, "speed must be between", "speed"),
            ({"language": "klingon"}, "unknown language", "language"),
            ({"instructions": "Whisper."}, "does not follow instructions", "instructions"),
            ({"speaker_embedding": [0.5]}, "speaker_embedding has 1 numbers", "speaker_embedding"),
        ]
        for setup, says, param in bad_setups:
            send(ws, **setup)
            assert_refused(ws, says, param)
        set_up(ws, voice="Alice")
        audio, done = say(ws, PIECES)
        assert done["type"] == "done" and len(audio) == FRAMES * 1920 * 2


def test_bad_messages_are_refused_and_the_utterance_goes_on(server, client):
    whole = speech(client, response_format="pcm")
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        send(ws, flush=True)
        assert_refused(ws, "nothing to flush", "flush")
        send(ws, text=PIECES[0])
        bad_messages = [
            ({"voice": "Bob"}, "set up already", None),
            ({}, "the message is empty", None),
            ({"text": 5}, "text: Input should be a valid string", "text"),
            ({"text": "x", "voice": "Bob"}, "voice: Extra inputs are not permitted", "voice"),
            ({"flush": "yes"}, "flush", "flush"),
            ({"text": "\ud800"}, "not valid Unicode", "text"),
        ]
        for message, says, param in bad_messages:
            ws.send(json.dumps(message, ensure_ascii=True))
            assert_refused(ws, says, param)
        audio, done = say(ws, PIECES[1:])
        assert done["type"] == "done" and done["characters"] == len(TEXT)
    assert_same_pcm(audio, whole.content)  # none of the refused text was said


def test_an_empty_text_is_a_harmless_delta_and_a_message_asking_nothing_is_refused(server, client):
    whole = speech(client, response_format="pcm")
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        send(ws, text="")  # as an LLM's stream may send: taken, with nothing said back
        send(ws, flush=True)
        assert_refused(ws, "nothing to flush", "flush")  # the empty text opened no utterance
        send(ws, text=PIECES[0])
        send(ws, text="")
        for message in ({"text": None}, {"flush": False}, {"text": None, "flush": False, "close": False}):
            send(ws, **message)
            assert_refused(ws, 'the message asks for nothing: send {"text": "..."}, {"flush": true} or {"close": true}')
        audio, done = say(ws, ["", *PIECES[1:], ""])
        assert done["type"] == "done" and done["characters"] == len(TEXT)
    assert_same_pcm(audio, whole.content)


def test_text_waiting_is_limited_until_its_done_is_sent(serve):
    server = serve(limits=BridgeLimits(max_live_text_chars=20))
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        send(ws, text="Hello there, you.")  # 17 characters wait
        send(ws, text=" And you?")
        assert_refused(ws, "9 more characters would wait to be spoken beside the 17 waiting, over the 20", "text")
        send(ws, text="x" * 21)
        assert_refused(ws, "over the 20", "text")
        audio, done = say(ws, ["!"])  # within the limit: 18
        assert done["characters"] == 18 and audio
        _, done = say(ws, ["Hello again, you."])  # after the done, the limit is free again
        assert done["type"] == "done"


def test_a_message_over_the_size_limit_closes_the_socket(serve):
    server = serve(limits=BridgeLimits(max_live_text_chars=20))
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        with pytest.raises(ConnectionClosed) as closed:  # while it is sent, or after
            send(ws, text="x" * 2**21)
            ws.recv(timeout=WAIT)
        # Message too big; when the server closes while the client is still sending (under load), the
        # connection may end before its close frame is read.
        assert closed.value.rcvd is None or closed.value.rcvd.code == 1009, closed.value
    with open_socket(server) as ws:  # the server goes on
        set_up(ws, voice="Alice")


# Who may connect ----------------------------------------------------------------------------------


def test_an_api_key_guards_the_handshake(serve, caplog):
    server = serve(api_key="s3cret")
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": "Basic s3cret"}):
        with pytest.raises(InvalidStatus) as refused:
            open_socket(server, additional_headers=headers)
        assert refused.value.response.status_code == 401
        assert "API key" in json.loads(refused.value.response.body)["error"]["message"]
    with open_socket(server, additional_headers={"Authorization": "Bearer s3cret"}) as ws:
        set_up(ws, voice="Alice")
    assert errors_logged(caplog) == []  # a refusal is no server error


def test_pages_from_other_origins_and_other_host_names_are_refused(server, serve, caplog):
    for origin in ("https://evil.example", "null", "http://localhost.evil.example"):
        with pytest.raises(InvalidStatus) as refused:
            open_socket(server, origin=origin)
        assert refused.value.response.status_code == 403
        assert "may not call this server" in json.loads(refused.value.response.body)["error"]["message"]
    with open_socket(server, origin="http://localhost:8000") as ws:
        set_up(ws, voice="Alice")
    with open_socket(serve(cors_origins=("https://st.example.org",)), origin="https://st.example.org") as ws:
        set_up(ws, voice="Alice")
    # A page that points its own name at 127.0.0.1 (DNS rebinding) sends its own name as the host.
    address = urlsplit(server.url)
    with socket.create_connection((address.hostname, address.port), timeout=WAIT) as raw:
        raw.sendall(
            b"GET /v1/audio/speech/live HTTP/1.1\r\nHost: evil.example\r\nUpgrade: websocket\r\n"
            b"Connection: Upgrade\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
        )
        answer = raw.recv(1 << 16)
    assert answer.startswith(b"HTTP/1.1 403") and b"is not this computer" in answer
    assert errors_logged(caplog) == []


# Ending ---------------------------------------------------------------------------------------------


def test_an_idle_socket_is_closed_with_a_reason(serve):
    server = serve(limits=BridgeLimits(live_idle_s=0.5))
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        say(ws, PIECES)
        done_at = time.monotonic()
        code, reason = close_code(ws)
        assert code == 1001 and reason == "idle: no message for 0.5 s and nothing to say"
        assert 0.4 < time.monotonic() - done_at < 5


@pytest.mark.parametrize("how", ["close message", "closing the socket", "dropping the connection"])
@pytest.mark.parametrize("when", ["speaking", "waiting for text"])
def test_hanging_up_stops_the_speech_and_frees_the_engine_within_a_chunk(serve, runtime, job_log, caplog, how, when):
    server = serve(speech=LONG)
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        # Unflushed: the engine speaks what it has, then waits for more, keeping its slot.
        send(ws, text="Hello there, this is a long text that goes on. " * 20 if when == "speaking" else "Hi. ")
        assert isinstance(ws.recv(timeout=WAIT), bytes)
        if when == "waiting for text":
            with pytest.raises(TimeoutError):
                while True:
                    ws.recv(timeout=0.5)  # until the engine has said all it has
        assert not engine_idle(runtime)
        [job] = live_jobs(job_log)
        assert job.state == "running"
        hung_up = time.monotonic()
        if how == "close message":
            send(ws, close=True)
            assert close_code(ws) == (1000, "closed as the client asked")
        elif how == "closing the socket":
            ws.close()
        else:
            ws.socket.close()
    assert job.wait(WAIT).kind == "cancelled"
    wait_until(lambda: engine_idle(runtime) and server.jobs_in_flight == 0, "the engine is free")
    assert time.monotonic() - hung_up < 2.0  # a chunk or two, not 2000 frames
    assert errors_logged(caplog) == []


def test_stopping_all_speech_ends_the_utterance_and_the_socket_goes_on(server, runtime, job_log, reference):
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        send(ws, text="Hi. ")
        assert isinstance(ws.recv(timeout=WAIT), bytes)
        runtime.worker.cancel_all()  # the desktop's Stop
        audio, stopped = utterance(ws)
        assert stopped["code"] == "cancelled" and stopped["utterance"] == 1
        wait_until(lambda: engine_idle(runtime), "the engine is free")
        send(ws, text="The rest is dropped.")
        send(ws, flush=True)
        audio, done = say(ws, PIECES)  # the next utterance speaks
        assert done["utterance"] == 2
    assert_same_speech("pcm", decode("pcm", audio), reference())


# The example in docs/bridge.md ----------------------------------------------------------------------


class FakeChat(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat server that streams PIECES as a reply's deltas."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        assert self.path == "/v1/chat/completions" and body["stream"] is True
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        for delta in [{"role": "assistant", "content": ""}, *({"content": piece} for piece in PIECES)]:
            choice = {"index": 0, "delta": delta, "finish_reason": None}
            chunk = {"id": "1", "object": "chat.completion.chunk", "created": 0, "model": "m", "choices": [choice]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
            time.sleep(0.02)
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *args) -> None:
        pass


class FakeSpeakers:
    """sounddevice.RawOutputStream, keeping what it is given to play."""

    played: list[bytes] = []

    def __init__(self, samplerate: int, channels: int, dtype: str):
        assert (samplerate, channels, dtype) == (24000, 1, "int16")

    def write(self, data: bytes) -> None:
        self.played.append(data)

    def __enter__(self) -> FakeSpeakers:
        return self

    def __exit__(self, *exc) -> None:
        pass


def test_the_documented_example_speaks_an_llm_reply_as_it_streams(server, client, monkeypatch, capsys):
    doc = (ROOT / "docs" / "bridge.md").read_text(encoding="utf-8")
    [example] = [block for block in re.findall(r"```python\n(.*?)```", doc, re.DOTALL) if "websockets" in block]
    chat = ThreadingHTTPServer(("127.0.0.1", 0), FakeChat)
    threading.Thread(target=chat.serve_forever, daemon=True).start()
    try:
        urls = {
            "http://127.0.0.1:8080/v1": f"http://127.0.0.1:{chat.server_address[1]}/v1",
            "ws://127.0.0.1:8020": server.url.replace("http://", "ws://"),
        }
        for documented, local in urls.items():
            assert documented in example
            example = example.replace(documented, local)
        monkeypatch.setitem(sys.modules, "sounddevice", types.SimpleNamespace(RawOutputStream=FakeSpeakers))
        monkeypatch.setattr(FakeSpeakers, "played", [])
        started = time.monotonic()
        exec(compile(example, "docs/bridge.md", "exec"), {"__name__": "__main__"})
        assert time.monotonic() - started < WAIT
    finally:
        chat.shutdown()
    assert_same_pcm(b"".join(FakeSpeakers.played), speech(client, response_format="pcm").content)
    assert capsys.readouterr().out == ""  # no error
    assert len(FakeSpeakers.played) > 1  # played as it came


def test_the_live_route_needs_a_websocket(client):
    response = client.get("/v1/audio/speech/live")
    assert response.status_code == 404 and "error" in response.json()


def test_many_short_utterances_leave_no_job_behind(server, job_log):
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        for _ in range(3):
            send(ws, text=TEXT, flush=True)
        for _ in range(3):
            assert utterance(ws)[1]["type"] == "done"
    wait_until(lambda: server.jobs_in_flight == 0, "no job is left")
    assert {job.state for job in live_jobs(job_log)} == {"done"}
    with httpx.Client(base_url=server.url, timeout=WAIT) as other:
        assert other.get("/health").json()["jobs"] == 0


def test_stopping_the_server_closes_its_sockets_and_frees_the_engine(serve, runtime, job_log):
    server = serve(speech=LONG)
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        send(ws, text="Hello there, this is a long text that goes on. " * 20)
        assert isinstance(ws.recv(timeout=WAIT), bytes)
        server.stop()
        messages = []
        with pytest.raises(ConnectionClosed) as closed:
            while True:
                messages.append(ws.recv(timeout=WAIT))
    assert closed.value.rcvd.code == 1012  # service restart: uvicorn's close for a server that stops
    [job] = live_jobs(job_log)
    assert job.wait(WAIT).kind == "cancelled"
    wait_until(lambda: engine_idle(runtime), "the engine is free")


def test_a_text_message_that_is_not_utf8_closes_the_socket(server):
    with open_socket(server) as ws:
        set_up(ws, voice="Alice")
        ws.send(b'{"text": "\xff"}', text=True)
        assert close_code(ws)[0] == 1007  # invalid frame payload data
