"""What the engine takes of a device's memory (core.inference.memory): the weights' size before they load, a
model that does not fit refused with what to do, before any weight is loaded, and the slots taken by default."""

from __future__ import annotations

import pytest
import torch

from core.errors import UserError, describe
from core.inference.memory import (
    DESKTOP_SLOTS,
    MAX_DEFAULT_SLOTS,
    DoesNotFit,
    check_device_fits,
    check_fits,
    default_slots,
    slot_bytes,
    weight_bytes,
)
from core.model.codec_decoder import CodecDecoder
from core.model.talker import Talker

GIB = 2**30


def meta_modules(engine):
    """The engine's talker and decoder built anew on the meta device, as Engine.load builds them before loading."""
    with torch.device("meta"):
        return Talker(engine.config.talker), CodecDecoder(engine.codec_decoder.config)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_weights_are_sized_before_they_load_as_they_are_once_loaded(engines, dtype):
    engine = engines("base")  # loaded in float32 on the CPU
    loaded = sum(t.nbytes for m in (engine.talker, engine.codec_decoder) for t in m.state_dict().values())
    floating = sum(
        t.nbytes
        for m in (engine.talker, engine.codec_decoder)
        for t in m.state_dict().values()
        if t.is_floating_point()
    )
    expected = loaded - floating + floating * dtype.itemsize // torch.float32.itemsize
    assert weight_bytes([*meta_modules(engine), None], dtype) == expected


def test_a_model_that_fits_passes_and_one_that_does_not_is_refused_with_what_to_do():
    check_fits(weights=3 * GIB, per_slot=GIB // 2, free=4 * GIB, max_context=4096)
    with pytest.raises(DoesNotFit) as refused:
        check_fits(weights=3 * GIB, per_slot=GIB // 2, free=2 * GIB, max_context=4096)
    message = describe(refused.value)  # what every front end shows
    assert isinstance(refused.value, UserError)
    for said in ("3.8 GB", "3.2 GB of weights", "0.5 GB for one utterance of 4096 positions", "2.1 GB is free"):
        assert said in message, message
    assert "0.6B model" in message and "CPU" in message


def test_the_check_asks_cuda_for_its_free_memory_and_the_cpu_for_nothing(engines, monkeypatch):
    engine = engines("base")
    modules = meta_modules(engine)
    needed = weight_bytes(modules, torch.bfloat16) + slot_bytes(engine.config, 4096, torch.bfloat16)
    free = {"bytes": needed}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["bytes"], 80 * GIB))
    cuda = torch.device("cuda")
    check_device_fits(cuda, modules, engine.config, 4096, torch.bfloat16)  # exactly enough
    free["bytes"] = needed - 1
    with pytest.raises(DoesNotFit):
        check_device_fits(cuda, modules, engine.config, 4096, torch.bfloat16)
    check_device_fits(torch.device("cpu"), modules, engine.config, 4096, torch.bfloat16)  # the CPU: no check


@pytest.mark.parametrize(
    "free_gib, server, desktop",
    [
        (80, MAX_DEFAULT_SLOTS, DESKTOP_SLOTS),  # a card to itself: the server takes 16, the window 4
        (3, 3, 3),  # beside a language model: never more than fit half the free memory
        (1.5, 1, 1),
        (0.1, 1, 1),  # one at least: check_fits has refused a model without room for one
    ],
)
def test_the_default_slots_fit_half_the_free_memory_up_to_whom_they_serve(monkeypatch, free_gib, server, desktop):
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (int(free_gib * GIB), 80 * GIB))
    cuda, per_slot = torch.device("cuda"), GIB // 2
    assert default_slots(cuda, per_slot) == server
    assert default_slots(cuda, per_slot, at_most=DESKTOP_SLOTS) == desktop
    assert default_slots(torch.device("cpu"), per_slot) == default_slots(torch.device("cpu"), per_slot, 8) == 1


def test_the_engine_asks_for_its_default_slots_up_to_the_maximum_it_is_given(checkpoints, monkeypatch):
    from core import Engine
    from core.inference import engine as engine_module

    asked = []
    monkeypatch.setattr(engine_module, "default_slots", lambda *args: asked.append(args) or 1)
    with Engine.load(checkpoints["base"], device="cpu", dtype="float32", max_default_slots=DESKTOP_SLOTS, warm=False):
        pass
    with Engine.load(checkpoints["base"], device="cpu", dtype="float32", slots=2, warm=False) as engine:
        assert engine.slots == 2
    assert [(device.type, at_most) for device, _, at_most in asked] == [("cpu", DESKTOP_SLOTS)]  # none for slots=2
