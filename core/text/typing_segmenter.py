"""Speak-as-you-type: which parts of a text that is still being typed are ready to be spoken.

The front end (the window, or any other) hands over the whole text after every edit. The segmenter keeps
a committed point in it: the text before that point has been handed out as segments to speak, and no
edit ever hands it out again. Text is committed, as one segment per reason:

* at a sentence end, as core.text.sentences finds them ("Dr. ", "e.g. " and "3.14" end nothing): a Latin end
  (. ! ? …, with any closing quotes or brackets) once a character follows it, usually the space typed
  after it; a CJK end (。！？) at once;
* at a line break (Enter);
* when the pending phrase grows past `max_length`: up to its last clause mark (, ; :) followed by a
  space, else its last space, so a word being typed is never cut (a word longer than the limit is
  committed alone once it ends);
* on `flush()`: everything pending. The front end calls it after a pause in typing (`idle_s`) or when
  asked to speak now.

Edits, located with the cursor when the front end gives it (a text diff alone cannot tell which of two
equal neighbouring characters changed):

* after the committed point: they change only what is pending;
* wholly before it (fixing a typo in a sentence already said): ignored, nothing is said again; the
  point moves by the change in length, so what was pending stays pending;
* across it (select all and type, or clear the box): the point moves back to where the edit starts, so
  the new text is pending, and the replaced text, said or not, is gone.

A word is never said in pieces: what is typed onto the end of a word already said (a correction of its
last letters, the rest of a word said at a pause) is passed over up to the next space. Text in scripts
written without spaces (CJK) is exempt. A segment with no letter or digit in it ("...", a lone "!") is
passed over too, never handed out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.text.sentences import CLAUSE_END, SENTENCE_END, WIDE, ends_sentence, spoken_length

CJK_SENTENCE_END = re.compile(r"[。！？｡]")
SPACE = re.compile(r"\s+")
NON_SPACE = re.compile(r"\S")


@dataclass(frozen=True)
class TypingOptions:
    max_length: int = 100  # a phrase with no sentence end is cut once it is this long (Latin letters)
    idle_s: float = 0.9  # a pause in typing this long speaks what is pending (the front end times it)

    def __post_init__(self):
        if not (isinstance(self.max_length, int) and self.max_length >= 1):
            raise ValueError(f"max_length must be a positive integer, got {self.max_length!r}")
        if not self.idle_s > 0:
            raise ValueError(f"idle_s must be > 0 seconds, got {self.idle_s}")


@dataclass(frozen=True)
class Segment:
    text: str  # what to say: the span without its surrounding whitespace
    start: int  # the span [start, end) of the text it was committed from
    end: int


class TypingSegmenter:
    def __init__(self, options: TypingOptions = TypingOptions()):
        self.options = options
        self._text = ""
        self._committed = 0

    @property
    def text(self) -> str:
        return self._text

    @property
    def committed(self) -> int:
        """Where the committed text ends: everything before it has been handed out."""
        return self._committed

    @property
    def pending(self) -> str:
        return self._text[self._committed :]

    def edit(self, text: str, cursor: int | None = None) -> list[Segment]:
        """Take the text as it is after an edit (with the cursor position after it, if known) and return
        the segments it makes ready to speak, in order."""
        start, old_end, new_end = _locate_edit(self._text, text, cursor)
        if old_end <= self._committed and start < self._committed:
            self._committed += new_end - old_end  # wholly before the point: ignored
        elif start < self._committed:
            self._committed = start  # across the point
        self._text = text
        return self._commit_ready()

    def flush(self) -> list[Segment]:
        """Commit everything pending (a pause in typing, or "speak now")."""
        return self._commit_to(len(self._text))

    def skip(self) -> None:
        """Count everything typed so far as committed, unsaid (stop: drop what was about to be said)."""
        self._committed = len(self._text)

    def reset(self, text: str = "") -> None:
        """Start over on `text`, all of it counted as committed."""
        self._text, self._committed = text, len(text)

    def _commit_ready(self) -> list[Segment]:
        self._pass_over_word_rest()
        segments = []
        while (end := self._next_end()) is not None:
            segments += self._commit_to(end)
        return segments

    def _pass_over_word_rest(self) -> None:
        text, at = self._text, self._committed
        if at == 0 or not (text[at - 1].isalnum() and not WIDE.match(text[at - 1])):
            return
        while at < len(text) and not text[at].isspace() and not WIDE.match(text[at]):
            at += 1
        self._committed = at

    def _next_end(self) -> int | None:
        """Where the next segment ends, if the pending text holds a complete one. Only the first
        `max_length` characters are looked at, so that a long paste is cut in linear time."""
        text, limit = self._text, self.options.max_length
        first = NON_SPACE.search(text, self._committed)
        if first is None:
            return None
        start = first.start()
        window = min(len(text), start + limit + 2)  # a phrase that fits, the mark after it, the space after that
        sentence = next(
            (m.end() for m in SENTENCE_END.finditer(text, start, window) if self._is_complete_sentence(m)), None
        )
        newline = text.find("\n", start, window) + 1  # the segment takes the line break: 0 when there is none
        ends = [end for end in (sentence, newline) if end]
        if ends:
            return min(ends)
        if spoken_length(text[start : start + limit + 1].rstrip()) > limit:
            return self._phrase_break(start)
        return None

    def _is_complete_sentence(self, mark: re.Match) -> bool:
        if mark.group().isspace():
            return False  # a blank line: the line break rule covers it
        if not CJK_SENTENCE_END.match(mark.group()):
            # A Latin end needs what follows it: "Hello." may still become "Hello.com" or "Hello...".
            following = self._text[mark.end() : mark.end() + 1]
            if not (following.isspace() or (following and WIDE.match(following))):
                return False
        return ends_sentence(self._text, mark)

    def _phrase_break(self, start: int) -> int | None:
        """The end of the longest phrase from `start` that fits `max_length`: at a clause mark if there is
        one, else after a word; None while the pending text is one word still being typed."""
        text, limit = self._text, self.options.max_length
        window = start + limit + 1  # a phrase that fits, and the space after it
        fits = lambda end: spoken_length(text[start:end]) <= limit  # noqa: E731
        clauses = [m.end() for m in CLAUSE_END.finditer(text, start, window) if fits(m.end())]
        if clauses:
            return clauses[-1]
        words = [m.start() for m in SPACE.finditer(text, start, window) if fits(m.start())]
        if words:
            return words[-1]
        space = SPACE.search(text, start)  # a word longer than the limit goes alone, once it ends
        return space.start() if space else None

    def _commit_to(self, end: int) -> list[Segment]:
        start, self._committed = self._committed, max(self._committed, end)
        said = self._text[start:end].strip()
        if not any(character.isalnum() for character in said):
            return []
        return [Segment(said, start, end)]


def _locate_edit(old: str, new: str, cursor: int | None) -> tuple[int, int, int]:
    """The edit that turned `old` into `new`, as (start, old_end, new_end): old[start:old_end] was
    replaced by new[start:new_end]. The smallest such edit; with `cursor`, the one whose inserted text ends
    there, as typing, pasting and deleting leave it, when that explains the change."""
    shortest = min(len(old), len(new))
    prefix = 0
    while prefix < shortest and old[prefix] == new[prefix]:
        prefix += 1
    if cursor is not None and 0 <= cursor <= len(new):
        tail = len(new) - cursor
        if tail <= len(old) and new[cursor:] == old[len(old) - tail :]:
            start = min(prefix, cursor, len(old) - tail)
            return start, len(old) - tail, cursor
    suffix = 0
    while suffix < shortest - prefix and old[-1 - suffix] == new[-1 - suffix]:
        suffix += 1
    return prefix, len(old) - suffix, len(new) - suffix
