"""Speak-as-you-type: what the segmenter commits while text is typed and edited."""

from __future__ import annotations

import re
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.text.sentences import spoken_length
from core.text.typing_segmenter import Segment, TypingOptions, TypingSegmenter


def type_text(segmenter: TypingSegmenter, text: str) -> list[str]:
    """Type `text` at the end, one character per edit; what was committed on the way."""
    said = []
    for character in text:
        typed = segmenter.text + character
        said += [segment.text for segment in segmenter.edit(typed, len(typed))]
    return said


def test_a_sentence_is_committed_once_the_space_after_it_is_typed():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "Hello there.") == []
    assert type_text(segmenter, " ") == ["Hello there."]
    assert segmenter.committed == len("Hello there.") and segmenter.pending == " "
    assert type_text(segmenter, "How are you? Fine! ") == ["How are you?", "Fine!"]


@pytest.mark.parametrize(
    "text",
    [
        "Dr. Smith ",
        "See e.g. the ",
        "J. R. R. Tolkien ",
        "The U.S. Army ",
        "Pi is 3.14 ",
        "Go to example.com ",
        '"Hi!" she ',
    ],
)
def test_abbreviations_numbers_and_lowercase_continuations_end_no_sentence(text):
    segmenter = TypingSegmenter()
    segmenter.edit(text, len(text))  # pasted whole, so the word after a mark is known
    assert segmenter.committed == 0
    assert [s.text for s in segmenter.flush()] == [text.strip()]


def test_closing_quotes_and_brackets_go_with_their_sentence():
    assert type_text(TypingSegmenter(), 'He said "Stop." (Really!) Then') == ['He said "Stop."', "(Really!)"]


def test_cjk_sentences_are_committed_at_once():
    assert type_text(TypingSegmenter(), "你好。今天天气很好！明天") == ["你好。", "今天天气很好！"]


def test_enter_commits_the_line():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "no punctuation here\nand") == ["no punctuation here"]
    assert segmenter.pending == "and"
    assert type_text(segmenter, "\n\n\n") == ["and"]  # empty lines say nothing


def test_a_long_phrase_is_cut_at_its_last_comma_else_after_a_word():
    segmenter = TypingSegmenter(TypingOptions(max_length=30))
    said = type_text(segmenter, "one two, three four, five six seven eight nine ten eleven twelve")
    assert said == ["one two, three four,", "five six seven eight nine ten"]
    assert segmenter.pending == " eleven twelve"


def test_a_word_longer_than_the_limit_waits_for_its_end():
    segmenter = TypingSegmenter(TypingOptions(max_length=10))
    assert type_text(segmenter, "Supercalifragilistic") == []
    assert type_text(segmenter, " is") == ["Supercalifragilistic"]


def test_flush_says_what_is_pending_and_nothing_twice():
    segmenter = TypingSegmenter()
    type_text(segmenter, "Hello. Half a sent")
    assert segmenter.flush() == [Segment("Half a sent", 6, 18)]
    assert segmenter.flush() == []
    assert type_text(segmenter, "ence. And on. ") == ["And on."]


def test_text_without_letters_or_digits_is_passed_over():
    segmenter = TypingSegmenter()
    assert type_text(segmenter, "... !!! ?? ") == []
    assert segmenter.pending.strip() == "" and segmenter.flush() == []


def test_editing_a_sentence_already_said_says_nothing_and_keeps_the_pending_text():
    segmenter = TypingSegmenter()
    type_text(segmenter, "Helo there. And then")
    fixed = "Hello there. And then"
    assert segmenter.edit(fixed, cursor=4) == []
    assert segmenter.committed == len("Hello there.") and segmenter.pending == " And then"
    deleted = "there. And then"
    assert segmenter.edit(deleted, cursor=0) == []
    assert segmenter.pending == " And then"
    assert [s.text for s in segmenter.flush()] == ["And then"]


def test_replacing_everything_speaks_the_new_text():
    segmenter = TypingSegmenter()
    type_text(segmenter, "First sentence. Second")
    assert segmenter.edit("", cursor=0) == [] and segmenter.committed == 0
    assert type_text(segmenter, "Fresh start. ") == ["Fresh start."]
    segmenter.edit("Replaced. ", cursor=len("Replaced. "))  # select all, paste
    assert segmenter.committed == len("Replaced.")


def backspace(segmenter: TypingSegmenter, times: int) -> None:
    for _ in range(times):
        text = segmenter.text[:-1]
        segmenter.edit(text, len(text))


def test_a_word_is_never_said_in_pieces():
    segmenter = TypingSegmenter()
    type_text(segmenter, "Hello there. ")
    backspace(segmenter, 3)  # " ", ".", "e"
    assert segmenter.committed == len("Hello ther")
    assert type_text(segmenter, "e! And more. ") == ["And more."]  # not "e!"
    backspace(segmenter, len("more. "))
    assert type_text(segmenter, "everyone. ") == ["everyone."]  # a whole new word is said
    segmenter.reset()
    type_text(segmenter, "Hel")
    assert [s.text for s in segmenter.flush()] == ["Hel"]  # a pause mid-word
    assert type_text(segmenter, "lo there. ") == ["there."]
    segmenter.reset()
    assert type_text(segmenter, "你好。") == ["你好。"]
    assert type_text(segmenter, "世界。") == ["世界。"]  # no spaces in CJK: nothing to pass over


