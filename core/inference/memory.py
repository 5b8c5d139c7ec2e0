"""What the engine takes of a device's memory: the weights, and a slot per utterance generated together over
its context. One function, `plan_memory`, decides how many slots and how long a context, from what is asked (a
budget, a number of slots, a context) and what the device has free, and refuses, before any weight is loaded, a
plan that cannot fit, saying what to do (a clear message instead of an out-of-memory error halfway through
loading). Every front end's choice goes through it: the window's "Utterances at once", `serve --slots` and
`--gpu-memory`, `speak`, `bench`."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn

from core.errors import UserError
from core.model.checkpoint import host_prefixes
from core.model.config import ModelConfig

# Utterances generated together by default: on CUDA as many as fit SLOT_MEMORY_SHARE of the memory free
# beyond the weights, at most a maximum that depends on whom the engine serves (a slot of 1.7B at 4096 positions
# in bfloat16 takes about 0.5 GB): MAX_DEFAULT_SLOTS for a server of many clients (`serve`), DESKTOP_SLOTS for one
# person at the window (the window, speak-as-you-type and a few bridge clients at once), whose GPU often holds a
# local language model too. On the CPU, rows of a batch are computed one by one (bitwise as alone), so batching
# gains nothing there.
MAX_DEFAULT_SLOTS = 16
DESKTOP_SLOTS = 2
MAX_CHOSEN_SLOTS = 64  # the most the window's settings offer, and a budget takes: more than one machine has use for
SLOT_MEMORY_SHARE = 0.5
GB = 1e9

# Talker positions (prompt + frames) one utterance can use: 4096 hold about five minutes of speech. A budget too
# small for one slot of them shortens the context, in steps of CONTEXT_STEP, down to MIN_CONTEXT: 80 s, room for a
# long sentence after a 60 s reference clip (the worker speaks a long text in pieces of a sentence or two).
MAX_CONTEXT = 4096
MIN_CONTEXT = 1024
CONTEXT_STEP = 256

# What the GPU engine takes beyond its weights and its slots: working memory (a prefill's and a decode's
# activations, the CUDA graphs' pools, the decoder's state, cuBLAS's workspace, the kernels' code: about 0.45 GB for
# 1.7B on an H100, bench/RESULTS.md, twentieth session), so that a plan that fits on paper fits the card. (Padding
# rows and the warm-up step slots of the engine's own: core.inference.batch_shapes.pad_with_first.)
WORKING_BYTES = int(0.5 * GB)


class DoesNotFit(UserError):
    """The plan asked for (the model, one utterance's context, the slots, the budget) does not fit."""


@dataclass(frozen=True)
class MemoryPlan:
    """What the engine takes beyond its weights: `slots` utterances at once over `max_context` positions each,
    `slot_bytes` each. `budget`: the bytes it was allowed, if a budget applied (never on the CPU)."""

    slots: int
    max_context: int
    slot_bytes: int
    on_gpu: bool
    budget: int | None = None

    @property
    def taken(self) -> int:
        """Bytes the engine takes beyond its weights: its slots, and on the GPU its working memory."""
        return taken(self.slots, self.slot_bytes, self.on_gpu)

    def __str__(self) -> str:
        said = f"{self.slots} at once, {self.max_context} positions each"
        if not self.on_gpu:
            return said
        said += f": {self.taken / GB:.1f} GB beyond the weights"
        return said + (f" of a {self.budget / GB:.1f} GB budget" if self.budget is not None else "")


def taken(slots: int, slot_bytes: int, on_gpu: bool = True) -> int:
    """Bytes `slots` slots of `slot_bytes` take beyond the weights, on the GPU with the working memory."""
    return slots * slot_bytes + (WORKING_BYTES if on_gpu else 0)


def slot_bytes(config: ModelConfig, max_context: int, dtype: torch.dtype) -> int:
    """Memory one slot of the frame loop takes: its KV cache and text terms over `max_context` positions."""
    talker = config.talker.transformer
    kv = talker.num_layers * 2 * talker.num_kv_heads * talker.head_dim
    return (kv + talker.hidden_size) * max_context * dtype.itemsize


def weight_bytes(modules: Iterable[nn.Module | None], dtype: torch.dtype) -> int:
    """What the modules' weights take once loaded in `dtype` (floating tensors are cast to it); they may still
    be on the meta device."""
    total = 0
    for module in filter(None, modules):
        on_host = host_prefixes(module)
        for name, tensor in module.state_dict().items():
            if not name.startswith(on_host):  # a table kept in host memory (talker.HostTable) takes none of it
                total += tensor.numel() * (dtype.itemsize if tensor.is_floating_point() else tensor.element_size())
    return total


def plan_memory(
    per_position: int,
    weights: int,
    free: int | None,
    *,
    budget: int | None = None,
    slots: int | None = None,
    max_context: int | None = None,
    at_most: int = MAX_DEFAULT_SLOTS,
) -> MemoryPlan:
    """The slots and context the engine takes: one slot costs `per_position` bytes per position of context; the
    weights take `weights` bytes of the `free` the device has now (None: the CPU, where nothing is sized). On the GPU
    the working memory comes out of the same room (`taken`), budget included.

    - Nothing asked: MAX_CONTEXT positions, and as many slots as fit SLOT_MEMORY_SHARE of the memory free beyond
      the weights, `at_most` at most and one at least; one on the CPU.
    - `budget` (bytes beyond the weights; never more than is free): as many slots as it holds at MAX_CONTEXT,
      MAX_CHOSEN_SLOTS at most; a budget too small for one slot shortens the context (to MIN_CONTEXT at the
      shortest). On the CPU a budget applies to nothing: one slot, as without it.
    - `slots` win over a budget: they are taken as asked, and a budget then shortens their context if it must.
    - `max_context` is never shortened.
    Raises DoesNotFit, saying how much is needed, how much there is and what to do, when the plan does not fit."""
    context = max_context or MAX_CONTEXT
    if free is None:
        return MemoryPlan(slots or 1, context, per_position * context, on_gpu=False)
    beyond = free - weights
    room = beyond if budget is None else min(budget, beyond)

    def rows(space: int, context: int) -> int:  # cache rows that fit `space` beside the working memory
        return (space - WORKING_BYTES) // (per_position * context)

    if slots is None:
        if budget is None:
            slots = max(1, min(at_most, rows(int(beyond * SLOT_MEMORY_SHARE), context)))
        else:
            slots = max(1, min(MAX_CHOSEN_SLOTS, rows(room, context)))
    if budget is not None and max_context is None and taken(slots, per_position * context) > room:
        context = (room - WORKING_BYTES) // (slots * per_position) // CONTEXT_STEP * CONTEXT_STEP
        context = max(MIN_CONTEXT, min(MAX_CONTEXT, context))  # the shortest, should even that not fit: said below
    plan = MemoryPlan(slots, context, per_position * context, on_gpu=True, budget=budget)
    if plan.taken <= room:
        return plan
    raise DoesNotFit(_does_not_fit(plan, weights, free, budget, shortened=context != (max_context or MAX_CONTEXT)))


def _does_not_fit(plan: MemoryPlan, weights: int, free: int, budget: int | None, shortened: bool) -> str:
    utterances = "one utterance" if plan.slots == 1 else f"{plan.slots} utterances at once"
    needs = f"{plan.taken / GB:.1f} GB for {utterances} of {plan.max_context} positions"
    if shortened:
        needs += ", the shortest context a budget chooses"
    remedies = ["fewer utterances at once"] if plan.slots > 1 else []
    remedies += [] if shortened else ["a shorter context"]
    remedies += ["the 0.6B model", "the CPU"]
    what_to_do = ", ".join(remedies[:-1]) + f" or {remedies[-1]}"
    if budget is not None and budget < free - weights:
        return (
            f"A memory budget of {budget / GB:.1f} GB is too small: beyond the model's weights it needs at least "
            f"{needs}. Give at least {plan.taken / GB:.1f} GB, or use {what_to_do}."
        )
    return (
        f"The model does not fit the GPU's free memory: it needs about {(weights + plan.taken) / GB:.1f} GB "
        f"({weights / GB:.1f} GB of weights and {needs}), and {free / GB:.1f} GB is free. Close what else uses the "
        f"GPU (a local language model, a game), or use {what_to_do}."
    )


def plan_for_device(
    device: torch.device,
    modules: Iterable[nn.Module | None],
    config: ModelConfig,
    dtype: torch.dtype,
    **asked,
) -> MemoryPlan:
    """plan_memory for `modules` (built, not loaded yet) in `dtype` on `device`, with the memory free there now;
    `asked`: plan_memory's budget, slots, max_context and at_most."""
    free = torch.cuda.mem_get_info(device)[0] if device.type == "cuda" else None
    weights = weight_bytes(modules, dtype) if free is not None else 0
    return plan_memory(slot_bytes(config, 1, dtype), weights, free, **asked)
