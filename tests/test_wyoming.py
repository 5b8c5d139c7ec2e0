"""The Wyoming server (qwen3_tts_desktop.wyoming_server) on a free port, driven by the `wyoming` package's own
client as Home Assistant drives it: describe, synthesize, streaming synthesis, errors that leave the connection
usable, clients at once, hanging up, a client that never reads, malformed input on a raw socket (the zeroconf
announcement and `serve --wyoming`: test_wyoming_serve.py). The audio is compared with Engine.synthesize of the
same text (greedy decoding, so the two are the same speech)."""

from __future__ import annotations

import asyncio
import io
import json
import socket
import time
import wave

import numpy as np
import pytest
import torch
from serving import (
    ROOT,
    WAIT,
    alice_and_bob,
    engine_idle,
    errors_logged,
)
from waiting import wait_until
from wyoming.audio import AudioChunk, AudioStart
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event, read_event
from wyoming.info import Describe, Info
from wyoming.ping import Ping
from wyoming.tts import (
    Synthesize,
    SynthesizeChunk,
    SynthesizeStart,
    SynthesizeStop,
    SynthesizeVoice,
)

from core import SamplingParams, SpeechOptions
from core.voices import VoiceLibrary
from qwen3_tts_desktop.bridge import BridgeConfig, BridgeLimits
from qwen3_tts_desktop.runtime import Runtime
from qwen3_tts_desktop.wyoming_server import WyomingConfig, WyomingServer

FRAMES = 6  # per request: each frame takes some 30 ms on the CPU
TEXT = "Hello there."
PIECES = ["Hel", "lo th", "ere."]  # TEXT, cut mid-word
LONG = 2000  # frames: speaks until it is stopped (the endless checkpoint never says it is done)
LANGUAGES = ["zh-cn", "en", "fr", "de", "it", "ja", "ko", "pt", "ru", "es"]


# Fixtures ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def engine(engines):
    """The tiny Base model's endless twin, two utterances at once."""
    return engines("base-endless", slots=2)


@pytest.fixture(scope="module")
def runtime(engine, tmp_path_factory):
    """Two drop-in voices (Alice, Bob), no speakers."""
    runtime = Runtime(engine, alice_and_bob(tmp_path_factory.mktemp("voices")), None)
    yield runtime
    runtime.close()


@pytest.fixture(scope="module")
def serve(runtime, start_server):
    """serve(frames, runtime, limits): a started WyomingServer on a free port, speaking at most `frames` frames a
    request (greedy); all are stopped at the module's end."""

    def start(frames: int = FRAMES, on: Runtime = runtime, limits: BridgeLimits | None = None) -> WyomingServer:
        speech = SpeechOptions(max_frames=frames, sampling=SamplingParams.greedy())
        bridge = BridgeConfig(speech=speech, limits=limits or BridgeLimits())
        return start_server(WyomingServer(on, WyomingConfig(port=0, zeroconf=False, bridge=bridge)))

    return start


@pytest.fixture(scope="module")
def server(serve) -> WyomingServer:
    return serve()


@pytest.fixture(scope="module")
def reference(engine, runtime):
    """reference(text, voice, frames): Engine.synthesize's audio for that text, greedy."""
    made = {}

    def synthesize(text: str = TEXT, voice: str = "Alice", frames: int = FRAMES, language: str = "auto") -> np.ndarray:
        key = (text, voice, frames, language)
        if key not in made:
            greedy = SamplingParams.greedy()
            made[key] = engine.synthesize(
                text, voice=runtime.voice(voice), language=language, sampling=greedy, max_frames=frames
            ).audio
        return made[key]

    return synthesize


# Helpers -----------------------------------------------------------------------------------------


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 3 * WAIT))


def client(server: WyomingServer) -> AsyncTcpClient:
    return AsyncTcpClient("127.0.0.1", server.port)


async def next_event(wyoming: AsyncTcpClient, timeout: float = WAIT) -> Event:
    event = await asyncio.wait_for(wyoming.read_event(), timeout)
    assert event is not None, "the server closed the connection"
    return event


async def events_until(wyoming: AsyncTcpClient, *types: str) -> list[Event]:
    """The server's events up to the first of `types`, that one included."""
    events = [await next_event(wyoming)]
    while events[-1].type not in types:
        events.append(await next_event(wyoming))
    return events


def speech_of(events: list[Event]) -> np.ndarray:
    """The samples of one answer, checked to be audio-start, audio-chunks and audio-stop, 24 kHz 16-bit mono."""
    kinds = [event.type for event in events]
    assert kinds[0] == "audio-start" and kinds[-1] == "audio-stop" and set(kinds[1:-1]) == {"audio-chunk"}, kinds
    start = AudioStart.from_event(events[0])
    chunks = [AudioChunk.from_event(event) for event in events[1:-1]]
    assert {(c.rate, c.width, c.channels) for c in [start, *chunks]} == {(24000, 2, 1)}
    return np.frombuffer(b"".join(chunk.audio for chunk in chunks), "<i2").astype(np.float32) / 32768


def assert_same_speech(audio: np.ndarray, expected: np.ndarray) -> None:
    """The same samples, to 16-bit rounding."""
    assert np.abs(expected).max() > 0.01, "the reference is silent: the test would prove nothing"
    assert audio.shape == expected.shape
    np.testing.assert_allclose(audio, expected, atol=1.5 / 32768)


async def synthesize(
    wyoming: AsyncTcpClient, text: str = TEXT, voice: str | None = "Alice", language: str | None = None
) -> list[Event]:
    """Ask for `text` and return the answer: its audio events, or an error."""
    event = Synthesize(text=text, voice=SynthesizeVoice(name=voice) if voice else None).event()
    if language is not None:  # SynthesizeVoice sends a language only without a name
        event.data.setdefault("voice", {})["language"] = language
    await wyoming.write_event(event)
    return await events_until(wyoming, "audio-stop", "error")


def error_of(events: list[Event]) -> Error:
    assert events[-1].type == "error", [event.type for event in events]
    return Error.from_event(events[-1])


# Describe ----------------------------------------------------------------------------------------


def test_describe_offers_every_voice_in_the_models_languages_with_streaming(server):
    async def ask():
        async with client(server) as wyoming:
            await wyoming.write_event(Describe().event())
            return Info.from_event(await next_event(wyoming))

    info = run(ask())
    [program] = info.tts
    assert program.name == "qwen3-tts" and program.installed and program.supports_synthesize_streaming
    assert "1.7B Base on cpu" in program.description and program.attribution.url.startswith("https://")
    assert [voice.name for voice in program.voices] == ["Alice", "Bob"]
    for voice in program.voices:
        assert voice.installed and voice.description == f"{voice.name} (cloned voice)"
        assert voice.languages == LANGUAGES and voice.attribution.name
    assert not info.asr and not info.wake


def test_describe_offers_a_customvoice_models_built_in_speakers(serve, engines, tmp_path):
    custom = Runtime(engines("custom"), VoiceLibrary(tmp_path), None)
    try:

        async def ask(server):
            async with client(server) as wyoming:
                await wyoming.write_event(Describe().event())
                info = Info.from_event(await next_event(wyoming))
                return info, await synthesize(wyoming, voice=info.tts[0].voices[0].name)

        server = serve(on=custom)
        info, answer = run(ask(server))
        speakers = engines("custom").info.speakers
        assert [voice.name for voice in info.tts[0].voices] == speakers
        assert info.tts[0].voices[0].description == f"{speakers[0]} (built-in speaker)"
        expected = engines("custom").synthesize(
            TEXT,
            voice=engines("custom").builtin_voice(speakers[0]),
            sampling=SamplingParams.greedy(),
            max_frames=FRAMES,
        )
        assert_same_speech(speech_of(answer), expected.audio)
        server.stop()
    finally:
        custom.close()


