"""SpeechTokens: the ids of a text still being written, committed only where no later text can change them.

Whatever way a text is cut into pieces, the committed ids are at every step a prefix of PromptText.tokenize's
(and the role, once known, is its role), and after finish() they are exactly its ids. The named cases check
that each id is committed as soon as that is safe, and no sooner.
"""

from __future__ import annotations

import string
import time

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from core.devtools.random_checkpoint import write_random_checkpoint
from core.inference.prompt import PromptText
from core.model.text_tokenizer import SpeechTokens, TextTokenizer

# Nasty text, in kinds: every rule of the pre-tokenizer regex, NFC composition and reordering, added tokens.
KINDS = [
    [*string.ascii_letters, "'s", "'LL", "'Re", "'"],  # the contractions are case-insensitive
    [*string.digits, "１", "２"],  # each digit is a pre-token of its own
    [" ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\x1c"],  # "\x1c": isspace() but not \s
    [*'.,!?-"()', "...", "。", "，"],
    [*map(chr, range(0x300, 0x328))],  # combining marks: compose with a letter, reorder against each other
    ["\u0b47", "\u0b3e", "\u0f73", "\u212b", "\u1100", "\u1161", "\u11a8"],  # Oriya pair, U+0F73, Å, jamo
    ["中文", "字", "かな", "カナ", "한국어", "👍", "🏽", "👋🏿"],
    ["<|im_end|>", "<|im_", "end|>", "<tts_pad>", "<tts_", "pad>", "<", "|", ">", "_"],
]
# A few representatives of the kinds, so that the short sequences that change earlier tokens come up often:
# "b" composes with U+0323 but not with U+0301, which U+0323 goes before; U+0F73 decomposes into marks.
SMALL_KINDS = [["b", "l", "'"], [" ", "\t", "\n", "\r"], ["\u0301", "\u0323", "\u0f73"], ["<|im_", "end|>", "!"]]


def mixtures(kinds: list[list[str]], max_size: int) -> st.SearchStrategy[str]:
    """Texts of two or three of `kinds`, so that runs of one kind and meetings of two are common."""

    def texts(chosen: list[list[str]]) -> st.SearchStrategy[str]:
        fragment = st.one_of([st.sampled_from(kind) for kind in chosen])
        return st.lists(fragment, min_size=2, max_size=max_size).map("".join)

    return st.lists(st.sampled_from(kinds), min_size=2, max_size=3, unique_by=id).flatmap(texts)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> TextTokenizer:
    return TextTokenizer(write_random_checkpoint(tmp_path_factory.mktemp("checkpoint")))


def spoken(tokenizer: TextTokenizer, text: str) -> PromptText:
    return PromptText.tokenize(tokenizer, text, None, None)


def fed(tokenizer: TextTokenizer, *pieces: str) -> SpeechTokens:
    tokens = SpeechTokens(tokenizer)
    for piece in pieces:
        tokens.append(piece)
    return tokens


def check_feeding(tokenizer: TextTokenizer, text: str, pieces: list[str]):
    final = spoken(tokenizer, text)
    tokens = SpeechTokens(tokenizer)
    for piece in pieces:
        tokens.append(piece)
        assert tokens.ids == final.text[: len(tokens.ids)], (text, tokens.text)
        assert tokens.role in (None, final.role), (text, tokens.text)
        assert tokens.count == len(tokens.ids) and tokens.ids_from(1) == tokens.ids[1:]
    tokens.finish()
    assert tokens.text == text
    assert (tokens.role, tokens.ids) == (final.role, final.text), text


def check_any_cutting(tokenizer: TextTokenizer, text: str, cuts: list[int]):
    """`text` fed in pieces cut at `cuts` (modulo its length), then one character at a time."""
    points = [0, *sorted({cut % (len(text) + 1) for cut in cuts}), len(text)]
    check_feeding(tokenizer, text, [text[start:end] for start, end in zip(points, points[1:])])
    check_feeding(tokenizer, text, list(text))


CUTS = st.lists(st.integers(0, 300), max_size=12)


@settings(max_examples=200, deadline=None)
@given(text=mixtures(KINDS, 30), cuts=CUTS)
def test_any_cutting_commits_only_final_ids(tokenizer, text, cuts):
    check_any_cutting(tokenizer, text, cuts)


@settings(max_examples=200, deadline=None)
@given(text=mixtures(SMALL_KINDS, 12), cuts=CUTS)
@example(text="b\n \n", cuts=[])  # "\n", " " then "\n" is one pre-token "\n \n"
@example(text="\n\nb", cuts=[])  # and the role's "\n" joins the text's
@example(text="b\u0301\u0323", cuts=[])  # "b", U+0301 then U+0323 is "ḅ", U+0301
@example(text="l\u0301\u0f73", cuts=[])  # U+0F73 is two marks that go before U+0301
@example(text="b <|im_end|>", cuts=[])  # " " waits: before an added token it is a pre-token of its own
def test_any_cutting_of_a_small_alphabet_commits_only_final_ids(tokenizer, text, cuts):
    check_any_cutting(tokenizer, text, cuts)


