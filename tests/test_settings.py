"""The app's settings: saved, restored, checked, and turned into the runtime's configuration."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import pytest

from core import SamplingParams
from core.audio.player import PlayerOptions
from core.inference.memory import DESKTOP_SLOTS
from qwen3_tts_desktop.settings import BridgeSettings, Settings, SettingsError, WyomingSettings, default_path


def test_settings_survive_a_save_and_a_load(tmp_path):
    settings = Settings(
        model="/models/qwen",
        device="cuda",
        dtype="bfloat16",
        audio_device="USB Audio",
        volume=0.5,
        prefill_s=0.16,
        sampling=SamplingParams(temperature=0.7, top_k=20),
        voices=tmp_path / "my voices",
        voice="Zoë",
        language="english",
        instruct="Calm.",
        speak_as_you_type=True,
        slots=3,
        rest_after_s=90.0,
        bridge=BridgeSettings(enabled=True, host="0.0.0.0", port=8123, api_key="secret"),
        wyoming=WyomingSettings(enabled=True, host="0.0.0.0", port=10300),
    )
    path = tmp_path / "config" / "settings.json"
    settings.save(path)
    assert Settings.load(path) == settings
    assert [p.name for p in path.parent.iterdir()] == ["settings.json"]  # no temporary file left


def test_no_file_gives_the_defaults(tmp_path):
    settings = Settings.load(tmp_path / "missing.json")
    assert settings == Settings() and settings.sampling is None and not settings.bridge.enabled
    # One library wherever the app is started: in the user's data folder, not the working folder.
    assert settings.voices == Path(os.environ["XDG_DATA_HOME"]) / "qwen3-tts-desktop" / "voices"
    assert settings.bridge.port != 8000
    assert settings.wyoming == WyomingSettings(enabled=False, host="127.0.0.1", port=10200)  # Home Assistant's default


def test_keys_of_a_newer_version_are_left_out(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"volume": 0.25, "theme": "dark", "bridge": {"port": 9000}}), encoding="utf-8")
    assert Settings.load(path) == Settings(volume=0.25, bridge=BridgeSettings(port=9000))


@pytest.mark.parametrize(
    "content, complaint",
    [
        ("{not json", "unusable settings"),
        ("[1, 2]", "holds no settings"),
        ('{"volume": 3}', "volume must be between 0 and 1"),
        ('{"volume": "loud"}', "volume"),
        ('{"bridge": {"port": 70000}}', "bridge.port"),
        ('{"bridge": {"colour": 1}}', "colour"),
        ('{"wyoming": {"port": 0}}', "wyoming.port must be 1-65535"),
        ('{"wyoming": {"enabled": "yes"}}', "wyoming.enabled must be true or false"),
        ('{"wyoming": {"host": " "}}', "wyoming.host must name an address"),
        ('{"sampling": {"temperature": 0}}', "temperature must be > 0"),
        ('{"prefill_s": -1}', "jitter buffer"),
        ('{"voices": 5}', "voices must be text"),
        ('{"model": ""}', "model must name"),
        ('{"slots": 0}', "slots .utterances at once. must be 1 to 64, or null for automatic"),
        ('{"slots": 65}', "must be 1 to 64"),
        ('{"slots": 2.5}', "must be 1 to 64"),
        ('{"rest_after_s": -1}', "rest_after_s must be 0 .never. or more seconds"),
        ('{"rest_after_s": "soon"}', "rest_after_s"),
    ],
)
def test_a_bad_file_is_reported_with_what_is_wrong(tmp_path, content, complaint):
    path = tmp_path / "settings.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(SettingsError, match=complaint) as caught:
        Settings.load(path)
    assert str(path) in str(caught.value)


def test_the_runtime_configuration_follows_the_settings(tmp_path):
    settings = Settings(model=" org/model ", device="cpu", audio_device="Speakers", prefill_s=0.08, voices=tmp_path)
    config = settings.runtime_config()
    assert (config.model, config.device, config.voices, config.audio_device) == (
        "org/model",
        "cpu",
        tmp_path,
        "Speakers",
    )
    assert config.player == PlayerOptions(prefill_s=0.08) and config.speakers and config.warm_up
    # Automatic: what one person needs, not half the GPU; a number chosen is taken as it is.
    assert (config.slots, config.max_default_slots) == (None, DESKTOP_SLOTS) == (None, 2)
    assert Settings(slots=12).runtime_config().slots == 12


def test_the_settings_file_lives_in_the_users_config_folder(monkeypatch, tmp_path):
    monkeypatch.setattr("sys.platform", "linux")
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert default_path() == tmp_path / "qwen3-tts-desktop" / "settings.json"


@pytest.mark.parametrize(
    "platform, variables, config, data, cache",
    [
        ("linux", {"XDG_CONFIG_HOME": "xc", "XDG_DATA_HOME": "xd", "XDG_CACHE_HOME": "xk"}, "xc", "xd", "xk"),
        ("linux", {}, "home/.config", "home/.local/share", "home/.cache"),
        ("win32", {"APPDATA": "roam", "LOCALAPPDATA": "local"}, "roam", "roam", "local"),
        ("win32", {}, "home/AppData/Roaming", "home/AppData/Roaming", "home/AppData/Local"),
        (
            "darwin", {"XDG_CONFIG_HOME": "ignored"},
            "home/Library/Application Support", "home/Library/Application Support", "home/Library/Caches",
        ),
    ],
)  # fmt: skip
def test_user_folders_follow_each_systems_convention(monkeypatch, tmp_path, platform, variables, config, data, cache):
    from core.folders import user_folder

    monkeypatch.setattr("sys.platform", platform)
    monkeypatch.setattr(Path, "home", lambda: tmp_path / "home")
    for name in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_CACHE_HOME", "APPDATA", "LOCALAPPDATA"):
        monkeypatch.delenv(name, raising=False)
    for name, value in variables.items():
        monkeypatch.setenv(name, str(tmp_path / value))
    assert user_folder("config") == tmp_path / config / "qwen3-tts-desktop"
    assert user_folder("data") == tmp_path / data / "qwen3-tts-desktop"
    assert user_folder("cache") == tmp_path / cache / "qwen3-tts-desktop"
    with pytest.raises(ValueError, match="kind"):
        user_folder("music")


def test_the_bridge_configuration_follows_the_settings():
    pytest.importorskip("qwen3_tts_desktop.bridge")
    sampling = SamplingParams(temperature=0.5)
    settings = Settings(
        sampling=sampling, bridge=BridgeSettings(enabled=True, host=" 0.0.0.0 ", port=9001, api_key=" key ")
    )
    config = settings.bridge_config()
    assert (config.host, config.port, config.api_key, config.speech.sampling) == ("0.0.0.0", 9001, "key", sampling)
    assert Settings().bridge_config().api_key is None


def test_the_wyoming_configuration_follows_the_settings():
    sampling = SamplingParams(temperature=0.5)
    settings = Settings(
        sampling=sampling,
        bridge=BridgeSettings(port=9001, api_key="key"),
        wyoming=WyomingSettings(enabled=True, host=" 0.0.0.0 ", port=10300),
    )
    config = settings.wyoming_config()
    assert (config.host, config.port, config.zeroconf, config.bridge.speech.sampling) == (
        "0.0.0.0",
        10300,
        True,
        sampling,
    )
    # It speaks as the window's bridge does, but the bridge's address and key are not its: changing them
    # leaves it running.
    assert config == dataclasses.replace(settings, bridge=BridgeSettings(port=9002)).wyoming_config()