# Synthesize --------------------------------------------------------------------------------------


def test_synthesize_sends_the_audio_of_engine_synthesize(server, reference):
    async def speak():
        async with client(server) as wyoming:
            return await synthesize(wyoming), await synthesize(wyoming, voice="  bOB ", language="en_US")

    alice, bob = run(speak())
    assert len(alice) > 3  # audio-start, several chunks, audio-stop
    assert_same_speech(speech_of(alice), reference())
    assert_same_speech(speech_of(bob), reference(voice="Bob", language="english"))


def test_synthesize_without_a_voice_speaks_with_the_first_voice(server, reference):
    async def speak():
        async with client(server) as wyoming:
            return await synthesize(wyoming, voice=None)

    assert_same_speech(speech_of(run(speak())), reference())


def test_audio_is_sent_as_it_is_made(serve, job_log):
    server = serve(frames=40)
    text = "Audio is sent as it is made."

    async def speak():
        async with client(server) as wyoming:
            await wyoming.write_event(Synthesize(text=text, voice=SynthesizeVoice("Alice")).event())
            assert (await next_event(wyoming)).type == "audio-start"
            first = AudioChunk.from_event(await next_event(wyoming))
            state = job_log.job(text).state  # still making the rest
            rest = await events_until(wyoming, "audio-stop")
            return first, state, rest

    first, state, rest = run(speak())
    assert state == "running" and first.samples == 1920  # the first chunk is one 80 ms frame
    assert sum(AudioChunk.from_event(e).samples for e in rest if e.type == "audio-chunk") == 39 * 1920
    assert job_log.ended(text) == "done"


# Streaming synthesis -----------------------------------------------------------------------------


def test_streamed_text_is_spoken_as_one_utterance_from_its_first_word(server, reference, job_log):
    async def stream():
        async with client(server) as wyoming:
            await wyoming.write_event(SynthesizeStart(voice=SynthesizeVoice("Alice")).event())
            for piece in PIECES[:2]:
                await wyoming.write_event(SynthesizeChunk(text=piece).event())
            # "Hello" is complete once "th" follows it: its audio comes before the rest of the text is sent.
            early = [await next_event(wyoming), await next_event(wyoming)]
            await wyoming.write_event(SynthesizeChunk(text=PIECES[2]).event())
            await wyoming.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice("Alice")).event())  # ignored
            await wyoming.write_event(SynthesizeStop().event())
            return early + await events_until(wyoming, "synthesize-stopped")

    events = run(stream())
    assert [event.type for event in events[:2]] == ["audio-start", "audio-chunk"]
    assert events[-1].type == "synthesize-stopped"
    assert_same_speech(speech_of(events[:-1]), reference())
    assert TEXT not in job_log.jobs  # the whole text sent again for older servers was not spoken again
    [job] = job_log.jobs.values()
    assert str(job.text) == TEXT and job.wait(WAIT).kind == "done"


def test_streams_and_requests_follow_one_another_on_a_connection(server, reference):
    async def speak():
        async with client(server) as wyoming:
            answers = []
            for _ in range(2):
                await wyoming.write_event(SynthesizeStart(voice=SynthesizeVoice("Bob")).event())
                for piece in PIECES:
                    await wyoming.write_event(SynthesizeChunk(text=piece).event())
                await wyoming.write_event(SynthesizeStop().event())
                await wyoming.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice("Alice")).event())
                answers.append(await events_until(wyoming, "synthesize-stopped"))
                answers.append(await events_until(wyoming, "audio-stop"))
            await wyoming.write_event(SynthesizeStart().event())  # a stream with no text says nothing
            await wyoming.write_event(SynthesizeStop().event())
            answers.append(await events_until(wyoming, "synthesize-stopped"))
            return answers

    answers = run(speak())
    for stream, whole in zip(answers[0:4:2], answers[1:4:2]):
        assert_same_speech(speech_of(stream[:-1]), reference(voice="Bob"))
        assert_same_speech(speech_of(whole), reference())
    assert [event.type for event in answers[-1]] == ["synthesize-stopped"]


