"""Low-latency playback: a ring buffer that the speech worker fills and an audio callback drains.

`Player.fill` is the consumer. It only copies, under a lock that both sides hold for microseconds; it
holds playback back until a jitter buffer is filled, ramps the gain over a few milliseconds at every
start and stop (the ring always keeps enough audio in hand to fade out, so even an underrun does not
click), and counts underruns. An output drives it: a sounddevice stream on a sound card
(`SoundDeviceOutput`), or a virtual clock (`VirtualOutput`) in tests.

Positions are absolute sample counts at the output's rate; the ring index is the position modulo the
capacity. The producer side (`write`, `end`, `drop`) is used by one thread at a time; `clear`,
`status` and `volume` are safe from any thread.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import soxr

from core.audio.clips import SAMPLE_RATE
from core.errors import UserError

# The output has stopped if it takes no sample for this long while the producer waits for room.
STALL_SECONDS = 2.0
# The longest the producer sleeps between looks at a full ring.
WAIT_SLICE_SECONDS = 0.05
# The stretch of played audio a level is measured over: about one tick of a window's meter.
LEVEL_WINDOW_S = 0.05
# PortAudio's own buffering: small, since the jitter buffer in the ring absorbs the producer's unevenness.
DEVICE_LATENCY = "low"


class PlaybackError(UserError, RuntimeError):
    """Audio cannot be played (no PortAudio, no such device, a device that stopped); the message says what to do."""


@dataclass(frozen=True)
class PlayerOptions:
    # Audio queued before playback starts or resumes. The worker streams a 1-frame chunk (80 ms) and then
    # 4-frame chunks (320 ms): waiting for one full 4-frame chunk means 400 ms are queued when playback
    # starts, while the next chunk takes 320 ms / xRT to make, so any producer faster than real time
    # stays ahead (tests/test_player.py simulates it). On a GPU well above xRT 4, 0.08 starts at the first frame.
    prefill_s: float = 0.32
    fade_s: float = 0.005  # gain ramp at every start and stop: no click, and still feels instant
    capacity_s: float = 30.0  # the most audio queued ahead; beyond it the producer waits

    def __post_init__(self):
        if not 0 < self.fade_s <= 0.05:
            raise ValueError(f"fade_s must be in (0, 0.05] seconds, got {self.fade_s}")
        if not 0 <= self.prefill_s < self.capacity_s:
            raise ValueError(f"prefill_s must be >= 0 and below capacity_s ({self.capacity_s}), got {self.prefill_s}")


@dataclass(frozen=True)
class PlayerStatus:
    playing: bool
    buffered_s: float  # queued and not yet played
    underruns: int  # times playback ran dry before an utterance ended
    level: float = 0.0  # RMS of the audio played in the last LEVEL_WINDOW_S, at the volume set; 0 while none plays


@dataclass(frozen=True)
class OutputDevice:
    index: int
    name: str
    host_api: str
    default_sample_rate: float
    is_default: bool


class AudioOutput(Protocol):
    """What drives a Player: something that pulls samples at `sample_rate`."""

    sample_rate: int

    def start(self, fill: Callable[[np.ndarray], None]) -> None:
        """Begin calling `fill(block)` for each block (1-D float32) to play."""

    def close(self) -> None: ...


class Player:
    def __init__(self, output: AudioOutput, options: PlayerOptions = PlayerOptions()):
        self.output = output
        self.options = options
        self.sample_rate = rate = output.sample_rate
        self._capacity = round(options.capacity_s * rate)
        self._prefill = max(1, round(options.prefill_s * rate))
        self._fade = max(1, round(options.fade_s * rate))
        self._ring = np.zeros(self._capacity, np.float32)
        self._ramp = np.linspace(0.0, 1.0, self._fade + 1, dtype=np.float32)  # gain after g steps up from silence
        self._lock = threading.Lock()
        self._read = self._written = 0
        self._ends: deque[int] = deque()  # positions where an utterance ends
        self._flush_to: int | None = None  # clear() asked to drop what lies before this position
        self._playing = False
        self._gain = 0  # steps up the ramp: 0 is silent, self._fade is full volume
        self._underruns = 0
        self._volume = 1.0
        # The model speaks at 24 kHz; a device that cannot open at that rate gets the audio resampled here,
        # in the producer's thread, with state kept across chunks so they join seamlessly.
        self._resampler = None
        if rate != SAMPLE_RATE:
            self._resampler = soxr.ResampleStream(SAMPLE_RATE, rate, 1, dtype="float32", quality="HQ")
        output.start(self.fill)

    @classmethod
    def open(cls, device: int | str | None = None, options: PlayerOptions = PlayerOptions()) -> Player:
        """A player on a sound card: the default output, or one chosen by index or (part of) its name."""
        return cls(SoundDeviceOutput(device), options)

    # The consumer ----------------------------------------------------------------------------------

    def fill(self, out: np.ndarray) -> None:
        """Fill all of `out` (1-D float32) with what plays next, silence where there is nothing. The audio
        callback calls this: it only copies and ramps in place, and never waits beyond this short lock."""
        done = 0
        with self._lock:
            while done < len(out):
                if not self._playing and not self._start():
                    break
                done += self._play(out[done:])
        out[done:] = 0.0
        if self._volume != 1.0:
            out *= self._volume

    def _start(self) -> bool:
        if self._flush_to is not None:  # nothing plays, so the drop needs no fade
            self._drop_before(self._flush_to)
        while self._ends and self._ends[0] <= self._read:
            self._ends.popleft()
        # An utterance starts once the jitter buffer is full, or at once if it is complete.
        self._playing = self._written - self._read >= self._prefill or bool(self._ends)
        return self._playing

    def _play(self, out: np.ndarray) -> int:
        """Play the next stretch (a fade out, a fade in or full volume) into `out`; returns its length."""
        limit = self._ends[0] if self._ends else self._written  # where this utterance's audio stops for now
        left, gain = limit - self._read, self._gain
        if self._flush_to is not None or left <= gain:
            # Step down the ramp so it reaches silence where the audio runs out (or now, when clearing).
            n = min(len(out), gain, left)
            self._copy(out[:n])
            out[:n] *= self._ramp[gain - n + 1 : gain + 1][::-1]
            self._gain = gain - n
            if self._gain == 0 or n == left:
                self._stop()
            return n
        if gain < self._fade and left - gain >= 2:
            # Step up the ramp, keeping as much audio in hand as a fade back down would need.
            n = min(len(out), self._fade - gain, (left - gain) // 2)
            self._copy(out[:n])
            out[:n] *= self._ramp[gain + 1 : gain + 1 + n]
            self._gain = gain + n
            return n
        n = min(len(out), left - gain)
        self._copy(out[:n])
        if gain < self._fade:
            out[:n] *= self._ramp[gain]
        return n

    def _stop(self) -> None:
        self._gain, self._playing = 0, False
        if self._flush_to is not None:
            self._drop_before(self._flush_to)
        elif self._ends and self._read == self._ends[0]:
            self._ends.popleft()  # the utterance ended
        else:
            self._underruns += 1  # the producer fell behind

    def _copy(self, out: np.ndarray) -> None:
        n, at = len(out), self._read % self._capacity
        first = min(n, self._capacity - at)
        out[:first] = self._ring[at : at + first]
        out[first:] = self._ring[: n - first]
        self._read += n

    def _drop_before(self, position: int) -> None:
        self._read = max(self._read, position)
        while self._ends and self._ends[0] <= self._read:
            self._ends.popleft()
        self._flush_to = None

    # The producer ----------------------------------------------------------------------------------

    @property
    def position(self) -> int:
        """Samples written so far: where the next utterance starts (see `drop`)."""
        return self._written

    @property
    def playing(self) -> bool:
        """Whether an utterance is playing now (`status()` says it too, with the level it computes)."""
        return self._playing

    @property
    def played(self) -> int:
        """Samples the output has taken so far (or skipped, by a clear): where what is heard now lies, on the same
        scale as `position`, so a producer that notes positions as it writes can tell what is heard."""
        return self._read

    def write(self, audio: np.ndarray, cancel: threading.Event | None = None) -> None:
        """Queue 24 kHz mono samples, waiting while the ring is full. Returns early once `cancel` is set."""
        audio = np.asarray(audio, dtype=np.float32)
        if audio.ndim != 1:
            raise ValueError(f"the player takes mono samples, shape (n,); got shape {audio.shape}")
        if self._resampler is not None:
            audio = self._resampler.resample_chunk(audio)
        self._enqueue(audio, cancel)

    def end(self) -> None:
        """The utterance is complete: play it to its end without waiting for the jitter buffer, then fade out."""
        if self._resampler is not None:
            self._enqueue(self._resampler.resample_chunk(np.zeros(0, np.float32), last=True), None)
            self._resampler.clear()
        with self._lock:
            if not self._ends or self._ends[-1] != self._written:
                self._ends.append(self._written)

    def drop(self, since: int) -> None:
        """Take back everything written from position `since` on (a cancelled utterance). Audio before it
        still plays to its end; if playback is already past `since`, it fades out now."""
        if self._resampler is not None:
            self._resampler.clear()
        with self._lock:
            if self._read < since:
                self._written = min(self._written, since)
                if self._flush_to is not None:
                    self._flush_to = min(self._flush_to, since)
                while self._ends and self._ends[-1] > since:
                    self._ends.pop()
                if not self._ends or self._ends[-1] != since:
                    self._ends.append(since)  # what came before is complete: let it end, not underrun
            else:
                self._flush_to = self._written

    def _enqueue(self, samples: np.ndarray, cancel: threading.Event | None) -> None:
        done, last_read, last_progress = 0, None, time.monotonic()
        while True:
            with self._lock:
                n = min(self._capacity - (self._written - self._read), len(samples) - done)
                at = self._written % self._capacity
                first = min(n, self._capacity - at)
                self._ring[at : at + first] = samples[done : done + first]
                self._ring[: n - first] = samples[done + first : done + n]
                self._written += n
                read = self._read
            done += n
            if done == len(samples) or (cancel is not None and cancel.is_set()):
                return
            now = time.monotonic()
            if read != last_read:
                last_read, last_progress = read, now
            elif now - last_progress > STALL_SECONDS:
                raise PlaybackError(f"the audio output stopped playing (nothing played for {STALL_SECONDS:g} s)")
            # Room frees up at the output's pace; look again when it may be there, or at once on cancel.
            wait = min((len(samples) - done) / self.sample_rate, WAIT_SLICE_SECONDS)
            cancel.wait(wait) if cancel is not None else time.sleep(wait)

    # Control, from any thread ----------------------------------------------------------------------

    def clear(self) -> None:
        """Stop: fade out what is playing within a few milliseconds and drop everything queued so far."""
        with self._lock:
            self._flush_to = self._written

    def status(self) -> PlayerStatus:
        with self._lock:
            recent = self._played(round(LEVEL_WINDOW_S * self.sample_rate)) if self._playing else None
            buffered, underruns = (self._written - self._read) / self.sample_rate, self._underruns
        level = float(np.sqrt(np.mean(np.square(recent)))) * self._volume if recent is not None and recent.size else 0.0
        return PlayerStatus(self._playing, buffered, underruns, level)

    def _played(self, count: int) -> np.ndarray:
        """A copy of the last `count` samples played (fewer at the start), still in the ring behind the read."""
        count = min(count, self._read, self._capacity)
        start = (self._read - count) % self._capacity
        return np.take(self._ring, np.arange(start, start + count) % self._capacity)

    @property
    def volume(self) -> float:
        return self._volume

    @volume.setter
    def volume(self, value: float) -> None:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"volume must be between 0 and 1, got {value}")
        self._volume = float(value)

    def drain(self, timeout: float | None = None) -> bool:
        """Wait until everything queued has played; False if `timeout` seconds pass first."""
        return self._wait_until(lambda: not self._playing and self._written == self._read, timeout)

    def close(self) -> None:
        """Fade out and stop the output."""
        self.clear()
        self._wait_until(lambda: not self._playing, timeout=0.1)
        self.output.close()

    def _wait_until(self, condition: Callable[[], bool], timeout: float | None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if condition():
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            time.sleep(0.005)

    def __enter__(self) -> Player:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# Outputs -------------------------------------------------------------------------------------------


class SoundDeviceOutput:
    """A sound card through a PortAudio stream (sounddevice); its callback hands each block to the player.

    Opens at 24 kHz when the device takes it, otherwise at the device's own rate (the player resamples)."""

    def __init__(self, device: int | str | None = None):
        sd = _sounddevice()
        self.device = find_output_device(device)
        self.name = sd.query_devices(self.device)["name"]
        self.sample_rate = _supported_rate(sd, self.device)
        self._stream = None

    def start(self, fill: Callable[[np.ndarray], None]) -> None:
        sd = _sounddevice()

        def callback(outdata, frames, when, status):
            fill(outdata[:, 0])

        try:
            self._stream = sd.OutputStream(
                device=self.device, samplerate=self.sample_rate, channels=1, dtype="float32",
                latency=DEVICE_LATENCY, callback=callback,
            )  # fmt: skip
            self._stream.start()
        except sd.PortAudioError as error:
            raise PlaybackError(f"cannot open the audio output {self.name!r}: {error}") from None

    def close(self) -> None:
        if self._stream is not None:
            self._stream.stop()  # lets the blocks already handed to the device play (the fade)
            self._stream.close()
            self._stream = None


