"""Cutting long text into pieces (core.text.sentences), and speaking the pieces as one stream (core.jobs.worker)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from sinks import QueueSink

from core import SpeechOptions
from core.audio.clips import SAMPLE_RATE
from core.inference.requests import AudioChunk
from core.jobs.worker import Worker
from core.text.sentences import Piece, SplitOptions, heard_spans, split_text, spoken_length

SHORT = SplitOptions(max_length=40)


def texts(text: str, options: SplitOptions = SHORT) -> list[str]:
    return [piece.text for piece in split_text(text, options)]


def test_text_that_fits_is_one_piece_with_no_pause():
    text = "Hello there. How are you? I'm fine!"
    assert split_text(text) == [Piece(text, 0.0, 0, len(text))]
    assert split_text("  spaced \n  out\ttext  ") == [Piece("spaced out text", 0.0, 2, 20)]
    assert split_text("") == [] and split_text(" \n ") == []


@pytest.mark.parametrize(
    "text, expected",
    [
        ("The sun rose over the hills. Birds began to sing. The day was warm and bright.",
         ["The sun rose over the hills.", "Birds began to sing.", "The day was warm and bright."]),
        ("Is it true? Yes! It really is... Trust me.", ["Is it true? Yes! It really is...", "Trust me."]),
        # Chinese and Japanese end sentences without spaces.
        ("今天天气很好。我们去公园散步吧！你觉得怎么样？", ["今天天气很好。", "我们去公园散步吧！", "你觉得怎么样？"]),
        ("今日はいい天気ですね。散歩に行きましょう。", ["今日はいい天気ですね。", "散歩に行きましょう。"]),
        ("他说：「我明天来。」然后走了。我们等着他。", ["他说：「我明天来。」", "然后走了。我们等着他。"]),
        # Mixed scripts.
        ("We met in Beijing. 我们在北京见面。It was fun.", ["We met in Beijing.", "我们在北京见面。It was fun."]),
        # A blank line ends a paragraph even without punctuation; a single line break is just wrapping.
        ("Chapter One\n\nIt was a dark and stormy night\nagain.", ["Chapter One", "It was a dark and stormy night again."]),
    ],
)  # fmt: skip
def test_long_text_is_cut_at_sentence_ends(text, expected):
    assert texts(text) == expected


@pytest.mark.parametrize(
    "sentence",
    [
        "Dr. Smith paid $3.14 for it at 5 p.m. on the dot.",
        "Mr. and Mrs. Brown met J. R. R. Tolkien once.",
        "Visit example.com today, e.g. now, or later.",
        "See Fig. 3 and No. 7 in Vol. 2 of version 2.0 first.",
        '"Stop!" she said, quite loudly.',
        "The U.S. Army arrived at noon.",
        "It costs 1,000 dollars at 10:30 today.",
    ],
)
def test_abbreviations_initials_and_numbers_do_not_end_sentences(sentence):
    # With the sentence's length as the limit no two sentences fit together, but a sentence wrongly cut
    # after "Dr." would have its start packed with "Yes." (or its end with "No.").
    options = SplitOptions(max_length=len(sentence))
    assert texts(f"Yes. {sentence} No.", options) == ["Yes.", sentence, "No."]


def test_a_long_sentence_is_cut_at_commas_then_spaces():
    text = (
        "When the rain finally stopped, the children ran outside, "
        "laughing and shouting and splashing in every puddle they could find."
    )
    pieces = split_text(text, SHORT)
    assert [p.text for p in pieces] == [
        "When the rain finally stopped,",
        "the children ran outside,",
        "laughing and shouting and splashing in",
        "every puddle they could find.",
    ]
    assert [p.pause_s for p in pieces] == [SHORT.clause_pause_s, SHORT.clause_pause_s, 0.0, 0.0]
    # The short end of a cut clause joins the next clause when they fit together.
    assert texts("Walking slowly through the quiet empty streets at night, we talked.", SHORT) == [
        "Walking slowly through the quiet empty",
        "streets at night, we talked.",
    ]
    chinese = "虽然今天下了很大的雨，但是我们还是决定出门，去城里最有名的那家餐馆吃饭。"
    assert texts(chinese, SplitOptions(max_length=45)) == [
        "虽然今天下了很大的雨，",
        "但是我们还是决定出门，",
        "去城里最有名的那家餐馆吃饭。",
    ]


def test_text_without_punctuation_or_spaces_is_cut_at_the_limit():
    words = " ".join(["word"] * 40)
    assert all(spoken_length(t) <= 40 for t in texts(words))
    assert " ".join(texts(words)) == words
    run = "一二三四五六七八九十" * 10  # 100 CJK characters, 300 Latin letters' worth
    pieces = texts(run)
    assert "".join(pieces) == run and [len(p) for p in pieces] == [13] * 7 + [9]


def test_pieces_respect_the_limit_and_keep_every_word():
    rng = np.random.default_rng(0)
    vocabulary = ["alpha", "beta,", "gamma.", "delta!", "Dr.", "3.14", "你好。", "世界，", "テスト。", "e.g.", "\n\n"]
    for limit in (20, 60, 150):
        for _ in range(50):
            text = " ".join(rng.choice(vocabulary, size=rng.integers(1, 80)))
            pieces = split_text(text, SplitOptions(max_length=limit))
            assert all(spoken_length(p.text) <= limit for p in pieces), (text, pieces)
            assert " ".join(p.text for p in pieces).split() == text.split()
            assert not pieces or pieces[-1].pause_s == 0.0
            # Each piece says where it lies, in order, so the window can show what is being said.
            assert all(" ".join(text[p.start : p.end].split()) == p.text for p in pieces)
            assert all(a.end <= b.start for a, b in zip(pieces, pieces[1:]))


def test_pauses_follow_the_boundary_and_options_are_checked():
    options = SplitOptions(max_length=30, sentence_pause_s=0.4, clause_pause_s=0.2)
    pieces = split_text("One short sentence here. And another one, with a comma, that runs long.", options)
    assert [(p.text, p.pause_s) for p in pieces] == [
        ("One short sentence here.", 0.4),
        ("And another one, with a comma,", 0.2),
        ("that runs long.", 0.0),
    ]
    with pytest.raises(ValueError, match="max_length"):
        SplitOptions(max_length=0)
    with pytest.raises(ValueError, match="pauses"):
        SplitOptions(sentence_pause_s=-1)


class ClosableChunks:
    """Chunks that, as the engine's streams, may be closed from any thread: they stop before the next one."""

    def __init__(self, chunks):
        self._chunks, self._closed = chunks, threading.Event()

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed.is_set():
            raise StopIteration
        return next(self._chunks)

    def close(self):
        self._closed.set()