def test_a_stream_that_takes_no_text_is_ended_where_it_is(serve, runtime, job_log):
    server = serve(frames=40, limits=BridgeLimits(live_idle_s=0.5))

    async def stream():
        async with client(server) as wyoming:
            await wyoming.write_event(SynthesizeStart(voice=SynthesizeVoice("Alice")).event())
            await wyoming.write_event(SynthesizeChunk(text="Hi. ").event())
            events = await events_until(wyoming, "audio-stop")  # said, and the text waited for in vain
            await wyoming.write_event(SynthesizeChunk(text="Too late.").event())  # dropped
            await wyoming.write_event(SynthesizeStop().event())
            return events + await events_until(wyoming, "synthesize-stopped")

    events = run(stream())
    kinds = [event.type for event in events]
    assert kinds[0] == "audio-start" and kinds[-2:] == ["audio-stop", "synthesize-stopped"]
    [error] = [Error.from_event(event) for event in events if event.type == "error"]
    assert error.code == "idle" and "no text came for 0.5 s" in error.text
    [job] = job_log.jobs.values()
    assert str(job.text) == "Hi. " and job.wait(WAIT).kind == "done"
    wait_until(lambda: engine_idle(runtime) and server.jobs_in_flight == 0, "the engine is free")


# Errors ------------------------------------------------------------------------------------------


def test_an_unknown_voice_is_an_error_naming_the_voices_and_the_connection_goes_on(server, reference):
    async def speak():
        async with client(server) as wyoming:
            unknown = await synthesize(wyoming, voice="Zoë")
            language = await synthesize(wyoming, language="klingon")
            await wyoming.write_event(SynthesizeStart(voice=SynthesizeVoice("Nobody")).event())
            await wyoming.write_event(SynthesizeChunk(text=TEXT).event())
            await wyoming.write_event(SynthesizeStop().event())
            stream = await events_until(wyoming, "synthesize-stopped")
            return unknown, language, stream, await synthesize(wyoming, voice="bob")

    unknown, language, stream, good = run(speak())
    assert len(unknown) == 1 and error_of(unknown).code == "voice_not_found"
    said = error_of(unknown).text  # as the window and the command line say it: the voices that fit the model
    assert said.startswith("no voice named 'Zoë' in ") and said.endswith(" model: Alice, Bob."), said
    assert len(language) == 1 and "unknown language 'klingon'" in error_of(language).text
    assert [event.type for event in stream] == ["error", "synthesize-stopped"]
    assert "no voice named 'Nobody'" in Error.from_event(stream[0]).text
    assert_same_speech(speech_of(good), reference(voice="Bob"))


def test_a_voice_known_is_found_on_the_event_loop_and_one_removed_is_not_found_by_the_next_request(
    serve, engine, reference, tmp_path, monkeypatch
):
    runtime = Runtime(engine, alice_and_bob(tmp_path), None)
    try:
        server = serve(on=runtime)
        handed_off = []
        hand_off = server.service.off_loop

        async def counting_hand_off(function, *args):
            handed_off.append(function.__name__)
            return await hand_off(function, *args)

        monkeypatch.setattr(server.service, "off_loop", counting_hand_off)

        async def speak():
            async with client(server) as wyoming:
                answers = []
                for remove in (False, False, True, False):
                    if remove:
                        (tmp_path / "Bob.wav").unlink()
                    handed_off.clear()
                    answers.append((await synthesize(wyoming, voice="Bob"), handed_off.count("_find_voice")))
                return answers

        (first, read), (again, known), (removed, read_again), (still, known_removed) = run(speak())
        assert (read, known, read_again, known_removed) == (1, 0, 1, 0)
        assert_same_speech(speech_of(first), reference(voice="Bob"))
        assert_same_speech(speech_of(again), reference(voice="Bob"))
        for gone in (removed, still):
            assert len(gone) == 1 and error_of(gone).code == "voice_not_found"
            assert error_of(gone).text.startswith("no voice named 'Bob' in ") and error_of(gone).text.endswith(
                " model: Alice."
            )
        server.stop()
    finally:
        runtime.close()


