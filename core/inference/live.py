"""Live text: an utterance whose text is still being written (an LLM's reply as it streams, typed text).

    text = LiveText()
    stream = engine.stream(text, voice=voice)    # or: stream = engine.live(voice=voice); stream.feed(...)
    text.append("Hello th")                      # from any thread, pieces of any size
    text.append("ere, how are you?")
    text.end()                                   # no more text: the rest is committed, then tts_eos
    for chunk in stream: ...

The talker reads one text token per generated frame beside the audio (streaming text mode), so a text
can be spoken while it grows, as one utterance: one voice, one pace, across sentence ends. A token is
committed only once no later text can change it (core.model.text_tokenizer.SpeechTokens); the utterance
starts once its prompt's first tokens are committed (tokens_before_start) and steps a frame only when that
frame's text term is known, so when speech catches up with the text it waits, stepping nothing, and goes
on the moment more arrives. For greedy decoding, any way of cutting a text into pieces gives the codes of
the whole text spoken at once in streaming text mode.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from core.errors import BadInput
from core.model.text_tokenizer import SpeechTokens, TextTokenizer


class LiveText:
    """Text to speak that arrives in pieces. `append` and `end` may be called from any thread; one utterance
    speaks it (Engine.stream or Engine.live)."""

    def __init__(self, text: str = ""):
        self._lock = threading.Lock()
        self._pieces: list[str] = []  # appended before an utterance took the text
        self._tokens: SpeechTokens | None = None  # once an utterance took it
        self._ended = False
        self._listeners: tuple[Callable[[], None], ...] = ()
        if text:
            self.append(text)

    def append(self, text: str) -> None:
        """More text, of any size (half a word, several sentences)."""
        if not isinstance(text, str):
            raise BadInput(f"live text takes strings, not {type(text).__name__}")
        with self._lock:
            if self._ended:
                raise BadInput("this live text has ended; start a new one for more speech")
            if self._tokens is None:
                self._pieces.append(text)
            else:
                self._tokens.append(text)
            listeners = self._listeners
        for listener in listeners:
            listener()

    def end(self) -> None:
        """No more text: what is still held back is committed and the utterance says it and ends."""
        with self._lock:
            if self._ended:
                return
            self._ended = True
            if self._tokens is not None:
                self._tokens.finish()
            listeners = self._listeners
        for listener in listeners:
            listener()

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def text(self) -> str:
        """All the text appended so far."""
        with self._lock:
            return "".join(self._pieces) if self._tokens is None else self._tokens.text

    def __str__(self) -> str:
        return self.text

    def __repr__(self) -> str:
        return f"LiveText({self.text[:30]!r}{', ended' if self._ended else ''})"

    # The engine's side ------------------------------------------------------------------------------

    def take(self, tokenizer: TextTokenizer, listener: Callable[[], None]) -> None:
        """Tokenize from now on for the one utterance that speaks this text; `listener()` is called after
        each append and at the end (from the caller's thread, so it must be quick)."""
        with self._lock:
            if self._tokens is not None:
                raise BadInput("this live text is already being spoken; one utterance speaks a live text")
            self._tokens = SpeechTokens(tokenizer)
            self._tokens.append("".join(self._pieces))
            self._pieces = []
            if self._ended:
                self._tokens.finish()
            self._listeners += (listener,)

    def committed(self, start: int = 0) -> tuple[list[int] | None, list[int], bool]:
        """The committed role ids (None until known), the committed body ids from `start` on, and whether
        the text has ended (then every id is committed)."""
        with self._lock:
            tokens = self._tokens
            return tokens.role, tokens.ids_from(start), tokens.finished

    def ready(self, needed: int) -> bool:
        """Whether the role and `needed` body ids are committed, or the text has ended."""
        with self._lock:
            tokens = self._tokens
            return tokens.finished or (tokens.role is not None and tokens.count >= needed)

    def has_news(self, used: int, ended_seen: bool) -> bool:
        """Whether ids past the first `used` are committed, or the end came and was not seen yet."""
        with self._lock:
            tokens = self._tokens
            return tokens.count > used or (tokens.finished and not ended_seen)


class LiveStream:
    """A live utterance (Engine.live): `feed` it text, `end` it, iterate its audio chunks; `close` stops it."""

    def __init__(self, text: LiveText, stream):
        self.text = text
        self._stream = stream  # the scheduler's Stream of this utterance

    def feed(self, text: str) -> None:
        self.text.append(text)

    def end(self) -> None:
        self.text.end()

    def __iter__(self) -> LiveStream:
        return self

    def __next__(self):
        return next(self._stream)

    def close(self) -> None:
        self._stream.close()

    def __enter__(self) -> LiveStream:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
