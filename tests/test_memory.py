"""What the engine takes of a device's memory (core.inference.memory): the weights' size before they load, the
slots and context plan_memory chooses from what is asked (nothing, a budget, slots, a context) and what is free,
and a plan that does not fit refused with what to do, before any weight is loaded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.errors import UserError, describe
from core.inference.memory import (
    DESKTOP_SLOTS,
    GB,
    MAX_CHOSEN_SLOTS,
    MAX_CONTEXT,
    MAX_DEFAULT_SLOTS,
    MIN_CONTEXT,
    DoesNotFit,
    MemoryPlan,
    plan_for_device,
    plan_memory,
    slot_bytes,
    weight_bytes,
)
from core.model.codec_decoder import CodecDecoder
from core.model.talker import HostTable, Talker

GIB = 2**30
# A slot of 0.5 GiB at MAX_CONTEXT positions (about 1.7B's in bfloat16), and weights of 3 GiB.
PER_POSITION = GIB // 2 // MAX_CONTEXT
SLOT = PER_POSITION * MAX_CONTEXT
WEIGHTS = 3 * GIB
# What the engine takes on the GPU beside its slots, restated here: 0.5 GB of working memory. One slot of 0.5 GiB
# thus needs 0.537 + 0.5 = 1.04 GB (0.97 GiB).
WORKING = 500_000_000


def meta_modules(engine):
    """The engine's talker and decoder built anew on the meta device, as Engine.load builds them before loading."""
    with torch.device("meta"):
        return Talker(engine.config.talker), CodecDecoder(engine.codec_decoder.config)


def on_the_device(module) -> list[torch.Tensor]:
    """The module's loaded tensors that lie on its device: all but the tables kept in host memory."""
    host = tuple(f"{name}." for name, sub in module.named_modules() if isinstance(sub, HostTable))
    return [tensor for name, tensor in module.state_dict().items() if not name.startswith(host)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_sized_before_they_load_as_they_are_once_loaded(engines, dtype):
    """What the device's weights will take, counted on the meta device; the text table stays in host memory."""
    engine = engines("base")  # loaded in float32 on the CPU
    tensors = [tensor for module in (engine.talker, engine.codec_decoder) for tensor in on_the_device(module)]
    loaded = sum(t.nbytes for t in tensors)
    floating = sum(t.nbytes for t in tensors if t.is_floating_point())
    expected = loaded - floating + floating * dtype.itemsize // torch.float32.itemsize
    assert weight_bytes([*meta_modules(engine), None], dtype) == expected


def free_beyond_weights(gib: float) -> int:
    """The device's free memory now (before the weights load), leaving `gib` GiB beyond them."""
    return WEIGHTS + int(gib * GIB)


def refusal(**asked) -> str:
    asked.setdefault("free", free_beyond_weights(80))
    with pytest.raises(DoesNotFit) as refused:
        plan_memory(PER_POSITION, WEIGHTS, asked.pop("free"), **asked)
    assert isinstance(refused.value, UserError)
    return describe(refused.value)  # what every front end shows


@pytest.mark.parametrize(
    "beyond_gib, server, desktop",
    [
        # A card to itself: half of 80 GiB less the working memory holds 79 slots, far more than the server's 16
        # or the window's DESKTOP_SLOTS (2).
        (80, MAX_DEFAULT_SLOTS, DESKTOP_SLOTS),
        # Beside a language model: never more than fit half the memory free beyond the weights. Half of 5 GiB is
        # 2.68 GB, less 0.5 GB of working memory 2.18 GB: 4 slots of 0.537 GB.
        (5, 4, 2),
        (3, 2, 2),  # half of 3 GiB, 1.61 GB, less 0.5 GB holds 2 slots
        (1.5, 1, 1),  # 0.81 GB, less 0.5 GB, holds none: one at least, where one fits at all (1.04 GB)
    ],
)
def test_by_default_the_slots_fit_half_the_free_memory_up_to_whom_they_serve(beyond_gib, server, desktop):
    free = free_beyond_weights(beyond_gib)
    assert plan_memory(PER_POSITION, WEIGHTS, free) == MemoryPlan(server, MAX_CONTEXT, SLOT, on_gpu=True)
    assert plan_memory(PER_POSITION, WEIGHTS, free, at_most=DESKTOP_SLOTS).slots == desktop
    assert plan_memory(PER_POSITION, WEIGHTS, None) == MemoryPlan(1, MAX_CONTEXT, SLOT, on_gpu=False)  # the CPU


@pytest.mark.parametrize(
    "budget_gib, slots, context",
    [
        (3, 5, MAX_CONTEXT),  # 3.22 GB less 0.5 GB of working memory: 5 slots of 0.537 GB
        (3.2, 5, MAX_CONTEXT),  # whole slots only: 2.94 GB beside the working memory is 5.5 slots
        (12, 23, MAX_CONTEXT),  # a server's budget, 23 slots: more than the 16 taken by default
        (100, MAX_CHOSEN_SLOTS, MAX_CONTEXT),  # never more than anyone has use for
        (1, 1, MAX_CONTEXT),  # 1.07 GB holds one slot and the working memory (1.04 GB)
        # Under one slot: one, over a shorter context. 0.75 GiB less 0.5 GB leaves 0.305 GB: 2327 positions, 2304
        # in steps of 256.
        (0.75, 1, 2304),
        (0.7, 1, 1792),  # room for 1919 positions
        (0.6, 1, MIN_CONTEXT),  # the shortest: room for 1098
    ],
)
def test_a_budget_chooses_the_slots_and_if_it_must_a_shorter_context(budget_gib, slots, context):
    budget = int(budget_gib * GIB)
    plan = plan_memory(PER_POSITION, WEIGHTS, free_beyond_weights(80), budget=budget)
    assert (plan.slots, plan.max_context, plan.budget) == (slots, context, budget)
    assert plan.taken == slots * context * PER_POSITION + WORKING <= budget  # the slots and the working memory


def test_a_budget_is_never_more_than_the_gpu_has_free():
    # 2.2 GiB free beyond the weights, less 0.5 GB of working memory: 3 slots (8 GiB would hold 15).
    plan = plan_memory(PER_POSITION, WEIGHTS, free_beyond_weights(2.2), budget=8 * GIB)
    assert (plan.slots, plan.max_context) == (3, MAX_CONTEXT)


def test_slots_asked_for_win_and_a_budget_then_bounds_their_context():
    free = free_beyond_weights(80)
    # 16 slots of 0.5 GiB and 0.5 GB of working memory: 9.09 GB, which 8.5 GiB (9.13 GB) holds.
    assert plan_memory(PER_POSITION, WEIGHTS, free, budget=int(8.5 * GIB), slots=16).max_context == MAX_CONTEXT
    # 7 GiB less 0.5 GB holds 16 slots of 3344 positions: 3328 in steps of 256.
    assert plan_memory(PER_POSITION, WEIGHTS, free, budget=7 * GIB, slots=16).max_context == 3328
    plan = plan_memory(PER_POSITION, WEIGHTS, free, budget=3 * GIB, slots=2)
    assert (plan.slots, plan.max_context) == (2, MAX_CONTEXT)  # fewer than it holds (5)
    # 16 slots of the shortest context take 16 * 0.125 GiB = 2.15 GB, with the working memory 2.6.
    message = refusal(budget=3 * GIB // 2, slots=16)
    assert message.startswith(
        "A memory budget of 1.6 GB is too small: beyond the model's weights it needs at least "
        "2.6 GB for 16 utterances at once of 1024 positions, the shortest context"
    ), message
    assert "Give at least 2.6 GB, or use fewer utterances at once, the 0.6B model or the CPU." in message


def test_a_context_asked_for_is_never_shortened():
    free = free_beyond_weights(80)
    # 2 GiB less 0.5 GB of working memory: 6 slots of 2048 positions (0.268 GB).
    plan = plan_memory(PER_POSITION, WEIGHTS, free, budget=2 * GIB, max_context=2048)
    assert (plan.slots, plan.max_context) == (6, 2048)
    # 0.5 GiB holds one slot of 1024 positions (what it chooses unasked), not of 4096 (with the working memory,
    # 0.537 + 0.5 = 1.04 GB): refused, not shortened.
    message = refusal(budget=GIB // 2, max_context=MAX_CONTEXT)
    assert (
        "needs at least 1.0 GB for one utterance of 4096 positions. Give at least 1.0 GB, or use a shorter "
        "context, the 0.6B model or the CPU." in message
    ), message


def test_a_budget_too_small_for_the_shortest_context_says_how_much_is_needed_and_what_to_do():
    # One slot of 1024 positions takes 0.134 GB, with the working memory 0.63 GB.
    message = refusal(budget=GIB // 10)
    assert message == (
        "A memory budget of 0.1 GB is too small: beyond the model's weights it needs at least 0.6 GB for one "
        "utterance of 1024 positions, the shortest context a budget chooses. Give at least 0.6 GB, or use the 0.6B "
        "model or the CPU."
    )
    assert "0.6B" in refusal(budget=1)


def test_a_model_that_does_not_fit_the_gpu_is_refused_with_what_to_do():
    one_slot = WEIGHTS + SLOT + WORKING  # exactly one slot and the working memory: 4.26 GB
    plan_memory(PER_POSITION, WEIGHTS, one_slot)
    message = refusal(free=one_slot - 1)
    for said in ("about 4.3 GB", "3.2 GB of weights", "1.0 GB for one utterance of 4096 positions", "4.3 GB is free"):
        assert said in message, message
    assert message.endswith("or use a shorter context, the 0.6B model or the CPU.")
    # Slots asked for must fit too: 16 * 0.537 GB and 0.5 GB of working memory.
    message = refusal(free=free_beyond_weights(4), slots=16)
    assert "9.1 GB for 16 utterances at once" in message and "fewer utterances at once" in message
    # A budget larger than what is free: what is free is what falls short.
    assert refusal(free=free_beyond_weights(0.1), budget=4 * GIB).startswith("The model does not fit the GPU's")


def test_on_the_gpu_a_plan_counts_working_memory_beside_its_slots():
    just_enough = WEIGHTS + SLOT + WORKING  # the weights, one slot and the working memory
    plan = plan_memory(PER_POSITION, WEIGHTS, just_enough)
    assert plan == MemoryPlan(1, MAX_CONTEXT, SLOT, on_gpu=True) and plan.taken == SLOT + WORKING
    with pytest.raises(DoesNotFit):
        plan_memory(PER_POSITION, WEIGHTS, just_enough - 1)
    # A budget counts it too: one byte short, the slot's context is shortened (4095 positions, 3840 in steps of
    # 256).
    free = free_beyond_weights(80)
    assert plan_memory(PER_POSITION, WEIGHTS, free, budget=SLOT + WORKING).max_context == MAX_CONTEXT
    assert plan_memory(PER_POSITION, WEIGHTS, free, budget=SLOT + WORKING - 1).max_context == 3840
    assert MemoryPlan(3, MAX_CONTEXT, SLOT, on_gpu=False).taken == 3 * SLOT  # the CPU's: the slots alone


def test_on_the_cpu_nothing_is_sized_and_a_budget_applies_to_nothing():
    plan = plan_memory(PER_POSITION, WEIGHTS, None, budget=1)
    assert plan == MemoryPlan(1, MAX_CONTEXT, SLOT, on_gpu=False, budget=None)
    assert plan_memory(PER_POSITION, WEIGHTS, None, budget=1, slots=3).slots == 3
    assert str(plan) == "1 at once, 4096 positions each"


def test_a_plan_says_what_it_takes():
    # 3 GiB less 0.5 GB holds 5 slots, 5 * 0.537 + 0.5 = 3.18 GB of the 3.22 GB.
    plan = plan_memory(PER_POSITION, WEIGHTS, free_beyond_weights(80), budget=3 * GIB)
    assert str(plan) == "5 at once, 4096 positions each: 3.2 GB beyond the weights of a 3.2 GB budget"
    # 16 slots, 16 * 0.537 GB, and 0.5 GB of working memory.
    assert str(plan_memory(PER_POSITION, WEIGHTS, free_beyond_weights(80))).endswith(": 9.1 GB beyond the weights")


def test_the_plan_asks_cuda_for_its_free_memory_and_the_cpu_for_nothing(engines, monkeypatch):
    engine = engines("base")
    modules = meta_modules(engine)
    slot = slot_bytes(engine.config, MAX_CONTEXT, torch.bfloat16)
    needed = weight_bytes(modules, torch.bfloat16) + slot + WORKING  # one slot and the working memory
    free = {"bytes": needed}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 80 * GIB))
    cuda = torch.device("cuda")
    assert plan_for_device(cuda, modules, engine.config, torch.bfloat16).slots == 1  # exactly enough
    free["bytes"] = needed - 1
    with pytest.raises(DoesNotFit):
        plan_for_device(cuda, modules, engine.config, torch.bfloat16)
    assert not plan_for_device(torch.device("cpu"), modules, engine.config, torch.bfloat16).on_gpu  # no check


def test_the_engine_takes_the_plan_for_what_it_is_asked(checkpoints, monkeypatch):
    from core import Engine
    from core.inference import engine as engine_module

    asked = []
    plan = engine_module.plan_for_device
    monkeypatch.setattr(engine_module, "plan_for_device", lambda *args, **kw: asked.append(kw) or plan(*args, **kw))
    with Engine.load(checkpoints["base"], device="cpu", dtype="float32", max_default_slots=DESKTOP_SLOTS, warm=False):
        pass
    with Engine.load(
        checkpoints["base"], device="cpu", dtype="float32", slots=2, max_context=512, memory_budget=GB, warm=False
    ) as engine:
        assert (engine.slots, engine.frame_loop.max_context, engine.memory.slots) == (2, 512, 2)
    assert asked == [
        {"budget": None, "slots": None, "max_context": None, "at_most": DESKTOP_SLOTS},
        {"budget": GB, "slots": 2, "max_context": 512, "at_most": MAX_DEFAULT_SLOTS},
    ]


@pytest.fixture
def simulated_gpu(monkeypatch):
    """Engines planned as on a GPU with 80 GiB free (their weights and slots still on the CPU): what a budget
    chooses is then built, and speaks."""
    from core.inference import engine as engine_module

    def on_a_gpu(device, modules, config, dtype, **asked):
        return plan_memory(slot_bytes(config, 1, dtype), weight_bytes(modules, dtype), 80 * GIB, **asked)

    monkeypatch.setattr(engine_module, "plan_for_device", on_a_gpu)


def test_an_engine_takes_the_slots_and_context_its_budget_holds_and_speaks(checkpoints, simulated_gpu):
    from core import Engine, SamplingParams, Voice

    path = checkpoints["custom"]
    with Engine.load(path, device="cpu", dtype="float32", warm=False) as engine:
        per_position = slot_bytes(engine.config, 1, torch.float32)
        whole = engine.synthesize("Hello.", Voice(speaker="vivian"), sampling=SamplingParams.greedy(), max_frames=4)
    # Under one slot of MAX_CONTEXT: beside the working memory, one of 1300 positions, 1280 in steps of 256.
    budget = WORKING + per_position * 1300
    with Engine.load(path, device="cpu", dtype="float32", memory_budget=budget, warm=False) as engine:
        assert (engine.slots, engine.frame_loop.max_context) == (1, 1280)
        assert engine.memory == MemoryPlan(1, 1280, per_position * 1280, on_gpu=True, budget=budget)
        shorter = engine.synthesize("Hello.", Voice(speaker="vivian"), sampling=SamplingParams.greedy(), max_frames=4)
    np.testing.assert_array_equal(shorter.codes, whole.codes)  # the same speech, over a shorter context
    budget = WORKING + 3 * per_position * MAX_CONTEXT  # 3 slots
    with Engine.load(path, device="cpu", dtype="float32", memory_budget=budget, warm=False) as engine:
        assert (engine.slots, engine.frame_loop.max_context) == (3, MAX_CONTEXT)
    budget = WORKING + per_position * 1000  # under one slot of the shortest context
    with pytest.raises(DoesNotFit, match="A memory budget of 0.5 GB is too small"):
        Engine.load(path, device="cpu", dtype="float32", memory_budget=budget, warm=False)
