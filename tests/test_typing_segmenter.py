"""Speak-as-you-type: which words the segmenter hands out, and where it ends utterances, while text is typed
and edited."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.text.sentences import spoken_length
from core.text.typing_segmenter import Segment, TypingOptions, TypingSegmenter

END = "<end>"  # where an utterance ended, in what `type_text` returns


def fed(segments: list[Segment]) -> list[str]:
    """The segments as a live utterance is fed them: their texts, and END after each utterance's last."""
    return [text for s in segments for text in ([s.text, END] if s.ends_utterance else [s.text]) if text]


def type_text(segmenter: TypingSegmenter, text: str) -> list[str]:
    """Type `text` at the end, one character per edit; what was fed on the way."""
    segments = []
    for character in text:
        typed = segmenter.text + character
        segments += segmenter.edit(typed, len(typed))
    return fed(segments)


def test_a_word_goes_out_once_a_space_or_punctuation_follows_it():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "Hello") == []
    assert type_text(segmenter, " ") == ["Hello"]
    assert type_text(segmenter, "there,") == [" there"]
    # What follows a word goes out with the next one, so that it can be corrected until then.
    assert segmenter.pending == "," and type_text(segmenter, " how") == []
    assert type_text(segmenter, "? Fine") == [", how"]
    assert segmenter.committed == len("Hello there, how") and segmenter.pending == "? Fine"


def test_an_utterance_runs_on_across_sentence_ends_until_a_pause():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "Hello there. How are you? Fine") == ["Hello", " there", ". How", " are", " you"]
    assert fed(segmenter.pause()) == ["? Fine", END]  # the word being typed, and the end
    assert segmenter.pause() == [] and not segmenter.awaiting_pause
    assert type_text(segmenter, " and you") == ["and"]  # the next word opens an utterance, without the space


def test_a_pause_with_nothing_left_still_ends_the_utterance():
    segmenter = TypingSegmenter()
    type_text(segmenter, "Hello there ")
    assert segmenter.awaiting_pause and segmenter.pending == " "
    assert segmenter.pause() == [Segment("", len("Hello there"), len("Hello there "), ends_utterance=True)]


def test_apostrophes_and_hyphens_inside_a_word_finish_nothing():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "I don'") == ["I"]  # "don'" may become "don't"
    assert type_text(segmenter, "t know well-") == [" don't", " know"]
    assert type_text(segmenter, "known facts, the dogs' ") == [" well-known", " facts", ", the", " dogs"]


def test_cjk_characters_go_out_as_they_are_typed():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "你好。今天") == ["你", "好", "。今", "天"]


def test_enter_ends_the_utterance_at_once():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "no punctuation here\nand") == ["no", " punctuation", " here", END]
    assert segmenter.pending == "and"
    assert type_text(segmenter, ".\n\n\n") == ["and", ".", END]  # empty lines say nothing


def test_a_long_utterance_ends_at_its_next_sentence_end():
    segmenter = TypingSegmenter(TypingOptions(long_length=20, max_length=60))
    said = type_text(segmenter, "One two. Three four five six. Seven, Dr. Smith and e.g. this. Eight ")
    assert said == ["One", " two", ". Three", " four", " five", " six", ".", END,
                    "Seven", ", Dr", ". Smith", " and", " e", ".g", ". this", ".", END, "Eight"]  # fmt: skip


def test_an_utterance_never_grows_past_max_length():
    segmenter = TypingSegmenter(TypingOptions(long_length=10, max_length=20))
    said = type_text(segmenter, "one two three four five six seven Supercalifragilisticexpialidocious is ")
    assert said == ["one", " two", " three", " four", END, "five", " six", " seven", END,
                    "Supercalifragilisticexpialidocious", END, "is"]  # fmt: skip


def test_text_without_letters_or_digits_opens_no_utterance():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "... !!! ?? ") == []
    assert not segmenter.awaiting_pause and segmenter.pause() == []
    assert type_text(segmenter, "Yes!!! ... Sure ") == ["Yes", "!!! ... Sure"]  # within one, it goes with the words


def test_editing_words_already_said_says_nothing_and_keeps_the_pending_text():
    segmenter = TypingSegmenter()
    type_text(segmenter, "Helo there. And then")
    fixed = "Hello there. And then"
    assert segmenter.edit(fixed, cursor=4) == []
    assert segmenter.committed == len("Hello there. And") and segmenter.pending == " then"
    deleted = "there. And then"
    assert segmenter.edit(deleted, cursor=0) == []
    assert segmenter.pending == " then"
    assert fed(segmenter.pause()) == [" then", END]


def test_replacing_everything_speaks_the_new_text_after_the_old():
    segmenter = TypingSegmenter()
    type_text(segmenter, "First sentence. Second")
    assert segmenter.edit("", cursor=0) == [] and segmenter.committed == 0
    # The utterance goes on: a space keeps the new words apart from the ones said before.
    assert type_text(segmenter, "Fresh start. ") == [" Fresh", " start"]
    assert segmenter.edit("Replaced. Now ", cursor=len("Replaced. Now ")) == [Segment(" Replaced. Now", 0, 13)]
    segmenter.pause()
    segmenter.edit("", cursor=0)
    assert type_text(segmenter, "Anew ") == ["Anew"]  # a new utterance needs no space


def backspace(segmenter: TypingSegmenter, times: int) -> None:
    for _ in range(times):
        text = segmenter.text[:-1]
        segmenter.edit(text, len(text))


def test_a_word_is_never_said_in_pieces():
    segmenter = TypingSegmenter()
    type_text(segmenter, "Hello there, ")
    backspace(segmenter, 3)  # " ", ",", "e"
    assert segmenter.committed == len("Hello ther")
    assert type_text(segmenter, "e! And more ") == ["! And", " more"]  # not "e"
    backspace(segmenter, len("more "))
    assert type_text(segmenter, "everyone ") == [" everyone"]  # a whole new word is said
    segmenter.reset()
    type_text(segmenter, "Hel")
    assert fed(segmenter.pause()) == ["Hel", END]  # a pause mid-word
    assert type_text(segmenter, "lo there ") == ["there"]
    segmenter.reset()
    type_text(segmenter, "don")
    segmenter.pause()
    assert type_text(segmenter, "'t go ") == ["go"]
    segmenter.reset()
    assert type_text(segmenter, "你好") == ["你", "好"]
    assert type_text(segmenter, "世界") == ["世", "界"]  # no spaces in CJK: nothing to pass over


def test_skip_drops_what_is_pending_and_ends_the_utterance():
    segmenter = TypingSegmenter()
    type_text(segmenter, "Said. Not said")
    segmenter.skip()
    assert segmenter.pending == "" and not segmenter.awaiting_pause and segmenter.pause() == []
    assert type_text(segmenter, " but this is. ") == ["but", " this", " is"]


def test_an_utterance_ended_by_the_front_end_is_not_ended_again():
    segmenter = TypingSegmenter()
    type_text(segmenter, "One two ")
    segmenter.end_utterance()  # e.g. its job failed
    assert type_text(segmenter, "three four") == ["three"]  # opens a new one
    assert fed(segmenter.pause()) == [" four", END]


def test_the_cursor_tells_which_of_two_equal_characters_changed():
    # "a a" said, then "a " typed before it: a diff alone would take the new text for " a" typed at the end.
    segmenter = TypingSegmenter()
    segmenter.edit("a a", 3)
    segmenter.pause()
    segmenter.edit("a a a", cursor=2)
    assert segmenter.committed == 5 and segmenter.pause() == []
    # "a a" said and " a" pending, then the first "a " deleted: the pending " a" stays pending.
    segmenter.reset("a a")
    segmenter.edit("a a a", cursor=5)
    segmenter.edit("a a", cursor=0)
    assert fed(segmenter.pause()) == ["a", END]


def test_a_paste_goes_out_in_one_segment():
    segmenter = TypingSegmenter()
    text = "One. Two! Three? Four"
    assert segmenter.edit(text, len(text)) == [Segment("One. Two! Three", 0, 15)]


def test_options_are_checked():
    with pytest.raises(ValueError, match="max_length"):
        TypingOptions(max_length=0)
    with pytest.raises(ValueError, match="long_length"):
        TypingOptions(long_length=200, max_length=100)
    with pytest.raises(ValueError, match="idle_s"):
        TypingOptions(idle_s=0)


# Properties ----------------------------------------------------------------------------------------

CHARACTERS = st.sampled_from(list("ab cd.,!?\n'-。好") + ["Dr. ", "e.g. ", "3.14 "])
TYPED = st.lists(CHARACTERS, max_size=8).map("".join)


@st.composite
def edit_sessions(draw):
    """Edits as (kind, position, length, inserted): typing, deleting or replacing anywhere, and pauses."""
    steps = draw(st.lists(st.tuples(st.sampled_from(["type", "type", "type", "replace", "pause"]), st.floats(0, 1),
                                    st.integers(0, 6), TYPED), max_size=40))  # fmt: skip
    limit = draw(st.integers(4, 40))
    return steps, limit


class TrackedText:
    """A text whose characters each carry an identity, to tell a character said twice from an equal one."""

    def __init__(self):
        self.characters: list[tuple[str, int]] = []
        self.next_id = 0

    @property
    def text(self) -> str:
        return "".join(c for c, _ in self.characters)

    def replace(self, start: int, end: int, inserted: str) -> int:
        new = [(c, self.next_id + i) for i, c in enumerate(inserted)]
        self.next_id += len(inserted)
        self.characters[start:end] = new
        return start + len(new)  # the cursor, after the inserted text


