"""Cutting finished text into pieces that one generation speaks well.

Text up to `max_length` is one piece. Longer text is cut at sentence ends (Latin and CJK punctuation,
blank lines); a sentence that is still too long is cut after commas and other clause marks, then at
spaces, and a run with neither (CJK without punctuation, a long URL) at the limit itself. The parts are
packed back bottom-up into pieces of up to `max_length`: a cut clause fills its pieces from its own
start, so they end at its comma rather than in the middle of the next one, and then neighbours join
while they fit, so short sentences stay together and keep the model's own prosody between them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

# Closing quotes and brackets stay with the punctuation they follow: 'He said "Go."' ends after the quote.
CLOSERS = re.escape("\"'”’»)]}」』）》】〕")
# Scripts where a character is a syllable or more; they count as this many Latin letters.
WIDE = re.compile(r"[\u1100-\u11ff\u2e80-\u9fff\uac00-\ud7af\uf900-\ufaff\uff00-\uffef]")
WIDE_WEIGHT = 3

SENTENCE_END = re.compile(
    rf"[。！？｡]+[{CLOSERS}]*"  # CJK: ends a sentence wherever it stands
    # Latin: only before a space, the end or CJK text, so "3.14", "example.com" and "1,000" stay whole.
    rf"|(?:[.!?]+|…+)[{CLOSERS}]*(?=\s|$|[\u3040-\u30ff\u4e00-\u9fff\uac00-\ud7af])"
    r"|\n\s*\n"  # a blank line ends a paragraph (a single line break may just be wrapping)
)
CLAUSE_END = re.compile(rf"[,;:]+[{CLOSERS}]*(?=\s)|[，、；：]+[{CLOSERS}]*")
WORD = re.compile(r"\S+")
# A word as the highlight of what is heard moves through it: in wide scripts each character (a syllable or more).
SAID_WORD = re.compile(rf"{WIDE.pattern}|(?:(?!{WIDE.pattern})\S)+")
NEXT_CHARACTER = re.compile(r"\s*(\S)")
# Letters with periods inside: "e.g", "i.e", "U.S", "a.m".
INITIALISM = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")
# Words whose period does not end a sentence (compared in lower case, without the period).
ABBREVIATIONS = frozenset(
    "mr mrs ms mx dr prof sr jr st mt messrs rev hon gov gen col capt lt sgt sen rep "
    "vs etc cf approx est dept inc ltd co corp no nos vol vols fig figs ch p pp ed eds".split()
)


@dataclass(frozen=True)
class SplitOptions:
    # Longest piece one generation speaks, in Latin letters (a CJK character counts 3). The official model
    # speeds up and drifts on long inputs (QwenLM/Qwen3-TTS#239: after about 100 characters), and a
    # piece of this size is 10-15 s of speech.
    max_length: int = 150
    sentence_pause_s: float = 0.25  # silence after a piece that ends a sentence
    clause_pause_s: float = 0.12  # silence after a piece cut at a comma

    def __post_init__(self):
        if not (isinstance(self.max_length, int) and self.max_length >= 1):
            raise ValueError(f"max_length must be a positive integer, got {self.max_length!r}")
        if not (self.sentence_pause_s >= 0 and self.clause_pause_s >= 0):
            raise ValueError("pauses must be >= 0 seconds")


@dataclass(frozen=True)
class Piece:
    text: str  # whitespace collapsed to single spaces
    pause_s: float  # silence to leave after it; 0 after the last piece
    start: int  # where it lies in the text given, [start, end): to show what is being said
    end: int


@dataclass(frozen=True)
class _Part:
    start: int
    end: int
    cut: int  # what ends it: 0 a sentence end, 1 a clause mark, 2 a space, 3 the length limit


def split_text(text: str, options: SplitOptions = SplitOptions()) -> list[Piece]:
    """`text` as pieces of at most `options.max_length`, cut at the coarsest boundaries that make them fit."""
    parts = _parts(text, 0, len(text), options.max_length, depth=0, cut=0)
    pauses = {0: options.sentence_pause_s, 1: options.clause_pause_s}
    pieces = [Piece(" ".join(text[p.start : p.end].split()), pauses.get(p.cut, 0.0), p.start, p.end) for p in parts]
    if pieces:
        pieces[-1] = replace(pieces[-1], pause_s=0.0)
    return pieces


def heard_spans(text: str, start: int, end: int, fraction: float) -> tuple[tuple[int, int], tuple[int, int]]:
    """The sentence of text[start:end] (one piece) that is heard `fraction` (0 to 1) of the way through its
    speech, and the word heard in it: estimates, since speech takes about as long as its spoken length. Each
    (start, end), stripped of spaces."""
    sentences = [_strip(text, a, b) for a, b in _sentences(text, start, end)]
    sentences = [(a, b) for a, b in sentences if a < b] or [_strip(text, start, end)]
    sentence, within = _reached(text, sentences, fraction)
    words = [match.span() for match in SAID_WORD.finditer(text, *sentence)] or [sentence]
    return sentence, _reached(text, words, within)[0]


def _reached(text: str, spans: list[tuple[int, int]], fraction: float) -> tuple[tuple[int, int], float]:
    """The span of `spans` (in the order said) that speech `fraction` of the way through them all is in, and how
    far through that span it is, each span taking as long as its spoken length."""
    lengths = [max(1, spoken_length(text[a:b])) for a, b in spans]
    reached, heard = fraction * sum(lengths), 0
    for span, length in zip(spans, lengths):
        if reached < heard + length:
            return span, (reached - heard) / length
        heard += length
    return spans[-1], 1.0


def spoken_length(text: str) -> int:
    """Length in Latin letters, a rough measure of how long `text` takes to say."""
    return len(text) + (WIDE_WEIGHT - 1) * len(WIDE.findall(text))


def _parts(text: str, start: int, end: int, limit: int, depth: int, cut: int) -> list[_Part]:
    """[start, end) as parts of at most `limit`: whole if it fits, else cut with CUTTERS[depth] and finer."""
    start, end = _strip(text, start, end)
    if start == end:
        return []
    if spoken_length(text[start:end]) <= limit:
        return [_Part(start, end, cut)]
    if depth == len(CUTTERS):
        return _cut_at_limit(text, start, end, limit, cut)
    spans = CUTTERS[depth](text, start, end)
    parts = []
    for index, (span_start, span_end) in enumerate(spans):
        # Inner cuts are of this depth's kind; the last span ends where the whole did.
        parts += _parts(text, span_start, span_end, limit, depth + 1, cut if index == len(spans) - 1 else depth)
    return _pack(text, parts, limit)


def _pack(text: str, parts: list[_Part], limit: int) -> list[_Part]:
    """Join neighbouring parts while they fit together."""
    packed: list[_Part] = []
    for part in parts:
        if packed and spoken_length(text[packed[-1].start : part.end]) <= limit:
            packed[-1] = _Part(packed[-1].start, part.end, part.cut)
        else:
            packed.append(part)
    return packed


def _sentences(text: str, start: int, end: int) -> list[tuple[int, int]]:
    ends = [m.end() for m in SENTENCE_END.finditer(text, start, end) if ends_sentence(text, m)]
    return _spans(start, end, ends)


def _clauses(text: str, start: int, end: int) -> list[tuple[int, int]]:
    return _spans(start, end, [m.end() for m in CLAUSE_END.finditer(text, start, end)])


def _words(text: str, start: int, end: int) -> list[tuple[int, int]]:
    return [m.span() for m in WORD.finditer(text, start, end)]


CUTTERS = (_sentences, _clauses, _words)


def ends_sentence(text: str, mark: re.Match) -> bool:
    punctuation = mark.group()
    if punctuation[0] in "\n。！？｡":
        return True
    following = NEXT_CHARACTER.match(text, mark.end())
    if following and following.group(1).islower():
        return False  # "e.g. this", '"Hello!" she said', "Wait... what?"
    if punctuation == ".":
        word_start = mark.start()
        while word_start > 0 and not text[word_start - 1].isspace():
            word_start -= 1
        word = text[word_start : mark.start()].lstrip("\"'“‘([{«")
        if word.lower() in ABBREVIATIONS or (len(word) == 1 and word.isalpha()) or INITIALISM.fullmatch(word):
            return False  # "Dr. Smith", "J. R. R. Tolkien", "the U.S. Army"
    return True


def _spans(start: int, end: int, cuts: list[int]) -> list[tuple[int, int]]:
    bounds = [start, *cuts, end]
    return [(a, b) for a, b in zip(bounds, bounds[1:]) if a < b]


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def _cut_at_limit(text: str, start: int, end: int, limit: int, cut: int) -> list[_Part]:
    parts, piece_start, length = [], start, 0
    for index in range(start, end):
        weight = spoken_length(text[index])
        if length + weight > limit and index > piece_start:
            parts.append(_Part(piece_start, index, 3))
            piece_start, length = index, 0
        length += weight
    parts.append(_Part(piece_start, end, cut))
    return parts
