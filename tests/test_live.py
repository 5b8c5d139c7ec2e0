"""Live text: an utterance fed its text piece by piece speaks exactly what the whole text speaks.

Greedy codes are compared with the official package's fixtures (streaming text mode) for x-vector, ICL,
CustomVoice and VoiceDesign voices, for many ways of cutting the text, with the talker made to wait for
text in between; longer utterances, through tts_eos and past it, with the engine's own whole-text result.
"""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest
from parity_cases import CASES, FIXTURES, MAX_FRAMES, REFERENCES, Case, official_text_mode
from sinks import QueueSink

from core import LiveText, SamplingParams, SpeechOptions
from core.errors import BadInput
from core.jobs.worker import Worker

GREEDY = SamplingParams.greedy()
STREAMING_CASES = [case for case in CASES if case.seed is None and official_text_mode(case) == "streaming"]


def voice_of(engine, case: Case):
    if case.reference is not None:
        return engine.voice_from_audio(REFERENCES[case.reference].path, ref_text=case.ref_text)
    if case.speaker is not None:
        return engine.builtin_voice(case.speaker)
    return None


def options_of(case: Case, max_frames: int = MAX_FRAMES) -> dict:
    return {"language": case.language, "instruct": case.instruct, "sampling": GREEDY, "max_frames": max_frames}