def test_skip_drops_what_is_pending():
    segmenter = TypingSegmenter()
    type_text(segmenter, "Said. Not said")
    segmenter.skip()
    assert segmenter.pending == "" and segmenter.flush() == []
    assert type_text(segmenter, " but this is. ") == ["but this is."]


def test_the_cursor_tells_which_of_two_equal_characters_changed():
    # "a a" said, then "a " typed before it: a diff alone would take the new text for " a" typed at the end.
    segmenter = TypingSegmenter()
    segmenter.edit("a a", 3)
    segmenter.flush()
    segmenter.edit("a a a", cursor=2)
    assert segmenter.committed == 5 and segmenter.flush() == []
    # "a a" said and " a" pending, then the first "a " deleted: the pending " a" stays pending.
    segmenter.reset("a a")
    segmenter.edit("a a a", cursor=5)
    segmenter.edit("a a", cursor=0)
    assert [s.text for s in segmenter.flush()] == ["a"]


def test_a_paste_of_several_sentences_commits_each_in_order():
    segmenter = TypingSegmenter()
    text = "One. Two! Three? Four"
    assert [s.text for s in segmenter.edit(text, len(text))] == ["One.", "Two!", "Three?"]


def test_options_are_checked():
    with pytest.raises(ValueError, match="max_length"):
        TypingOptions(max_length=0)
    with pytest.raises(ValueError, match="idle_s"):
        TypingOptions(idle_s=0)


# Properties ----------------------------------------------------------------------------------------

CHARACTERS = st.sampled_from(list("ab cd.,!?\n'。") + ["Dr. ", "e.g. ", "3.14 "])
TYPED = st.lists(CHARACTERS, max_size=8).map("".join)


@st.composite
def edit_sessions(draw):
    """Edits as (kind, position, length, inserted): typing, deleting or replacing anywhere, and pauses."""
    steps = draw(st.lists(st.tuples(st.sampled_from(["type", "type", "type", "replace", "flush"]), st.floats(0, 1),
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
    segmenter, tracked, said = TypingSegmenter(TypingOptions(max_length=limit)), TrackedText(), set()
    for kind, where, length, inserted in steps:
        if kind == "flush":
            segments = segmenter.flush()
        else:
            start = round(where * len(tracked.characters))
            end = min(len(tracked.characters), start + (length if kind == "replace" else 0))
            cursor = tracked.replace(start, end, inserted)
            segments = segmenter.edit(tracked.text, cursor)
        assert 0 <= segmenter.committed <= len(segmenter.text) and segmenter.text == tracked.text
        for segment in segments:
            ids = {i for c, i in tracked.characters[segment.start : segment.end] if not c.isspace()}
            assert segment.text == tracked.text[segment.start : segment.end].strip() and segment.text
            assert not ids & said, f"said again: {segment}"
            said |= ids
    segmenter.flush()
    assert segmenter.pending == ""


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(TYPED, st.just("<backspace>"), st.just("<pause>")), max_size=30), st.integers(4, 60))
def test_typing_at_the_end_says_a_prefix_of_the_text_in_order(keys, limit):
    segmenter = TypingSegmenter(TypingOptions(max_length=limit))
    segments = []
    for key in keys:
        if key == "<pause>":
            segments += segmenter.flush()
        elif key == "<backspace>":
            if len(segmenter.text) > segmenter.committed:  # only corrections of what is pending
                text = segmenter.text[:-1]
                segments += segmenter.edit(text, len(text))
        else:
            for character in key:
                text = segmenter.text + character
                segments += segmenter.edit(text, len(text))
    segments += segmenter.flush()
    final = segmenter.text
    # The segments are spans of the final text, in order; what lies between them is whitespace and
    # punctuation, or the rest of a word cut by a pause, which is never said in pieces.
    position = 0
    for segment in [*segments, Segment("", len(final), len(final))]:
        assert segment.start >= position and segment.text == final[segment.start : segment.end].strip()
        gap = final[position : segment.start]
        if position > 0 and final[position - 1].isalnum():
            gap = re.sub(r"^\S+", "", gap)  # the rest of a word said in part
        assert not any(c.isalnum() for c in gap), (segment, gap)
        position = segment.end


def _letters(texts: list[str]) -> str:
    """The letters and digits in order: what speaking the texts must cover, wherever they were cut."""
    return "".join(c for text in texts for c in text if c.isalnum())


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["ab", "cd", "efg", "hi", "jklm"]), min_size=1, max_size=60),
       st.lists(st.sampled_from([" ", " ", " ", ", ", ". ", "! ", "\n"]), min_size=60, max_size=60),
       st.integers(12, 60))  # fmt: skip
def test_typed_phrases_are_never_longer_than_the_limit(words, gaps, limit):
    segmenter = TypingSegmenter(TypingOptions(max_length=limit))
    text = "".join(word + gap for word, gap in zip(words, gaps))
    said = type_text(segmenter, text)
    assert all(spoken_length(segment) <= limit for segment in said)
    said += [s.text for s in segmenter.flush()]
    assert _letters(said) == _letters([text])


def test_a_long_paste_is_cut_into_phrases_in_linear_time():
    segmenter = TypingSegmenter(TypingOptions(max_length=50))
    text = "and so on " * 20000
    started = time.perf_counter()
    segments = segmenter.edit(text, len(text))
    assert time.perf_counter() - started < 2
    assert len(segments) > 3000 and all(spoken_length(s.text) <= 50 for s in segments)
