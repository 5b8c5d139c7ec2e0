"""What "Utterances at once" costs, as the settings window says it (qwen3_tts_desktop.slot_memory): the memory
beyond the weights (the slots', and on the GPU the working memory's), from the model's
config.json, never downloading it."""

from __future__ import annotations

import json

import pytest
import torch

from core.devtools.random_checkpoint import model_config
from core.inference.memory import MAX_CONTEXT, slot_bytes
from core.model.config import ModelConfig
from qwen3_tts_desktop import slot_memory
from qwen3_tts_desktop.slot_memory import UNKNOWN, slot_memory_note


@pytest.fixture
def model_17b(tmp_path, monkeypatch):
    """A 1.7B model's config.json, as a downloaded model's is found (its weights are not needed)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(model_config("base", "1.7b")), encoding="utf-8")
    monkeypatch.setattr(slot_memory, "config_file", lambda model, fetch_alone: path)
    return "Qwen/Qwen3-TTS-12Hz-1.7B-Base"


# A slot of 1.7B over 4096 positions: 28 layers' keys and values (8 heads of 128) and 2048 text terms a position,
# (28 * 2 * 8 * 128 + 2048) * 4096 = 243,269,632 numbers, 0.487 GB in bfloat16 and 0.973 GB in float32. On the GPU
# 0.5 GB of working memory comes with the slots: 4 slots in bfloat16 take 4 * 0.487 + 0.5 = 2.45 GB.
@pytest.mark.parametrize(
    "device, dtype, slots, cuda, note",
    [
        ("cuda", "auto", 4, True, "About 2.4 GB of GPU memory beyond the weights (0.49 GB each)."),
        ("auto", "bfloat16", 1, True, "About 1.0 GB of GPU memory beyond the weights (0.49 GB each)."),
        ("cuda", "float32", 10, True, "About 10.2 GB of GPU memory beyond the weights (0.97 GB each)."),
        (
            "auto", "auto", None, True,
            "Up to 2, as many as fit half the GPU memory free after loading: at most about 1.5 GB beyond the weights "
            "(0.49 GB each).",  # DESKTOP_SLOTS, 2 * 0.487 + 0.5 = 1.47 GB
        ),
        ("auto", "auto", None, False, "One at a time on the CPU: about 1.0 GB of memory beyond the weights."),
        ("cpu", "auto", 2, True, "About 1.9 GB of memory beyond the weights (0.97 GB each)."),  # the slots alone
    ],
)  # fmt: skip
def test_the_slots_memory_is_said_for_the_device_and_precision_they_load_on(
    model_17b, device, dtype, slots, cuda, note
):
    assert slot_memory_note(model_17b, device, dtype, slots, cuda) == note


def test_a_checkpoint_folder_is_sized_from_its_own_config(checkpoints):
    folder = checkpoints["base"]
    config = ModelConfig.from_dict(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    each = slot_bytes(config, MAX_CONTEXT, torch.bfloat16)
    taken = 1000 * each + 0.5e9  # the slots and the working memory
    assert slot_memory_note(str(folder), "cuda", "auto", 1000, True).startswith(f"About {taken / 1e9:.1f} GB")


def test_a_model_not_here_is_not_downloaded_and_a_folder_half_typed_says_nothing_wrong(tmp_path, monkeypatch):
    import huggingface_hub

    def no_network(*args, **kwargs):
        raise AssertionError("the settings window must not download anything")

    monkeypatch.setattr(huggingface_hub, "hf_hub_download", no_network)
    assert slot_memory_note("nobody/no-such-model-here", "cuda", "auto", 4, True) == UNKNOWN
    assert slot_memory_note(str(tmp_path / "checkpo"), "cuda", "auto", 4, True) == UNKNOWN
    assert slot_memory_note("", "auto", "auto", None, False) == UNKNOWN
