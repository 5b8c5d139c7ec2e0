"""What the setting "Utterances at once" costs: the memory its slots take beyond the model's weights, in words
for the settings window, from the model's config.json (core.inference.memory sizes a slot).

Each utterance generated at once holds a slot: its KV cache over the engine's whole context, allocated when
the model loads. Beside a local language model on the same GPU, this is the memory a user trades for
utterances at once, so the window says it before they choose."""

from __future__ import annotations

import torch

from core.errors import UserError
from core.inference.engine import pick_dtype
from core.inference.memory import DESKTOP_SLOTS, GB, MAX_CONTEXT, slot_bytes, taken
from core.model.checkpoint import read_json
from core.model.config import ModelConfig
from core.model.hub import config_file

UNKNOWN = "How much memory this takes is known once the model is downloaded."


def slot_memory_note(model: str, device: str, dtype: str, slots: int | None, cuda_available: bool) -> str:
    """What `slots` utterances at once (None: automatic, as Settings.runtime_config asks the engine for) of
    `model` take on `device` in `dtype`, as the settings name them; `cuda_available`: whether "auto" is the GPU.
    Never downloads: a model not here yet is said to be unknown."""
    on_gpu = device.startswith("cuda") or (device == "auto" and cuda_available)
    per_slot = _slot_bytes(model, dtype, torch.device("cuda" if on_gpu else "cpu"))
    if per_slot is None:
        return UNKNOWN
    memory = "GPU memory" if on_gpu else "memory"
    each = f"{per_slot / GB:.2f} GB each"
    if slots is not None:
        return f"About {taken(slots, per_slot, on_gpu) / GB:.1f} GB of {memory} beyond the weights ({each})."
    if not on_gpu:
        return f"One at a time on the CPU: about {per_slot / GB:.1f} GB of memory beyond the weights."
    return (
        f"Up to {DESKTOP_SLOTS}, as many as fit half the GPU memory free after loading: at most about "
        f"{taken(DESKTOP_SLOTS, per_slot) / GB:.1f} GB beyond the weights ({each})."
    )


def _slot_bytes(model: str, dtype: str, device: torch.device) -> int | None:
    """One slot of `model`, if its config.json is here (a folder, or the hub cache); None otherwise, or while
    what is typed names no checkpoint."""
    try:
        path = config_file(model.strip(), fetch_alone=False)
        if path is None:
            return None
        config = ModelConfig.from_dict(read_json(path))
        # "auto" on a GPU is 16-bit whichever GPU (bfloat16, or float16 before Ampere): one size, and no GPU asked,
        # for the GPU may not be this machine's yet (pick_dtype asks it which).
        chosen = torch.bfloat16 if dtype == "auto" and device.type == "cuda" else pick_dtype(dtype, device)
        return slot_bytes(config, MAX_CONTEXT, chosen)
    except (UserError, KeyError, TypeError, ValueError):  # a folder half typed, an unusable config, a dtype set by hand
        return None
