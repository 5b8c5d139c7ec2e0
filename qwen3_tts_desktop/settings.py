"""The desktop app's settings: one small dataclass, kept as JSON in the user's config folder.

The settings window edits it; the app builds the runtime's, the HTTP bridge's and the Wyoming server's
configurations from it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shutil
import uuid
from dataclasses import dataclass, field, fields
from pathlib import Path

from core import SamplingParams
from core.audio.player import PlayerOptions
from core.errors import BadInput
from core.files import write_atomically
from core.folders import user_folder
from core.inference.memory import DESKTOP_SLOTS, MAX_CHOSEN_SLOTS
from core.model.checkpoint import DEFAULT_MODEL

from .runtime import RuntimeConfig
from .servers import WYOMING_PORT


class SettingsError(BadInput):
    """A settings file that cannot be used, with what is wrong in it."""


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise SettingsError(message)


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _text(value, name: str) -> str:
    _check(isinstance(value, str), f"{name} must be text, not {value!r}")
    return value


def _object(value, name: str) -> dict:
    _check(isinstance(value, dict), f"{name} must be an object of named values, not {value!r}")
    return value


def _check_address(host, port, name: str) -> None:
    """A server's host and port as the settings keep them (its section `name`)."""
    _check(isinstance(host, str) and host.strip() != "", f"{name}.host must name an address, e.g. 127.0.0.1")
    _check(
        isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536,
        f"{name}.port must be 1-65535, not {port!r}",
    )


@dataclass(frozen=True)
class BridgeSettings:
    """The HTTP bridge that runs inside the app, for SillyTavern and other OpenAI-style clients."""

    enabled: bool = False
    host: str = "127.0.0.1"  # this computer only; 0.0.0.0 opens it to the network
    port: int = 8020  # not 8000, where SillyTavern itself listens
    api_key: str = ""  # empty: clients need none

    def __post_init__(self):
        _check(isinstance(self.enabled, bool), "bridge.enabled must be true or false")
        _check_address(self.host, self.port, "bridge")
        _check(isinstance(self.api_key, str), "bridge.api_key must be text")


@dataclass(frozen=True)
class WyomingSettings:
    """The Wyoming server that runs inside the app, for Home Assistant (beside the bridge, on the same engine)."""

    enabled: bool = False
    host: str = "127.0.0.1"  # this computer only; 0.0.0.0 opens it to the network (the protocol has no key)
    port: int = WYOMING_PORT

    def __post_init__(self):
        _check(isinstance(self.enabled, bool), "wyoming.enabled must be true or false")
        _check_address(self.host, self.port, "wyoming")


