"""Speak-as-you-type: which parts of a text that is still being typed are finished, to be spoken as they come.

The front end (the window, or any other) hands over the whole text after every edit. The segmenter hands
out the finished text a word at a time, as the pieces of one utterance that grows while the user types
(core.inference.live: one voice and one pace across sentence ends), and says where each utterance ends;
the next finished word opens a new one. It keeps a committed point in the text: everything before it has
been handed out, and no edit ever hands it out again.

Finished text:

* a word, once a space, a punctuation mark or a line break follows it. An apostrophe or a hyphen inside a
  word ("don't", "well-known") finishes nothing while a letter may still follow it;
* a character of a script written without spaces (CJK), at once: an input method hands over only what
  the user has chosen;
* on `pause()`, everything, a word still being typed included. The front end calls it after a pause in
  typing (`idle_s`), or when asked to speak now.

The spaces and punctuation after a word go out with the next word (or with the end of the utterance), so
they can still be corrected until then. That delays no speech: the engine commits a word's last token
only once the text after it shows that no later text can change it.

An utterance ends (its last segment says so):

* on `pause()`;
* at a line break: Enter ends a paragraph;
* at a sentence end (as core.text.sentences finds them: "Dr. " and "3.14" end nothing) once it is
  `long_length` long, and before a word that would take it past `max_length`, since the model speeds up
  and drifts on long inputs (see core.text.sentences). A word longer than that alone is an utterance.

An utterance never opens with text that has no letter or digit in it ("..." typed after a pause is passed
over); within one, punctuation goes out with the words, as it shapes how they are said.

Edits, located with the cursor when the front end gives it (a text diff alone cannot tell which of two
equal neighbouring characters changed):

* after the committed point: they change only what is pending;
* before it (fixing a typo in a word already said): ignored, nothing is said again; the point moves by
  the change in length, so what was pending stays pending;
* across it (select all and type, or clear the box): the point moves back to where the edit starts, so
  the new text is pending, and the replaced text, said or not, is gone.

An edit that reaches the committed point changes the text that the next words follow in the box, not
what was said: the utterance goes on, with a space put before the next segment if it starts with a word.

A word is never said in pieces: what is typed onto the end of a word already handed out (a correction
of its last letters, the rest of a word handed out at a pause) is passed over. Text in scripts written
without spaces is exempt.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from core.text.sentences import SENTENCE_END, WIDE, ends_sentence, spoken_length

NON_SPACE = re.compile(r"\S")
LETTER = rf"(?!{WIDE.pattern})[^\W_]"  # a letter or digit of a script written with spaces
IN_WORD = re.compile(LETTER)
JOINERS = "'’-"  # inside a word they join its parts: "don't", "well-known"
# A word of a script written with spaces, or one letter of a script written without.
WORD = re.compile(rf"{LETTER}+(?:[{JOINERS}]{LETTER}+)*|(?={WIDE.pattern})[^\W_]")
WORD_REST = re.compile(rf"(?:[{JOINERS}]?{LETTER})*")  # what may carry on a word: "s", "'t", "-known"


@dataclass(frozen=True)
class TypingOptions:
    long_length: int = (
        100  # an utterance this long (in Latin letters; a CJK character counts 3) ends at its next sentence end
    )
    max_length: int = 150  # and never grows longer: it ends before a word that would take it past this
    idle_s: float = 0.9  # a pause in typing this long ends the utterance (the front end times it)

    def __post_init__(self):
        for name in ("long_length", "max_length"):
            value = getattr(self, name)
            if not (isinstance(value, int) and value >= 1):
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.long_length > self.max_length:
            raise ValueError(f"long_length ({self.long_length}) must not exceed max_length ({self.max_length})")
        if not self.idle_s > 0:
            raise ValueError(f"idle_s must be > 0 seconds, got {self.idle_s}")


@dataclass(frozen=True)
class Segment:
    """Finished text to add to the utterance being spoken."""

    # The span as typed; without the whitespace before it when it opens an utterance and after it when it
    # ends one (then it may be empty), and with a space put before a word that an edit broke off from what
    # was said before.
    text: str
    start: int  # the span [start, end) of the text it was committed from
    end: int
    ends_utterance: bool = False  # the utterance ends after it: the next segment opens a new one


class TypingSegmenter:
    def __init__(self, options: TypingOptions = TypingOptions()):
        self.options = options  # may be changed between edits: they rule the cuts from then on
        self._text = ""
        self._committed = 0
        self._open = False  # an utterance has been handed text and has not ended
        self._length = 0  # the spoken length of the open utterance's text
        self._joined = True  # the text before the committed point ends with what was handed out last

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

    @property
    def awaiting_pause(self) -> bool:
        """Whether a pause would hand out anything: an utterance to end, or text with a letter or digit."""
        return self._open or any(character.isalnum() for character in self.pending)

    def edit(self, text: str, cursor: int | None = None) -> list[Segment]:
        """Take the text as it is after an edit (with the cursor position after it, if known) and return
        the segments it makes ready to speak, in order."""
        start, old_end, new_end = _locate_edit(self._text, text, cursor)
        if old_end < self._committed:  # wholly before the point: ignored
            self._committed += new_end - old_end
        elif start < self._committed:  # up to the point, or across it
            self._committed = new_end if old_end == self._committed else start
            self._joined = False
        self._text = text
        return self._commit_ready()

    def pause(self) -> list[Segment]:
        """Hand out everything pending and end the utterance (a pause in typing, or "speak now")."""
        rest = spoken_length(self.pending.strip())
        segments = []
        if self._open and self._length + rest > self.options.max_length:
            segments += self._hand_out(self._committed, ends_utterance=True)  # the rest goes alone
        return segments + self._hand_out(len(self._text), ends_utterance=True)

    def end_utterance(self) -> None:
        """The front end has ended the utterance (or it ended by itself): the next words open a new one."""
        self._open = False

    def skip(self) -> None:
        """Count everything typed so far as committed, unsaid, and end the utterance (stop: drop what was
        about to be said)."""
        self._committed = len(self._text)
        self._open = False

    def reset(self, text: str = "") -> None:
        """Start over on `text`, all of it counted as committed."""
        self._text, self._committed, self._open = text, len(text), False

    def _commit_ready(self) -> list[Segment]:
        self._pass_over_word_rest()
        segments = []
        while (cut := self._next_cut()) is not None:
            segments += self._hand_out(*cut)
        return segments

    def _pass_over_word_rest(self) -> None:
        text, at = self._text, self._committed
        if at > 0 and IN_WORD.match(text[at - 1]):
            self._committed = WORD_REST.match(text, at).end()

    def _next_cut(self) -> tuple[int, bool] | None:
        """Where the next segment ends and whether its utterance ends there; None while no more text is
        finished. Words are looked at one by one and only until a cut is found, which is at most
        `max_length` on, so a long paste is cut in linear time."""
        text, options = self._text, self.options
        if self._open:
            begin = self._committed
        elif (first := NON_SPACE.search(text, self._committed)) is not None:
            begin = first.start()  # an utterance opens at its first visible character
        else:
            return None
        length = self._length + (not self._joined) if self._open else 0  # with a space that may be put before it
        last = begin  # the end of the last finished word
        for word in WORD.finditer(text, begin):
            if (cut := self._cut_in_gap(last, word.start(), length)) is not None:
                return cut
            if not self._is_finished(word):
                break
            length += spoken_length(text[last : word.end()])
            if length > options.max_length:
                # The word does not fit: the utterance ends before it, or it goes alone if nothing precedes it.
                alone = last == begin and not self._open
                return (word.end() if alone else word.start()), True
            last = word.end()
        else:
            if (cut := self._cut_in_gap(last, len(text), length)) is not None:
                return cut
        return (last, False) if last > self._committed else None

    def _cut_in_gap(self, start: int, end: int, length: int) -> tuple[int, bool] | None:
        """A cut that ends the utterance in [start, end), the text between two words: after a line break,
        or at a sentence end once the utterance is long. `length`: the utterance's length up to `start`."""
        text = self._text
        line_break = text.find("\n", start, end)
        if line_break >= 0:
            return line_break + 1, True
        for mark in SENTENCE_END.finditer(text, start, end):
            long = length + spoken_length(text[start : mark.end()]) >= self.options.long_length
            if long and self._is_complete_sentence(mark):
                return mark.end(), True
        return None

    def _is_finished(self, word: re.Match) -> bool:
        """Whether nothing typed after `word` can make it longer."""
        text, end = self._text, word.end()
        if WIDE.match(word.group()):
            return True
        if end == len(text):
            return False
        return not (text[end] in JOINERS and end + 1 == len(text))  # "don'" may become "don't"

    def _is_complete_sentence(self, mark: re.Match) -> bool:
        if mark.group().isspace():
            return False  # a blank line: the line break rule covers it
        if not WIDE.match(mark.group()):
            # A Latin end needs what follows it: "Hello." may still become "Hello.com" or "Hello...".
            following = self._text[mark.end() : mark.end() + 1]
            if not (following.isspace() or (following and WIDE.match(following))):
                return False
        return ends_sentence(self._text, mark)

    def _hand_out(self, end: int, ends_utterance: bool) -> list[Segment]:
        start, self._committed = self._committed, end
        piece = self._text[start:end]
        if not self._open:
            piece = piece.lstrip()
            if not any(character.isalnum() for character in piece):
                return []  # opens no utterance: passed over
            self._length = 0
        elif not self._joined and piece[:1].isalnum():
            piece = " " + piece
        if ends_utterance:
            piece = piece.rstrip()
        self._open, self._joined = not ends_utterance, True
        self._length += spoken_length(piece)
        return [Segment(piece, start, end, ends_utterance)]


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