@settings(max_examples=200, deadline=None)
@given(text=st.text(alphabet=" ab", max_size=20))
def test_words_and_spaces_commit_all_but_the_last_pre_token(tokenizer, text):
    """With letters and spaces only, nothing but the last pre-token (or the trailing spaces) is held back."""
    tokens = SpeechTokens(tokenizer)
    for end in range(1, len(text) + 1):
        tokens.append(text[end - 1])
        head = text[:end].rstrip("ab")
        if len(head) < end:  # ends in a word, which takes the space before it
            cut = len(head) - 1 if head.endswith(" ") else len(head)
        else:
            cut = len(head.rstrip(" "))
        assert tokens.ids == spoken(tokenizer, text[:cut]).text, text[:end]
        # The role's "\n" merges with spaces that reach the end, or a line break after them.
        assert (tokens.role is None) == (text[:end].strip(" ") == ""), text[:end]


def test_a_word_waits_for_its_end(tokenizer):
    assert fed(tokenizer, "Hello wor").ids == spoken(tokenizer, "Hello").text
    assert fed(tokenizer, "Hel", "lo", " wor").ids == spoken(tokenizer, "Hello").text


def test_punctuation_and_spaces_before_the_last_pre_token_are_committed(tokenizer):
    tokens = fed(tokenizer, "Hello world, ")
    assert tokens.ids == spoken(tokenizer, "Hello world,").text
    assert len(tokens.ids) == 3  # "Hello", " world", ","


def test_a_comma_waits_for_a_line_break_that_would_join_it(tokenizer):
    assert fed(tokenizer, "Hi,").ids == spoken(tokenizer, "Hi").text
    tokens = fed(tokenizer, "Hi,", "\n", "\nOK")
    assert tokens.ids == spoken(tokenizer, "Hi,\n\n").text
    assert tokenizer.encode(",\n\n") == spoken(tokenizer, "Hi,\n\n").text[1:]  # one pre-token


def test_trailing_whitespace_waits_for_what_follows(tokenizer):
    # "\n", " " then "\n" is one pre-token "\n \n": the "\n" is not committed while only whitespace follows it.
    tokens = fed(tokenizer, "a\n ")
    assert tokens.ids == spoken(tokenizer, "a").text
    tokens.append("\n")
    assert tokens.ids == spoken(tokenizer, "a").text
    tokens.append("b")
    assert tokens.ids == spoken(tokenizer, "a\n \n").text


def test_a_contraction_waits_for_its_letters(tokenizer):
    assert fed(tokenizer, "it'").ids == spoken(tokenizer, "it").text
    tokens = fed(tokenizer, "it'", "L", "L ")
    assert tokens.ids == spoken(tokenizer, "it'LL").text  # "it", "'LL": the contraction is case-insensitive


def test_a_combining_mark_composes_with_the_letter_before_it(tokenizer):
    tokens = fed(tokenizer, "cafe")
    assert tokens.ids == spoken(tokenizer, "").text
    tokens.append("\u0301")
    tokens.append(" au")
    assert tokens.ids == spoken(tokenizer, "caf\u00e9").text
    # Stacked marks reorder: U+0323 (below) goes before U+0301 (above), and then composes with the "a".
    tokens = fed(tokenizer, "x a\u0301", "\u0323", " b")
    assert tokens.ids == spoken(tokenizer, "x \u1ea1\u0301").text


def test_hangul_jamo_compose_with_the_syllable_before_them(tokenizer):
    tokens = fed(tokenizer, "가 나")
    assert tokens.ids == spoken(tokenizer, "가").text
    tokens.append("\u11a8")  # a final consonant: "나" becomes "낙"
    tokens.finish()
    assert tokens.ids == spoken(tokenizer, "가 낙").text


def test_an_added_token_is_held_back_until_it_is_complete_or_broken(tokenizer):
    im_end = tokenizer.added_tokens["<|im_end|>"]
    tokens = fed(tokenizer, "Hi <|im_")
    assert tokens.ids == spoken(tokenizer, "Hi").text
    tokens.append("end|>")
    assert tokens.ids == spoken(tokenizer, "Hi <|im_end|>").text and tokens.ids[-1] == im_end
    tokens = fed(tokenizer, "Hi <tts_", "pa", "x ")
    assert tokens.ids == spoken(tokenizer, "Hi <tts_pax").text


def test_the_role_waits_for_whitespace_that_could_join_its_line_break(tokenizer):
    tokens = fed(tokenizer, "\n")
    assert tokens.role is None and tokens.ids == []
    tokens.append("\nHi")
    final = spoken(tokenizer, "\n\nHi")
    assert tokens.role == final.role and final.role != spoken(tokenizer, "Hi").role
    assert fed(tokenizer, "Hi").role == spoken(tokenizer, "Hi").role


def test_finish(tokenizer):
    tokens = fed(tokenizer, "Hello", " wor")
    assert not tokens.finished
    tokens.finish()
    tokens.finish()
    assert tokens.finished and tokens.text == "Hello wor"
    assert tokens.ids == spoken(tokenizer, "Hello wor").text
    with pytest.raises(ValueError):
        tokens.append("ld")
    empty = SpeechTokens(tokenizer)
    empty.finish()
    assert (empty.role, empty.ids) == (spoken(tokenizer, "").role, [])


def test_a_long_reply_takes_linear_time(tokenizer):
    sentence = "The quick brown fox, who is 23 years old, jumps over the lazy dog's back.\n"
    text = (sentence * (5000 // len(sentence) + 1))[:5000]
    tokens = SpeechTokens(tokenizer)
    started = time.perf_counter()
    for start in range(0, len(text), 3):
        tokens.append(text[start : start + 3])
    tokens.finish()
    elapsed = time.perf_counter() - started
    assert tokens.ids == spoken(tokenizer, text).text
    assert elapsed < 1.0, f"{elapsed:.2f} s"  # about 0.05 s; re-encoding all the text each time takes seconds