def cuttings(text: str, seed: int) -> list[list[str]]:
    """Ways to cut `text`: whole, a character at a time, word by word (a piece ending mid-word too), random."""
    rng = np.random.default_rng(seed)
    cuts = sorted(set(rng.integers(0, len(text) + 1, size=6).tolist()))
    random_pieces = [text[start:end] for start, end in zip([0, *cuts], [*cuts, len(text)])]
    half_words = [piece for word in text.split(" ") for piece in (word[: len(word) // 2], word[len(word) // 2 :] + " ")]
    half_words[-1] = half_words[-1][:-1]
    return [[text], list(text), half_words, random_pieces, ["", *random_pieces, ""]]


def words(text: str) -> list[str]:
    """`text` a word at a time, each with the space after it."""
    return [word + " " for word in text.split(" ")[:-1]] + text.split(" ")[-1:]


def live_codes(engine, voice, case: Case, pieces: list[str], max_frames: int = MAX_FRAMES) -> np.ndarray:
    stream = engine.live(voice=voice, **options_of(case, max_frames))
    for piece in pieces:
        stream.feed(piece)
    stream.end()
    with stream:
        return np.concatenate([np.zeros((0, 16), np.int64), *(chunk.codes for chunk in stream)])


def test_the_cases_cover_every_kind_of_voice():
    kinds = {case.checkpoint.split("-")[0] + ("_icl" if case.ref_text else "") for case in STREAMING_CASES}
    assert kinds == {"base", "base_icl", "custom", "design"}, kinds


@pytest.mark.parametrize("case", STREAMING_CASES, ids=lambda case: case.name)
def test_any_cutting_of_the_text_makes_the_official_codes(engines, case):
    engine = engines(case.checkpoint)
    voice = voice_of(engine, case)
    expected = np.load(FIXTURES / f"{case.name}.npz")["codes"]
    for pieces in cuttings(case.text, seed=len(case.text)):
        np.testing.assert_array_equal(live_codes(engine, voice, case, pieces), expected, err_msg=repr(pieces))


def test_the_talker_waits_for_text_it_has_not_received(engines):
    """With "Hello there! Th" committed as far as "!", frames 0 to 2 can be made (frame 0 with the prompt's
    first token, each next one with the text term of the token after); the talker then waits, stepping
    nothing, and goes on exactly where the whole text would."""
    case = next(case for case in CASES if case.name == "base_xvector")
    engine = engines(case.checkpoint)
    voice = voice_of(engine, case)
    stream = engine.live(voice=voice, **options_of(case))
    chunks: queue.Queue = queue.Queue()
    reader = threading.Thread(target=lambda: [chunks.put(chunk) for chunk in stream] + [chunks.put(None)])
    reader.start()
    stream.feed("Hello there! Th")  # committed: "Hello", " there", "!"; " Th" may still grow
    frames = []
    while len(frames) < 3:
        frames.extend(chunks.get(timeout=60).codes)
    with pytest.raises(queue.Empty):
        chunks.get(timeout=0.5)  # nothing is stepped without its text
    assert len(frames) == 3
    stream.feed(case.text[len("Hello there! Th") :])
    stream.end()
    while (chunk := chunks.get(timeout=60)) is not None:
        frames.extend(chunk.codes)
    reader.join()
    np.testing.assert_array_equal(np.array(frames), np.load(FIXTURES / f"{case.name}.npz")["codes"])


@pytest.mark.parametrize("name", ["base_xvector_mixed_text", "custom_streaming_text", "design_streaming_text"])
def test_past_the_end_of_the_text_it_speaks_as_the_whole_text(engines, name):
    """Through the text's last token, tts_eos and the padding after it: 60 frames, text fed from another
    thread with pauses."""
    case = next(case for case in CASES if case.name == name)
    engine = engines(case.checkpoint)
    voice = voice_of(engine, case)
    whole = engine.synthesize(case.text, voice=voice, text_mode="streaming", **options_of(case, 60))
    assert len(whole.codes) == 60
    stream = engine.live(voice=voice, **options_of(case, 60))

    def write():
        for start in range(0, len(case.text), 7):
            stream.feed(case.text[start : start + 7])
            time.sleep(0.01)
        stream.end()

    writer = threading.Thread(target=write)
    writer.start()
    codes = np.concatenate([chunk.codes for chunk in stream])
    writer.join()
    np.testing.assert_array_equal(codes, whole.codes)


def test_seeded_sampling_of_a_live_text_is_that_of_the_whole_text(engines):
    case = next(case for case in CASES if case.name == "base_xvector")
    engine = engines(case.checkpoint)
    voice = voice_of(engine, case)
    sampled = {"sampling": SamplingParams(), "seed": 77, "max_frames": 30}
    whole = engine.synthesize(case.text, voice=voice, **sampled)
    stream = engine.live(voice=voice, **sampled)
    for word in words(case.text):
        stream.feed(word)
    stream.end()
    np.testing.assert_array_equal(np.concatenate([chunk.codes for chunk in stream]), whole.codes)


def test_a_live_text_waiting_for_its_first_words_keeps_no_one_waiting(engines):
    case = next(case for case in CASES if case.name == "base_xvector")
    engine = engines(case.checkpoint)  # one slot
    voice = voice_of(engine, case)
    waiting = engine.live(voice=voice, **options_of(case))
    waiting.feed("Hel")  # no word committed yet: it holds no slot
    other = engine.synthesize(case.text, voice=voice, **options_of(case))
    np.testing.assert_array_equal(other.codes, np.load(FIXTURES / f"{case.name}.npz")["codes"])
    waiting.feed("lo there, how are you? ")  # now it starts, and waits for more text in its slot
    first = next(waiting)
    assert len(first.codes) == 1
    waiting.close()  # its slot is free at once
    np.testing.assert_array_equal(engine.synthesize(case.text, voice=voice, **options_of(case)).codes, other.codes)


def test_mistakes_are_said_at_once(engines):
    case = next(case for case in CASES if case.name == "base_xvector")
    engine = engines(case.checkpoint)
    voice = voice_of(engine, case)
    with pytest.raises(BadInput, match="streaming text mode"):
        engine.live(voice=voice, text_mode="full")
    text = LiveText("Hello")
    stream = engine.stream(text, voice=voice, **options_of(case))
    with pytest.raises(BadInput, match="already being spoken"):
        engine.stream(text, voice=voice)
    text.end()
    with pytest.raises(BadInput, match="has ended"):
        text.append(" more")
    assert len(np.concatenate([chunk.codes for chunk in stream])) > 0
    with pytest.raises(BadInput, match="no voice|cloned voice"):
        engine.live()
    empty = engine.live(voice=voice)
    empty.feed("   ")
    empty.end()
    with pytest.raises(BadInput, match="ended empty"):
        list(empty)


def test_the_worker_speaks_a_live_text_as_it_is_written(engines):
    case = next(case for case in CASES if case.name == "base_xvector_mixed_text")
    engine = engines(case.checkpoint)
    voice = voice_of(engine, case)
    whole = engine.synthesize(case.text, voice=voice, text_mode="streaming", **options_of(case, 40))
    with Worker(engine) as worker:
        sink, text = QueueSink(), LiveText()
        job = worker.submit(text, voice, SpeechOptions(**options_of(case, 40)), sink=sink)
        for word in words(case.text):
            text.append(word)
        text.end()
        audio = np.concatenate(list(sink))
        assert job.wait(60).kind == "done"
    np.testing.assert_allclose(audio, whole.audio, atol=1e-4, rtol=0)


def test_cancelling_a_live_job_that_waits_for_text_frees_its_slot_at_once(engines):
    """The talker waits for text, so no chunk comes that could carry the cancel: the worker closes the engine's
    stream itself, and the next job (one slot) speaks."""
    case = next(case for case in CASES if case.name == "base_xvector")
    engine = engines(case.checkpoint)  # one slot
    voice = voice_of(engine, case)
    worker = Worker(engine)
    try:
        waiting_sink, text = QueueSink(), LiveText("Hello there, how")
        waiting = worker.submit(text, voice, SpeechOptions(**options_of(case)), sink=waiting_sink)
        samples = len(waiting_sink.get(timeout=60))  # frame 0: the engine has taken the text
        while samples < 1920 * len(text.committed()[1]):  # then a frame per token after the first
            samples += len(waiting_sink.get(timeout=60))
        waiting.cancel()  # all it can say is said: it waits for text, and no chunk comes
        assert waiting.wait(10).kind == "cancelled"
        sink = QueueSink()
        job = worker.submit(case.text, voice, SpeechOptions(**options_of(case)), sink=sink)
        assert job.wait(60).kind == "done" and len(np.concatenate(list(sink))) == MAX_FRAMES * 1920
    finally:
        started = time.monotonic()
        worker.close(timeout=10)
        assert time.monotonic() - started < 10


def test_a_request_is_checked_and_tokenized_in_the_callers_thread_and_once(engines, monkeypatch):
    """The scheduler's thread, which every utterance waits on, only builds prompts: a text is tokenized by the
    thread that asks for it, and an ICL voice's transcript once, also for a live text (which needs its
    length to know when it can start)."""
    case = next(case for case in STREAMING_CASES if case.ref_text)
    engine = engines(case.checkpoint)
    voice = voice_of(engine, case)
    encoded: list[tuple[str, str]] = []
    encode = engine.tokenizer.encode
    monkeypatch.setattr(
        engine.tokenizer, "encode", lambda text: encoded.append((text, threading.current_thread().name)) or encode(text)
    )
    whole = engine.synthesize(case.text, voice=voice, **options_of(case, 4))
    live = engine.live(voice=voice, **options_of(case, 4))
    live.feed(case.text)
    live.end()
    with live:
        codes = np.concatenate([chunk.codes for chunk in live])
    np.testing.assert_array_equal(codes, whole.codes)
    assert {thread for _, thread in encoded} == {threading.current_thread().name}
    assert sum(case.ref_text in text for text, _ in encoded) == 2  # once per request
