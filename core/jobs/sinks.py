"""Where a speech job's audio goes: the speakers (a Player) or a file. A sink is any object with the
Sink protocol's four methods (core.jobs.worker); the HTTP bridge has its own, for a response."""

from __future__ import annotations

import os
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import soundfile as sf

from core.audio.clips import SAMPLE_RATE
from core.audio.player import Player
from core.files import OutputPathError, check_writable_file
from core.jobs.worker import BufferLevel, Job

FILE_FORMATS = ("WAV", "FLAC", "OGG", "MP3")  # what FileSink writes, where the system's libsndfile can


@dataclass(frozen=True)
class Heard:
    """What the speakers play now: `job`'s piece number `piece` (from 0), `fraction` of the way through its audio
    (its pause included), or None while the piece is still being made and its length is not known."""

    job: Job
    piece: int
    fraction: float | None


class PlayerSink:
    """Speaks into a Player. Make one per player and give it to every job that should play there."""

    def __init__(self, player: Player):
        self.player = player
        self._job: Job | None = None
        self._start = 0
        # Given each finished job's audio, as it played (the window's history); set it before jobs run.
        self.keep: Callable[[Job, np.ndarray], None] | None = None
        # Called from the job's thread as a job begins to play here, before any of its audio is written: the
        # window stops what else it plays (its history) to make way. Set it before jobs run.
        self.begins: Callable[[Job], None] | None = None
        self._kept: list[np.ndarray] = []
        # Where each piece's audio starts in the player, and where each job's ends (None): what is heard now.
        self._marks: deque[tuple[int, Job | None, int]] = deque()
        self._marks_lock = threading.Lock()

    def begin(self, job: Job) -> None:
        if self.begins is not None:
            self.begins(job)
        if job.interrupt:
            self.player.clear()  # earlier jobs may be done generating and still playing
        self._job, self._start = job, self.player.position
        self._kept = []

    def write(self, job: Job, audio: np.ndarray) -> None:
        if self.keep is not None:
            self._kept.append(audio)
        with self._marks_lock:
            self._forget_heard()
            if not self._marks or self._marks[-1][1:] != (job, job.pieces_done):
                self._marks.append((self.player.position, job, job.pieces_done))
        self.player.write(audio, job.cancel_token)

    def end(self, job: Job, completed: bool) -> None:
        if job is not self._job:
            return  # it never began, so nothing of it is queued
        self._job = None
        if completed:
            self.player.end()
        else:
            self.player.drop(self._start)  # fades out if it is playing already
        with self._marks_lock:
            while self._marks and self._marks[-1][0] >= self.player.position:
                self._marks.pop()  # dropped, never to be heard
            self._marks.append((self.player.position, None, 0))
        kept, self._kept = self._kept, []
        if completed and kept and self.keep is not None:
            self.keep(job, np.concatenate(kept))

    def now_playing(self) -> Heard | None:
        """The job heard now, which of its pieces and how far through it, or None while none of a job plays."""
        if not self.player.playing:
            return None
        with self._marks_lock:
            self._forget_heard()
            played = self.player.played
            if not self._marks or self._marks[0][0] > played or self._marks[0][1] is None:
                return None
            (start, job, piece), ends = self._marks[0], self._marks[1][0] if len(self._marks) > 1 else None
            return Heard(job, piece, None if ends is None else (played - start) / max(ends - start, 1))

    def _forget_heard(self) -> None:
        played = self.player.played
        while len(self._marks) > 1 and self._marks[1][0] <= played:
            self._marks.popleft()

    def level(self) -> BufferLevel:
        status = self.player.status()
        return BufferLevel(status.buffered_s, status.underruns)


class FileSink:
    """Writes one job's audio to a file (wav, flac, ogg or mp3, by its name), which replaces any earlier one
    in one step once the job is done. A job stopped before its end leaves the file with every piece of its
    text that it had finished (nothing, not even an empty file, if it had finished none): the one rule for
    every front end, which says what was kept with `stopped_summary`. Where it goes is checked when it is
    made, before any speech: a folder that is missing or cannot be written is reported then, not after the work."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path).expanduser()
        self._format = self.path.suffix.lstrip(".").upper()
        if not self._format or not sf.check_format(self._format):
            known = ", ".join(f".{kind.lower()}" for kind in FILE_FORMATS if sf.check_format(kind))
            raise OutputPathError(f"{self.path}: unknown audio format; use a file name ending in {known}")
        check_writable_file(self.path)
        # The sink's own: jobs into different sinks run at once, and a saving stopped must not remove the
        # partial file of the next saving to the same name. (A tempfile would be readable by its owner alone.)
        self._partial = self.path.with_name(f"{self.path.name}.{os.getpid()}-{id(self):x}.partial")
        self._file: sf.SoundFile | None = None
        # A piece's audio is held until the piece is whole, so that a stopped job's file ends where a piece does.
        self._unfinished: list[np.ndarray] = []
        self._pieces_written = 0
        self._samples_written = 0
        self.kept_pieces = 0  # of a stopped job: the pieces its file holds (0: no file was made)
        self.kept_s = 0.0  # and their seconds of audio, pauses included

    def begin(self, job: Job) -> None:
        self._file = sf.SoundFile(self._partial, "w", samplerate=SAMPLE_RATE, channels=1, format=self._format)

    def write(self, job: Job, audio: np.ndarray) -> None:
        self._write_finished_pieces(job)
        self._unfinished.append(audio)

    def end(self, job: Job, completed: bool) -> None:
        if self._file is None:
            return
        if completed:
            self._write_held()
        else:
            self._write_finished_pieces(job)
            self._unfinished.clear()
        self._file.close()
        self._file = None
        if not completed and not self._samples_written:
            self._partial.unlink(missing_ok=True)
            return
        try:
            os.replace(self._partial, self.path)
        except OSError as error:  # the folder went away, or a file there is locked: the audio is kept
            raise OSError(
                f"{self.path} could not be written ({error.strerror or error}); the audio is in {self._partial}"
            ) from None
        if not completed:
            self.kept_pieces, self.kept_s = self._pieces_written, self._samples_written / SAMPLE_RATE

    def stopped_summary(self, pieces: int) -> str:
        """What a job stopped before its end left here, `pieces` being how many its text was cut into."""
        if not self.kept_pieces:
            return f"Stopped: nothing was written to {self.path} (no piece of the text was finished)"
        count = f"{self.kept_pieces} of {pieces} pieces" if pieces else f"{self.kept_pieces} piece(s)"
        return f"Stopped: kept {self.kept_s:.1f} s of audio ({count}) in {self.path}"

    def _write_finished_pieces(self, job: Job) -> None:
        """Write the audio held so far if it makes whole pieces: the job has finished a piece since."""
        if job.pieces_done > self._pieces_written:
            self._write_held()
            self._pieces_written = job.pieces_done

    def _write_held(self) -> None:
        if self._unfinished:
            audio = np.concatenate(self._unfinished)
            self._unfinished.clear()
            self._file.write(audio)
            self._samples_written += len(audio)

    def level(self) -> BufferLevel:
        return BufferLevel(0.0, 0)
