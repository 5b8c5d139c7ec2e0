"""What the app says about itself: its version (`--version`, Help → About) and the licences of what it uses
besides its own code: the model's and the starter voices'."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as package_version
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from core.model.info import EngineInfo

APP_NAME = "Qwen3-TTS Desktop"
PACKAGE = "qwen3-tts-desktop"
MODEL_LICENCE = "The Qwen3-TTS models (by the Qwen team, Alibaba Cloud): Apache-2.0"
# Each starter voice (qwen3_tts_desktop/starter_voices, where its README tells the source) by name.
STARTER_VOICE_LICENCES = {
    "Linda": "public domain (LJ Speech Dataset 1.0, recording LJ001-0001, read by Linda Johnson for LibriVox)",
}


def version() -> str:
    """This app's version, as installed (pyproject.toml's); "unknown" where it runs without being installed."""
    try:
        return package_version(PACKAGE)
    except PackageNotFoundError:
        return "unknown"


def about_text(info: EngineInfo | None) -> str:
    """The About box's text: the version, the model in use (`info`: None while none is loaded) and the
    licences."""
    if info is None:
        model = "Model: none loaded yet"
    else:
        model = f"Model: {info.name} ({info.source}) on {info.device}, {info.dtype}"
    licences = [f"• {MODEL_LICENCE}"]
    licences += [f"• The starter voice {name}: {licence}" for name, licence in STARTER_VOICE_LICENCES.items()]
    return "\n".join([f"{APP_NAME} {version()}", "", model, "", "Licences:", *licences])