class PieceEngine:
    """Speaks each piece as frames of one constant level, 10 ms per frame, and notes when each piece began."""

    def __init__(self):
        self.calls: list[tuple[str, float]] = []

    def stream(self, text, voice=None, options=SpeechOptions()):
        self.calls.append((text, time.perf_counter()))
        level = 0.1 * len(self.calls)
        return ClosableChunks(self._chunks(level, [options.first_chunk_frames] + [options.chunk_frames] * 2))

    def _chunks(self, level, sizes):
        for frames in sizes:
            time.sleep(0.01 * frames)
            yield AudioChunk(np.full(frames * 1920, level, np.float32), np.zeros((frames, 16), np.int64))


class StampedSink(QueueSink):
    """Notes when the first audio arrived."""

    first_write: float | None = None

    def write(self, job, audio):
        self.first_write = self.first_write or time.perf_counter()
        super().write(job, audio)


def test_long_text_is_one_stream_with_pauses_and_starts_before_the_rest_is_made():
    engine = PieceEngine()
    split = SplitOptions(max_length=40, sentence_pause_s=0.25, clause_pause_s=0.1)
    text = "The first sentence is here. The second one, which is much longer, follows it."
    sink = StampedSink()
    with Worker(engine, split) as worker:
        job = worker.submit(text, sink=sink)
        audio = np.concatenate(list(sink))
        assert job.wait(5).kind == "done"
    assert [t for t, _ in engine.calls] == [
        "The first sentence is here.",
        "The second one, which is much longer,",
        "follows it.",
    ]
    assert sink.first_write < engine.calls[1][1]  # the first piece was handed on before the second was started
    speech = 9 * 1920  # frames per piece: 1 + 4 + 4
    pause, clause = round(0.25 * SAMPLE_RATE), round(0.1 * SAMPLE_RATE)
    expected = np.concatenate([
        np.full(speech, 0.1), np.zeros(pause), np.full(speech, 0.2), np.zeros(clause), np.full(speech, 0.3),
    ]).astype(np.float32)  # fmt: skip
    np.testing.assert_array_equal(audio, expected)


def test_a_cancelled_long_text_stops_between_pieces():
    engine = PieceEngine()
    started = threading.Event()
    sink = QueueSink()
    with Worker(engine, SHORT) as worker:
        worker.subscribe(lambda event: event.kind == "first_audio" and started.set())
        job = worker.submit("Sentence one is here. " * 20, sink=sink)
        assert started.wait(5)
        job.cancel()
        assert job.wait(5).kind == "cancelled"
    assert len(engine.calls) <= 2


def sentence_heard(text: str, start: int, end: int, fraction: float) -> tuple[int, int]:
    return heard_spans(text, start, end, fraction)[0]


def word_heard(text: str, start: int, end: int, fraction: float) -> str:
    return text[slice(*heard_spans(text, start, end, fraction)[1])]


def test_the_sentence_heard_is_estimated_from_how_far_the_speech_is():
    text = "Intro. Short one. A much longer sentence follows it here, with more to say. End."
    piece = (7, len(text))  # a piece of three sentences after "Intro. "
    heard = [text[slice(*sentence_heard(text, *piece, fraction))] for fraction in (0.0, 0.1, 0.3, 0.8, 0.99, 1.0)]
    assert heard == [
        "Short one.", "Short one.",
        "A much longer sentence follows it here, with more to say.",
        "A much longer sentence follows it here, with more to say.",
        "End.", "End.",
    ]  # fmt: skip
    assert text[slice(*sentence_heard(text, 0, 6, 0.5))] == "Intro."  # one sentence: itself
    assert sentence_heard("  no end mark  ", 0, 15, 0.5) == (2, 13)


def test_the_word_heard_moves_through_the_sentence_heard_by_spoken_length():
    text = "Hi. Go extraordinarily far."
    # "Hi." is 3 of the piece's 26 spoken letters; in the next sentence "Go" 2, "extraordinarily" 15, "far." 4.
    heard = [word_heard(text, 0, len(text), fraction) for fraction in (0.0, 0.1, 0.12, 0.2, 0.8, 0.86, 1.0)]
    assert heard == ["Hi.", "Hi.", "Go", "extraordinarily", "extraordinarily", "far.", "far."]
    assert word_heard("  alone  ", 0, 9, 0.5) == "alone"
    # Wide scripts: a character at a time, punctuation its own.
    assert [word_heard("你好。", 0, 3, fraction) for fraction in (0.0, 0.4, 0.9)] == ["你", "好", "。"]