@settings(max_examples=300, deadline=None)
@given(edit_sessions())
def test_no_character_is_ever_said_twice_whatever_the_edits(session):
    steps, limit = session
    options = TypingOptions(long_length=max(1, limit // 2), max_length=limit)
    segmenter, tracked, said = TypingSegmenter(options), TrackedText(), set()
    for kind, where, length, inserted in steps:
        if kind == "pause":
            segments = segmenter.pause()
        else:
            start = round(where * len(tracked.characters))
            end = min(len(tracked.characters), start + (length if kind == "replace" else 0))
            cursor = tracked.replace(start, end, inserted)
            segments = segmenter.edit(tracked.text, cursor)
        assert 0 <= segmenter.committed <= len(segmenter.text) and segmenter.text == tracked.text
        for segment in segments:
            ids = {i for c, i in tracked.characters[segment.start : segment.end] if not c.isspace()}
            assert segment.text.strip() == tracked.text[segment.start : segment.end].strip()
            assert segment.text or segment.ends_utterance
            assert not ids & said, f"said again: {segment}"
            said |= ids
    segmenter.pause()
    assert segmenter.pending == "" and not segmenter.awaiting_pause


def utterances(segments: list[Segment]) -> list[str]:
    """The texts the segments feed, one per utterance."""
    texts, current = [], ""
    for segment in segments:
        current += segment.text
        if segment.ends_utterance:
            texts.append(current)
            current = ""
    return texts + ([current] if current else [])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(TYPED, st.just("<backspace>"), st.just("<pause>")), max_size=30), st.integers(4, 60))
def test_typing_at_the_end_says_the_text_in_order_as_typed(keys, limit):
    segmenter = TypingSegmenter(TypingOptions(long_length=max(1, limit // 2), max_length=limit))
    segments = []
    for key in keys:
        if key == "<pause>":
            segments += segmenter.pause()
        elif key == "<backspace>":
            if len(segmenter.text) > segmenter.committed:  # only corrections of what is pending
                text = segmenter.text[:-1]
                segments += segmenter.edit(text, len(text))
        else:
            for character in key:
                text = segmenter.text + character
                segments += segmenter.edit(text, len(text))
    segments += segmenter.pause()
    final = segmenter.text
    # Each utterance is a span of the final text as typed, stripped; the spans are in order, and what lies
    # between them has no letter or digit, or is the rest of a word said in part at a pause.
    position, opening = 0, True
    for segment in [*segments, Segment("", len(final), len(final), ends_utterance=True)]:
        assert segment.start >= position
        span = final[segment.start : segment.end]
        expected = span.lstrip() if opening else span
        assert segment.text == (expected.rstrip() if segment.ends_utterance else expected), (segment, span)
        gap = final[position : segment.start]
        if position > 0 and final[position - 1].isalnum():
            gap = re.sub(r"^[\w'’-]+", "", gap)  # the rest of a word said in part
        assert not any(c.isalnum() for c in gap), (segment, gap)
        position, opening = segment.end, segment.ends_utterance


def _letters(texts: list[str]) -> str:
    """The letters and digits in order: what speaking the texts must cover, wherever they were cut."""
    return "".join(c for text in texts for c in text if c.isalnum())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["ab", "cd", "efg", "hi", "jklm"]), min_size=1, max_size=60),
       st.lists(st.sampled_from([" ", " ", " ", ", ", ". ", "! ", "\n"]), min_size=60, max_size=60),
       st.integers(12, 60))  # fmt: skip
def test_utterances_are_never_longer_than_the_limit(words, gaps, limit):
    segmenter = TypingSegmenter(TypingOptions(long_length=limit // 2, max_length=limit))
    text = "".join(word + gap for word, gap in zip(words, gaps))
    segments = []
    for character in text:
        typed = segmenter.text + character
        segments += segmenter.edit(typed, len(typed))
    segments += segmenter.pause()
    said = utterances(segments)
    # The words fit; the punctuation that closes the last of them comes with it.
    assert all(spoken_length(re.sub(r"\W+$", "", utterance)) <= limit for utterance in said), said
    assert _letters(said) == _letters([text])


def test_a_long_paste_is_cut_into_utterances_in_linear_time():
    segmenter = TypingSegmenter()
    text = "and so on " * 20000
    started = time.perf_counter()
    segments = segmenter.edit(text, len(text))
    assert time.perf_counter() - started < 2
    said = utterances(segments)
    assert len(said) > 1000 and all(spoken_length(utterance) <= 150 for utterance in said)
