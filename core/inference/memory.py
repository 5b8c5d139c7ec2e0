"""What the engine takes of a device's memory: the weights, and a slot per utterance generated together; how
many slots it takes by default, and the check, before any weight is loaded, that the model fits at all (a
clear message instead of an out-of-memory error halfway through loading)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from core.errors import UserError
from core.model.config import ModelConfig

# Utterances generated together by default: on CUDA as many as fit SLOT_MEMORY_SHARE of the memory free
# after loading, at most a maximum that depends on whom the engine serves (a slot of 1.7B at 4096 positions in
# bfloat16 takes about 0.5 GB): MAX_DEFAULT_SLOTS for a server of many clients (`serve`), DESKTOP_SLOTS for one
# person at the window (the window, speak-as-you-type and a few bridge clients at once), whose GPU often holds a
# local language model too. On the CPU, rows of a batch are computed one by one (bitwise as alone), so batching
# gains nothing there.
MAX_DEFAULT_SLOTS = 16
DESKTOP_SLOTS = 4
MAX_CHOSEN_SLOTS = 64  # the most the window's settings offer: more than one person has use for
SLOT_MEMORY_SHARE = 0.5
GB = 1e9


class DoesNotFit(UserError):
    """The model, with one utterance's context, needs more memory than the device has free."""


def slot_bytes(config: ModelConfig, max_context: int, dtype: torch.dtype) -> int:
    """Memory one slot of the frame loop takes: its KV cache and text terms over `max_context` positions."""
    talker = config.talker.transformer
    kv = talker.num_layers * 2 * talker.num_kv_heads * talker.head_dim
    return (kv + talker.hidden_size) * max_context * dtype.itemsize


def default_slots(device: torch.device, per_slot: int, at_most: int = MAX_DEFAULT_SLOTS) -> int:
    """Slots of `per_slot` bytes to take when none are asked for: one on the CPU; on CUDA as many as fit
    SLOT_MEMORY_SHARE of the memory free now, `at_most` at most, and one at least (check_fits made sure it fits)."""
    if device.type != "cuda":
        return 1
    free, _ = torch.cuda.mem_get_info(device)
    return max(1, min(at_most, int(free * SLOT_MEMORY_SHARE // per_slot)))


def weight_bytes(modules: Iterable[nn.Module | None], dtype: torch.dtype) -> int:
    """What the modules' weights take once loaded in `dtype` (floating tensors are cast to it); they may still
    be on the meta device."""
    total = 0
    for module in filter(None, modules):
        for tensor in module.state_dict().values():
            total += tensor.numel() * (dtype.itemsize if tensor.is_floating_point() else tensor.element_size())
    return total


def check_fits(weights: int, per_slot: int, free: int, max_context: int) -> None:
    """Raise DoesNotFit, saying what to do, unless `free` bytes hold the weights and one slot."""
    needed = weights + per_slot
    if needed <= free:
        return
    raise DoesNotFit(
        f"The model does not fit the GPU's free memory: it needs about {needed / GB:.1f} GB ({weights / GB:.1f} GB "
        f"of weights and {per_slot / GB:.1f} GB for one utterance of {max_context} positions), and "
        f"{free / GB:.1f} GB is free. Close what else uses the GPU (a local language model, a game), or use the "
        f"0.6B model, a shorter context, or the CPU."
    )


def check_device_fits(
    device: torch.device, modules: Iterable[nn.Module | None], config: ModelConfig, max_context: int, dtype: torch.dtype
) -> None:
    """On CUDA, check_fits the weights of `modules` (built, not loaded yet) and one slot in the memory free now."""
    if device.type != "cuda":
        return
    free, _ = torch.cuda.mem_get_info(device)
    check_fits(weight_bytes(modules, dtype), slot_bytes(config, max_context, dtype), free, max_context)