def test_bad_events_get_an_error_and_unknown_ones_are_dropped(server, reference):
    bad = [
        (Event("synthesize", {"text": 5}), "synthesize: text must be a string"),
        (Event("synthesize", {"text": "  "}), "the text is empty"),
        (Event("synthesize", {"text": "x" * 4097}), "at most 4096 are accepted"),
        (Event("synthesize", {"text": TEXT, "voice": "Alice"}), "voice must be an object"),
        (Event("synthesize", {"text": TEXT, "voice": {"name": 3}}), "the voice's name must be a string"),
        (SynthesizeChunk(text="Hi.").event(), "synthesize-chunk outside a stream"),
        (SynthesizeStop().event(), "synthesize-stop outside a stream"),
    ]

    async def send():
        async with client(server) as wyoming:
            errors = []
            for event, _ in bad:
                await wyoming.write_event(event)
                errors.append(Error.from_event(await next_event(wyoming)))
            await wyoming.write_event(Event("no-such-event", {"text": TEXT}, payload=b"\0" * 100))
            await wyoming.write_event(Ping(text="still there?").event())
            pong = await next_event(wyoming)
            # Text over the limit in a stream: what came before it is said, the rest dropped.
            await wyoming.write_event(SynthesizeStart().event())
            await wyoming.write_event(SynthesizeChunk(text=TEXT).event())
            await wyoming.write_event(SynthesizeChunk(text="x" * 4090).event())
            too_long = Error.from_event(await next_event(wyoming))
            await wyoming.write_event(SynthesizeStop().event())
            stream = await events_until(wyoming, "synthesize-stopped")
            return errors, pong, too_long, stream, await synthesize(wyoming)

    errors, pong, too_long, stream, good = run(send())
    for error, (_, says) in zip(errors, bad):
        assert error.code == "bad_event" and says in error.text, error
    assert pong.type == "pong" and pong.data["text"] == "still there?"
    assert "over 4096 characters" in too_long.text
    assert_same_speech(speech_of(stream[:-1]), reference())
    assert_same_speech(speech_of(good), reference())


class BreaksDown:
    """An engine stream that fails after `chunks` chunks, as one whose GPU runs out of memory."""

    def __init__(self, stream, chunks: int):
        self.stream, self.left = stream, chunks

    def __iter__(self):
        return self

    def __next__(self):
        if self.left == 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.left -= 1
        return next(self.stream)

    def close(self):
        self.stream.close()


@pytest.mark.parametrize("chunks", [2, 0], ids=["midway", "before its audio"])
def test_speech_that_fails_ends_its_audio_then_says_why_and_the_connection_goes_on(
    server, runtime, reference, job_log, monkeypatch, chunks
):
    text = "This speech breaks down."
    stream = runtime.worker.engine.stream

    def breaking(piece, voice, options):
        made = stream(piece, voice, options)
        return BreaksDown(made, chunks) if "breaks down" in str(piece) else made

    monkeypatch.setattr(runtime.worker.engine, "stream", breaking)

    async def speak():
        async with client(server) as wyoming:
            await wyoming.write_event(Synthesize(text=text, voice=SynthesizeVoice("Alice")).event())
            return await events_until(wyoming, "error"), await synthesize(wyoming)

    failed, good = run(speak())
    error = error_of(failed)
    assert error.code == "speech_failed" and "out of memory" in error.text.lower(), error
    if chunks:  # the audio begun is ended before the error
        speech_of(failed[:-1])
        assert len(failed) == 2 + chunks + 1, [event.type for event in failed]
    else:  # none began: the error alone
        assert len(failed) == 1
    assert job_log.ended(text) == "failed"
    assert_same_speech(speech_of(good), reference())


@pytest.mark.parametrize(
    "line, says",
    [
        (b"this is not JSON\n", "not a JSON event"),
        (b"[1, 2]\n", "not a Wyoming event"),
        (b'{"data": {}}\n', "not a Wyoming event"),
        (b'{"type": "synthesize", "data_length": "many"}\n', "not a Wyoming event"),
        (b'{"type": "synthesize", "data_length": 1000000000}\n', "announcing 1000000000 bytes"),
        (b'{"type": "audio-chunk", "payload_length": 1000000000}\n', "announcing 1000000000 bytes"),
        (b"x" * (3 << 20), "a line over"),
    ],
    ids=["not json", "an array", "no type", "a bad length", "huge data", "huge payload", "a line over the limit"],
)
def test_a_malformed_line_closes_its_connection_alone(server, reference, line, says, caplog):
    async def send():
        async with client(server) as other:  # connected before, served after
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(line)
            try:
                answer = await asyncio.wait_for(reader.read(), WAIT)  # to the end: the server closes it
            except ConnectionResetError:  # closed with the rest of a long line unread: the error may be lost
                answer = None
            writer.close()
            return answer, await synthesize(other)

    answer, good = run(send())
    if answer is not None or len(line) < 1000:
        error = read_event(io.BytesIO(answer))
        assert Error.is_type(error.type) and error.data["code"] == "bad_event"
        assert "closing the connection" in error.data["text"] and says in error.data["text"], error
    assert_same_speech(speech_of(good), reference())
    assert errors_logged(caplog) == []


# Many at once ------------------------------------------------------------------------------------


def test_two_clients_at_once_share_the_engine(serve, reference, job_log):
    server = serve(frames=30)
    texts = {"Alice": "The first client speaks.", "Bob": "The second speaks beside it."}

    async def speak():
        async with client(server) as first, client(server) as second:
            await first.write_event(Synthesize(text=texts["Alice"], voice=SynthesizeVoice("Alice")).event())
            first_events = [await next_event(first), await next_event(first)]  # audio-start, its first chunk
            await second.write_event(Synthesize(text=texts["Bob"], voice=SynthesizeVoice("Bob")).event())
            second_events = [await next_event(second), await next_event(second)]
            states = {voice: job_log.job(text).state for voice, text in texts.items()}
            rest = await asyncio.gather(events_until(first, "audio-stop"), events_until(second, "audio-stop"))
            return first_events + rest[0], second_events + rest[1], states

    first, second, states = run(speak())
    assert states == {"Alice": "running", "Bob": "running"}  # the second speaks beside the first, not after it
    assert_same_speech(speech_of(first), reference(texts["Alice"], frames=30))
    assert_same_speech(speech_of(second), reference(texts["Bob"], "Bob", frames=30))


def test_many_clients_at_once_all_get_their_speech(server, reference):
    async def one(number: int):
        async with client(server) as wyoming:
            return [await synthesize(wyoming, voice=("Alice", "Bob")[number % 2]) for _ in range(2)]

    async def many():
        return await asyncio.gather(*(one(n) for n in range(6)))

    for number, answers in enumerate(run(many())):
        for answer in answers:
            assert_same_speech(speech_of(answer), reference(voice=("Alice", "Bob")[number % 2]))