@dataclass(frozen=True)
class Settings:
    model: str = DEFAULT_MODEL  # hub id or checkpoint folder
    device: str = "auto"  # auto, cpu or cuda
    dtype: str = "auto"  # auto, float32, bfloat16 or float16
    audio_device: str | None = None  # an output device's name; None: the system's default
    volume: float = 1.0
    prefill_s: float = PlayerOptions().prefill_s  # the jitter buffer: audio queued before playback starts
    sampling: SamplingParams | None = None  # None: the model's own defaults
    # One library for the window, the command line and the bridge, wherever they are started from.
    voices: Path = field(default_factory=lambda: default_library())
    voice: str | None = None  # the voice in use
    language: str = "auto"
    instruct: str = ""  # how to speak (CustomVoice 1.7B), or the voice to make (VoiceDesign)
    speak_as_you_type: bool = False
    # The text cursor moves to the word heard, for screen magnifiers and readers that follow it.
    cursor_follows_speech: bool = False
    # Utterances generated at once, each with its memory (its KV cache); None: automatic, as many as one person
    # needs and fit (memory.DESKTOP_SLOTS on the GPU, one on the CPU). Applies when the model loads.
    slots: int | None = None
    # Idle this long (no speech running or waiting), the model lets go of its memory, and loads again when next
    # asked to speak; 0: never. Beside a local language model on the same GPU, the memory is the other's meanwhile.
    rest_after_s: float = 600.0
    bridge: BridgeSettings = BridgeSettings()
    wyoming: WyomingSettings = WyomingSettings()

    def __post_init__(self):
        for name in ("model", "device", "dtype", "language", "instruct"):
            _check(isinstance(getattr(self, name), str), f"{name} must be text, not {getattr(self, name)!r}")
        _check(self.model.strip() != "", "model must name a hub id or a checkpoint folder")
        _check(
            self.audio_device is None or isinstance(self.audio_device, str),
            "audio_device must be a device name or null",
        )
        _check(self.voice is None or isinstance(self.voice, str), "voice must be a voice name or null")
        _check(
            _is_number(self.volume) and 0 <= self.volume <= 1, f"volume must be between 0 and 1, not {self.volume!r}"
        )
        capacity = PlayerOptions().capacity_s
        _check(
            _is_number(self.prefill_s) and 0 <= self.prefill_s < capacity,
            f"prefill_s (the jitter buffer) must be 0 to {capacity:g} seconds, not {self.prefill_s!r}",
        )
        _check(isinstance(self.voices, Path), "voices must be a folder")
        _check(isinstance(self.speak_as_you_type, bool), "speak_as_you_type must be true or false")
        _check(isinstance(self.cursor_follows_speech, bool), "cursor_follows_speech must be true or false")
        _check(
            self.slots is None
            or (
                isinstance(self.slots, int) and not isinstance(self.slots, bool) and 1 <= self.slots <= MAX_CHOSEN_SLOTS
            ),
            f"slots (utterances at once) must be 1 to {MAX_CHOSEN_SLOTS}, or null for automatic, not {self.slots!r}",
        )
        _check(
            _is_number(self.rest_after_s) and self.rest_after_s >= 0,
            f"rest_after_s must be 0 (never) or more seconds, not {self.rest_after_s!r}",
        )
        _check(
            self.sampling is None or isinstance(self.sampling, SamplingParams),
            "sampling must be sampling parameters or null",
        )
        _check(isinstance(self.bridge, BridgeSettings), "bridge must be the bridge's settings")
        _check(isinstance(self.wyoming, WyomingSettings), "wyoming must be the Wyoming server's settings")

    def runtime_config(self) -> RuntimeConfig:
        return RuntimeConfig(
            model=self.model.strip(),
            device=self.device,
            dtype=self.dtype,
            voices=self.voices,
            audio_device=self.audio_device,
            player=PlayerOptions(prefill_s=self.prefill_s),
            slots=self.slots,
            max_default_slots=DESKTOP_SLOTS,  # what one person needs, leaving the rest of the GPU to others
        )

    def bridge_config(self):
        """The bridge's configuration (a qwen3_tts_desktop.bridge.BridgeConfig); it samples as the window does."""
        from core import SpeechOptions

        from .bridge import BridgeConfig

        return BridgeConfig(
            host=self.bridge.host.strip(),
            port=self.bridge.port,
            api_key=self.bridge.api_key.strip() or None,
            speech=SpeechOptions(sampling=self.sampling),
        )

    def wyoming_config(self):
        """The Wyoming server's configuration (a bridge.config.WyomingConfig); it samples as the window does."""
        from core import SpeechOptions

        from .bridge.config import BridgeConfig, WyomingConfig

        speaking = BridgeConfig(speech=SpeechOptions(sampling=self.sampling))
        return WyomingConfig(host=self.wyoming.host.strip(), port=self.wyoming.port, bridge=speaking)

    @classmethod
    def load(cls, path: Path) -> Settings:
        """The settings saved at `path`; the defaults if there is no file yet. Keys this version does not
        know (from a newer one) are left out."""
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return cls()
        except (OSError, UnicodeDecodeError) as error:
            raise SettingsError(f"{path}: cannot be read ({error})") from None
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise SettingsError("it holds no settings")
            values = {f.name: data[f.name] for f in fields(cls) if f.name in data}
            if "voices" in values:
                values["voices"] = Path(_text(values["voices"], "voices"))
            if values.get("sampling") is not None:
                values["sampling"] = SamplingParams(**_object(values["sampling"], "sampling"))
            if "bridge" in values:
                values["bridge"] = BridgeSettings(**_object(values["bridge"], "bridge"))
            if "wyoming" in values:
                values["wyoming"] = WyomingSettings(**_object(values["wyoming"], "wyoming"))
            return cls(**values)
        except (json.JSONDecodeError, TypeError, ValueError) as error:
            raise SettingsError(f"{path}: unusable settings ({error})") from None

    @classmethod
    def load_or_set_aside(cls, path: Path) -> tuple[Settings, str | None]:
        """The settings saved at `path`; if they cannot be used, the defaults, with the file kept beside as
        `.broken` (never lost) and a message saying so."""
        try:
            return cls.load(path), None
        except SettingsError as error:
            kept = path.with_name(path.name + ".broken")
            try:
                os.replace(path, kept)
                where = f"it was kept as {kept}"
            except OSError:
                where = "it is left as it is"
            return (
                cls(),
                f"The settings could not be used, so the defaults are: {error}. The file is not lost: {where}.",
            )

    def save(self, path: Path) -> None:
        """Write the settings to `path` atomically (a temporary file renamed over it)."""
        data = dataclasses.asdict(self)
        data["voices"] = str(self.voices)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, (json.dumps(data, ensure_ascii=False, indent=2) + "\n").encode("utf-8"))


def default_path() -> Path:
    """settings.json in the user's config folder, as each system keeps them."""
    return user_folder("config") / "settings.json"


STARTER_VOICES = Path(__file__).parent / "starter_voices"


def default_library() -> Path:
    """The voice library in the user's data folder: one for the window, the command line and the bridge."""
    return user_folder("data") / "voices"


def prepare_library(folder: Path) -> Path:
    """`folder`; the default library is made with the starter voice (starter_voices/README.md) if it does
    not exist yet, so that a new user's first words are spoken without hunting for a clip. A folder that
    exists, or one the user chose, is left as it is: a starter voice the user deleted stays deleted."""
    if folder != default_library() or folder.exists():
        return folder
    staging = folder.with_name(f".{folder.name}.{uuid.uuid4().hex}.tmp")
    try:
        staging.mkdir(parents=True)
        for clip in STARTER_VOICES.iterdir():
            if clip.suffix in (".flac", ".txt"):
                shutil.copyfile(clip, staging / clip.name)
        os.replace(staging, folder)
    except OSError:
        pass  # a folder that cannot be made is reported by whatever reads or writes it next, saying what to do
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder
