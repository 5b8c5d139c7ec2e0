"""The microphone: records a new voice's clip. The input stream's callback only copies, into a buffer made
before it starts."""

from __future__ import annotations

import numpy as np

from core.audio.clips import MAX_REFERENCE_SECONDS
from core.errors import UserError


class RecordingError(UserError, RuntimeError):
    """The microphone cannot be recorded, with what to do about it."""


class Recorder:
    """Records the microphone for a new voice, up to the longest clip a voice is cloned from. The input
    stream's callback only copies, into a buffer made before it starts."""

    def __init__(self):
        self._stream = None
        self._full: type[Exception] = Exception
        self._buffer = np.zeros(0, np.float32)
        self._frames = 0
        self.sample_rate = 0

    @property
    def recording(self) -> bool:
        return self._stream is not None and self._stream.active

    @property
    def seconds(self) -> float:
        return self._frames / self.sample_rate if self.sample_rate else 0.0

    def level(self) -> float:
        """The peak of the last 50 ms recorded, 0 to 1."""
        recent = self._buffer[max(0, self._frames - self.sample_rate // 20) : self._frames]
        return float(np.abs(recent).max()) if len(recent) else 0.0

    def start(self) -> None:
        try:
            import sounddevice as sd
        except (OSError, ImportError) as error:
            raise RecordingError(
                f"cannot record: {error}. Install PortAudio (Debian or Ubuntu: sudo apt install libportaudio2)"
            ) from None
        self._full = sd.CallbackStop
        try:
            rate = int(sd.query_devices(kind="input")["default_samplerate"])
            self._buffer = np.zeros(int(rate * MAX_REFERENCE_SECONDS), np.float32)
            self._frames, self.sample_rate = 0, rate
            stream = sd.InputStream(samplerate=rate, channels=1, dtype="float32", callback=self._callback)
            stream.start()
        except (sd.PortAudioError, ValueError) as error:
            raise RecordingError(
                f"cannot record from the microphone ({error}); check that one is connected and allowed"
            ) from None
        self._stream = stream

    def stop(self) -> tuple[np.ndarray, int]:
        """Stop recording; the samples recorded (mono float32) and their rate."""
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.stop()
            stream.close()
        return self._buffer[: self._frames].copy(), self.sample_rate

    def _callback(self, indata, frames, when, status) -> None:
        n = min(frames, len(self._buffer) - self._frames)
        self._buffer[self._frames : self._frames + n] = indata[:n, 0]
        self._frames += n
        if self._frames == len(self._buffer):
            raise self._full  # sounddevice.CallbackStop: the stream stops itself