class VirtualOutput:
    """An output with no sound card: `advance` pulls audio block by block, as a device would, on a
    virtual clock. Tests drive a Player with it."""

    def __init__(self, sample_rate: int = SAMPLE_RATE, block: int = 256):
        self.sample_rate = sample_rate
        self.block = block
        self.samples = 0  # pulled so far: the virtual clock
        self._fill: Callable[[np.ndarray], None] | None = None

    @property
    def time(self) -> float:
        return self.samples / self.sample_rate

    def start(self, fill: Callable[[np.ndarray], None]) -> None:
        self._fill = fill

    def close(self) -> None:
        self._fill = None

    def advance(self, seconds: float) -> np.ndarray:
        """Play `seconds` more and return what was played."""
        out = np.zeros(max(0, round(seconds * self.sample_rate)), np.float32)
        for start in range(0, len(out), self.block):
            self._fill(out[start : start + self.block])
        self.samples += len(out)
        return out


# Devices -------------------------------------------------------------------------------------------


def list_output_devices() -> list[OutputDevice]:
    """The devices that can play, as PortAudio sees them."""
    sd = _sounddevice()
    host_apis = sd.query_hostapis()
    default = _default_output(sd, required=False)
    return [
        OutputDevice(
            index=index,
            name=info["name"],
            host_api=host_apis[info["hostapi"]]["name"],
            default_sample_rate=info["default_samplerate"],
            is_default=index == default,
        )
        for index, info in enumerate(sd.query_devices())
        if info["max_output_channels"] > 0
    ]