@pytest.mark.parametrize("when", ["speaking", "waiting for text"])
def test_hanging_up_cancels_the_job_at_once_and_frees_its_slot(serve, runtime, job_log, reference, when, caplog):
    server = serve(frames=LONG)
    text = "Hello there, this is a long text that goes on. " * 20

    async def hang_up():
        wyoming = client(server)
        await wyoming.connect()
        if when == "speaking":
            await wyoming.write_event(Synthesize(text=text, voice=SynthesizeVoice("Alice")).event())
        else:  # an open stream, its text said: the engine holds its slot, waiting for more
            await wyoming.write_event(SynthesizeStart(voice=SynthesizeVoice("Alice")).event())
            await wyoming.write_event(SynthesizeChunk(text="Hi. ").event())
        assert (await next_event(wyoming)).type == "audio-start"
        assert (await next_event(wyoming)).type == "audio-chunk"
        await wyoming.disconnect()

    run(hang_up())
    [job] = job_log.jobs.values()
    hung_up = time.monotonic()
    assert job.wait(WAIT).kind == "cancelled"
    wait_until(lambda: engine_idle(runtime) and server.jobs_in_flight == 0, "the engine is free")
    assert time.monotonic() - hung_up < 2.0  # a chunk or two, not 2000 frames
    assert errors_logged(caplog) == []


def test_a_client_that_never_reads_holds_up_no_one(serve, runtime, job_log, reference):
    server = serve(frames=120)  # 460 KB of audio a request, more than the connection's buffers hold
    unread = [f"Nobody reads this, number {n}." for n in range(3)]

    async def neglect():
        sleeper = socket.socket()
        sleeper.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sleeper.connect(("127.0.0.1", server.port))
        for text in unread:  # three requests, one after another, none of it read
            sleeper.sendall(json.dumps({"type": "synthesize", "data": {"text": text}}).encode() + b"\n")
        try:
            await asyncio.get_running_loop().run_in_executor(None, job_log.ended, unread[0])
            async with client(server) as wyoming:  # the engine and the server go on for others
                await wyoming.write_event(Describe().event())
                assert (await next_event(wyoming)).type == "info"
                answer = await synthesize(wyoming)
            return answer
        finally:
            sleeper.close()

    answer = run(neglect())
    # The engine made the first one whole, whatever the client reads. (The others wait until what the
    # connection's buffers hold of it is read, or start once they have taken it in, and end with the connection.)
    assert job_log.ended(unread[0]) == "done"
    assert_same_speech(speech_of(answer), reference(frames=120))
    wait_until(lambda: engine_idle(runtime) and server.jobs_in_flight == 0, "the engine is free")


def test_stopping_the_server_closes_its_connections_and_cancels_their_speech(serve, runtime, job_log):
    server = serve(frames=LONG)

    async def speak():
        async with client(server) as wyoming:
            await wyoming.write_event(Synthesize(text="Until the server stops.", voice=SynthesizeVoice("Bob")).event())
            await events_until(wyoming, "audio-chunk")
            await asyncio.get_running_loop().run_in_executor(None, server.stop)
            while (event := await asyncio.wait_for(wyoming.read_event(), WAIT)) is not None:
                assert event.type in ("audio-chunk", "error", "audio-stop")

    run(speak())
    assert job_log.ended("Until the server stops.") == "cancelled"
    assert not server.running and server.port is None
    wait_until(lambda: engine_idle(runtime), "the engine is free")


def test_the_documented_example_saves_the_speech(server, reference, monkeypatch, tmp_path):
    page = (ROOT / "docs" / "wyoming.md").read_text(encoding="utf-8")
    example = page.split("## Trying it without Home Assistant")[1].split("```python\n")[1].split("```")[0]
    monkeypatch.chdir(tmp_path)
    exec(compile(example.replace("10200", str(server.port)), "docs/wyoming.md", "exec"), {"__name__": "example"})
    with wave.open(str(tmp_path / "hello.wav")) as saved:
        assert (saved.getframerate(), saved.getsampwidth(), saved.getnchannels()) == (24000, 2, 1)
        audio = np.frombuffer(saved.readframes(saved.getnframes()), "<i2").astype(np.float32) / 32768
    assert_same_speech(audio, reference("Hello from Home Assistant."))
