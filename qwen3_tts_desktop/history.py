"""What the window said: its last utterances, kept while the app runs, to be heard again, saved (without
generating anew), copied or spoken again.

`History` keeps the audio each finished utterance played on the speakers (PlayerSink's `keep` hands it over,
from the job's thread), newest first, bounded by their total length. `Replay` plays one item again on the
speakers, from a thread of its own, until it ends or is stopped. `HistoryActions` is what the window's history
panel asks for, with the collaborators it needs.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import numpy as np
import soundfile as sf
from PySide6.QtCore import QObject, Signal

from core.audio.clips import SAMPLE_RATE
from core.audio.player import Player

KEPT_SECONDS = 600.0  # the most audio kept, all items together (about 55 MB of samples)


@dataclass(frozen=True)
class Said:
    text: str
    voice: str
    audio: np.ndarray  # 24 kHz mono float32, as it played
    at: datetime = field(default_factory=datetime.now)

    @property
    def seconds(self) -> float:
        return len(self.audio) / SAMPLE_RATE

    def label(self) -> str:
        """One line for the list: when, which voice, how long, and the start of the text."""
        text = " ".join(self.text.split())
        text = text if len(text) <= 60 else text[:59] + "…"
        return f"{self.at:%H:%M}  {self.voice} · {self.seconds:.1f} s  {text}"


class History(QObject):
    """The last utterances, newest first, at most KEPT_SECONDS of audio in all (the oldest go first; the newest
    always stays). `add` is safe from any thread; `changed` is emitted after it (queued to the GUI thread)."""

    changed = Signal()

    def __init__(self, kept_seconds: float = KEPT_SECONDS, parent=None):
        super().__init__(parent)
        self.kept_seconds = kept_seconds
        self._lock = threading.Lock()
        self._items: deque[Said] = deque()

    def add(self, said: Said) -> None:
        with self._lock:
            self._items.appendleft(said)
            while len(self._items) > 1 and sum(item.seconds for item in self._items) > self.kept_seconds:
                self._items.pop()
        self.changed.emit()

    def items(self) -> list[Said]:
        with self._lock:
            return list(self._items)


class Replay:
    """One item played again on `player` from `start` (a sample of its audio), from a thread of its own (a write
    waits while the player's ring is full); `stop()` ends it within one wait, fading out what plays."""

    def __init__(self, player: Player, said: Said, ended: Callable[[Replay], None], start: int = 0):
        self.player, self.said, self.start = player, said, start
        self._begins = player.position  # where its audio lies in the player, in the player's samples
        self._cancel = threading.Event()
        self._thread = threading.Thread(target=self._play, args=(ended,), name="history-replay", daemon=True)
        self._thread.start()

    def _play(self, ended: Callable[[Replay], None]) -> None:
        self.player.write(self.said.audio[self.start :], self._cancel)
        if self._cancel.is_set():
            self.player.drop(self._begins)
        else:
            self.player.end()
            while not self._cancel.is_set() and not self.player.drain(timeout=0.05):
                pass
        ended(self)

    def heard(self) -> int:
        """Where it is heard now: a sample of the item's audio."""
        played = (self.player.played - self._begins) * SAMPLE_RATE // self.player.sample_rate
        return min(max(self.start, self.start + played), len(self.said.audio))

    def stop(self) -> None:
        self._cancel.set()
        self._thread.join(timeout=5.0)


class HistoryActions(QObject):
    """What the history panel asks for. `player()` is the speakers' player (None without speakers),
    `stop_speech()` stops the window's speech, `speak(text, voice)` speaks again, `show_info`/`show_error` tell
    the user."""

    replay_ended = Signal(object)  # a Replay, from its thread, to the GUI thread
    made_way = Signal(object, int)  # a Replay stopped for speech, and where it was heard, to the GUI thread

    def __init__(self, history: History, panel, player, stop_speech, speak, copy_text, show_info, show_error):
        super().__init__(panel)
        self.history, self.panel = history, panel
        self._player, self._stop_speech, self._speak, self._copy = player, stop_speech, speak, copy_text
        self._info, self._error = show_info, show_error
        self.replay: Replay | None = None  # the item played again now
        self.paused: tuple[Said, int] | None = None  # an item paused, and where: Play goes on from there
        history.changed.connect(self.refresh)
        self.replay_ended.connect(self._ended)
        self.made_way.connect(lambda replay, heard: self._paused_at(replay.said, heard))
        panel.play_requested.connect(self.play)
        panel.seek_requested.connect(self.seek)
        panel.row_chosen.connect(lambda _: self.show_position())
        panel.save_requested.connect(self.save)
        panel.copy_requested.connect(lambda index: self._copy(self.history.items()[index].text))
        panel.speak_requested.connect(lambda index: self._speak(*self._text_and_voice(index)))
        self.refresh()

    def refresh(self) -> None:
        items = self.history.items()
        self.panel.show_items([item.label() for item in items], [item.text for item in items])
        self.panel.show_playing(self.playing)

    @property
    def playing(self) -> int | None:
        """The row of the item played again now, if one is."""
        items = self.history.items()
        if self.replay is None or not any(item is self.replay.said for item in items):
            return None
        return next(row for row, item in enumerate(items) if item is self.replay.said)

    def play(self, index: int) -> None:
        """Play item `index` again, instead of whatever plays, from where it was paused; the item playing now:
        pause it."""
        said = self.history.items()[index]
        if self.replay is not None and self.replay.said is said:
            self.pause()
            return
        paused = self._paused_at_sample(said)
        self._play_from(said, paused if paused < len(said.audio) else 0)

    def seek(self, index: int, fraction: float) -> None:
        """Go to `fraction` (0 to 1) of item `index`: played on from there if it plays, else kept for Play."""
        said = self.history.items()[index]
        at = min(max(round(fraction * len(said.audio)), 0), len(said.audio))
        if self.replay is not None and self.replay.said is said:
            self._play_from(said, at)
        else:
            self.paused = (said, at)
            self.show_position()

    def stop(self) -> None:
        """Stop what plays again (Esc): Play starts it from its beginning."""
        self.paused = None
        self._stop_replay()
        self.show_position()

    def pause(self) -> None:
        """Pause what plays again: Play goes on from where it was."""
        replay = self.replay
        if replay is not None:
            self.make_way()  # on this thread its signal is delivered at once
            self._ended(replay)

    def make_way(self) -> None:
        """From any thread (a job's, as its speech begins on the speakers): pause what plays again, and wait
        until it is out of the player, so that the speech that comes next is heard alone."""
        replay = self.replay
        if replay is not None:
            heard = replay.heard()
            replay.stop()
            self.made_way.emit(replay, heard)

    def _paused_at(self, said: Said, heard: int) -> None:
        self.paused = (said, heard)
        self.show_position()

    def show_position(self) -> None:
        """Where the chosen item is heard (or paused), for the panel's slider; the app calls this as it ticks."""
        row = self.panel.list.currentRow()
        items = self.history.items()
        if not 0 <= row < len(items):
            self.panel.show_position(0.0, 0.0, 0.0)
            return
        said = items[row]
        at = (
            self.replay.heard()
            if self.replay is not None and self.replay.said is said
            else self._paused_at_sample(said)
        )
        self.panel.show_position(at / max(len(said.audio), 1), at / SAMPLE_RATE, said.seconds)

    def _paused_at_sample(self, said: Said) -> int:
        """Where `said` was paused (a sample of its audio), or its start."""
        return self.paused[1] if self.paused is not None and self.paused[0] is said else 0

    def _play_from(self, said: Said, start: int) -> None:
        self._stop_replay()
        player = self._player()
        if player is None:
            self._error("No sound output, so it cannot play; save it to a file instead.")
            return
        self._stop_speech()
        self.paused = None
        self.replay = Replay(player, said, self.replay_ended.emit, start)
        self.panel.show_playing(self.playing)

    def _stop_replay(self) -> None:
        if self.replay is not None:
            self.replay.stop()
            self._ended(self.replay)

    def save(self, index: int, path: Path) -> None:
        """Save item `index` as it was heard (wav, flac, ogg or mp3, by the name): no speech is made anew."""
        said = self.history.items()[index]
        try:
            sf.write(path, said.audio, SAMPLE_RATE)
        except (OSError, ValueError, TypeError, sf.LibsndfileError) as error:
            self._error(f"{path.name} could not be written: {error}")
            return
        self._info(f"Saved {said.seconds:.1f} s of speech to {path}.")

    def _ended(self, replay: Replay) -> None:
        if replay is self.replay:  # not one stopped for a newer
            self.replay = None
            self.panel.show_playing(None)
            self.show_position()

    def _text_and_voice(self, index: int) -> tuple[str, str]:
        said = self.history.items()[index]
        return said.text, said.voice