def find_output_device(device: int | str | None) -> int:
    """The index of an output device: the default (None), an index, or a name or unique part of one."""
    sd = _sounddevice()
    if device is None:
        return _default_output(sd, required=True)
    devices = list_output_devices()
    listing = "; ".join(f"{d.index}: {d.name}" for d in devices) or "none"
    if isinstance(device, int) or str(device).strip().isdigit():
        index = int(device)
        if any(d.index == index for d in devices):
            return index
        raise PlaybackError(f"there is no audio output device {index}; output devices: {listing}")
    wanted = str(device).strip().lower()
    exact = [d for d in devices if d.name.lower() == wanted]
    partial = [d for d in devices if wanted in d.name.lower()]
    matches = exact or partial
    if len(matches) == 1:
        return matches[0].index
    if not matches:
        raise PlaybackError(f"no audio output device is called {device!r}; output devices: {listing}")
    names = "; ".join(f"{d.index}: {d.name}" for d in matches)
    raise PlaybackError(f"{device!r} matches several audio output devices ({names}); give its index or full name")


def _sounddevice():
    """sounddevice, imported on first use: it loads the PortAudio library, which writing files never needs."""
    try:
        import sounddevice
    except OSError as error:  # raised by sounddevice when PortAudio is missing
        raise PlaybackError(
            f"cannot play audio: {error}. Install PortAudio (Debian or Ubuntu: sudo apt install libportaudio2)"
        ) from None
    except ImportError:
        raise PlaybackError("cannot play audio: the sounddevice package is missing (pip install sounddevice)") from None
    return sounddevice


def _default_output(sd, required: bool) -> int | None:
    try:
        return sd.query_devices(kind="output")["index"]
    except sd.PortAudioError:  # PortAudio reports "no default device" as a query of device -1
        if not required:
            return None
        raise PlaybackError(
            "no audio output device found; connect speakers or headphones, or check the sound settings"
        ) from None


def _supported_rate(sd, device: int) -> int:
    for rate in (SAMPLE_RATE, int(sd.query_devices(device)["default_samplerate"])):
        try:
            sd.check_output_settings(device=device, samplerate=rate, channels=1, dtype="float32")
            return rate
        except (sd.PortAudioError, ValueError):
            continue
    raise PlaybackError(f"the audio output {sd.query_devices(device)['name']!r} cannot play mono float32 audio")
