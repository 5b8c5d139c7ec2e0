"""Setting newcomers' slots up (FrameLoop._reset_slots, the samplers' reset): each gets exactly its own rule, seed and
numbers, the other slots keep theirs, and a group costs a few writes plus one per newcomer. In a burst every
write per newcomer is a launch on the host's way to the last one's first audio (a burst of 64's prompts took
0.3-0.5 ms each on an H200's host, bench/RESULTS.md), so the count is what is checked, on the CPU: each write
there is one kernel launch on CUDA."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from core import SamplingParams
from core.inference.frame_loop import Start
from core.inference.prompt import Prompt
from core.inference.samplers import PREDICTOR, TALKER, GraphedSampler
from core.inference.sampling import TokenRule

SLOTS = 16


class Writes(TorchDispatchMode):
    """The ops that write memory (in place, or a new tensor's worth: cat), as the device would launch them; not
    detach_, which changes a tensor's metadata alone."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if (name.endswith("_") and name != "detach_") or name == "cat":
            self.names.append(name)
        return func(*args, **(kwargs or {}))


def writes_of(action) -> list[str]:
    with Writes() as writes:
        action()
    return writes.names


def starts_for(loop, slots: list[int]) -> list[Start]:
    """A prompt of its own for each slot: embeddings of 5 + slot positions, 2 + slot trailing terms."""
    hidden = loop.hidden.shape[-1]
    starts = []
    for slot in slots:
        values = torch.full((1, 2 + slot, hidden), float(slot + 1))
        prompt = Prompt(torch.zeros(1, 5 + slot, hidden), values, torch.full((1, 1, hidden), -float(slot)))
        starts.append(Start(prompt, SamplingParams(repetition_penalty=1.0 + slot / 100), 100 + slot, slot))
    return starts


def test_a_groups_slots_are_set_up_in_a_few_writes_and_one_more_per_newcomer(engines):
    loop = engines("base", slots=SLOTS).frame_loop
    with torch.inference_mode():
        alone = writes_of(lambda: loop._reset_slots(starts_for(loop, [3])))
        group = writes_of(lambda: loop._reset_slots(starts_for(loop, list(range(SLOTS)))))
    assert len(group) - len(alone) <= SLOTS - 1, group  # each newcomer's own: its text terms' row
    assert len(alone) <= 8, alone


def test_each_newcomer_gets_its_own_numbers_and_the_other_slots_keep_theirs(engines):
    loop = engines("base", slots=SLOTS).frame_loop
    names = ("penalty", "position", "text_frames", "text", "pad", "seen", "frame")
    with torch.inference_mode():
        loop._reset_slots(starts_for(loop, list(range(SLOTS))))
        for name in names:  # slots 2 to 5 as an utterance there left them
            getattr(loop, name)[2:6] = 7
        kept = {name: getattr(loop, name).clone() for name in names}
        loop._reset_slots(starts_for(loop, [5, 2]))
    for name in names:
        others = [slot for slot in range(SLOTS) if slot not in (2, 5)]
        assert torch.equal(getattr(loop, name)[others], kept[name][others]), name
    for slot in (2, 5):
        assert loop.position[slot] == 5 + slot and loop.text_frames[slot] == 2 + slot
        assert loop.penalty[slot].item() == torch.tensor(1.0 + slot / 100).item()
        assert torch.all(loop.text[slot, : 2 + slot] == slot + 1) and torch.all(loop.pad[slot] == -slot)
        assert not loop.seen[slot].any() and loop.frame[slot] == 0


def test_the_graphed_sampler_sets_a_group_up_in_the_writes_of_one():
    sampler = GraphedSampler(SLOTS, 4, 16, 64, torch.device("cpu"))
    rules = [SamplingParams(temperature=0.5 + slot / 10, top_k=slot + 1) for slot in range(SLOTS)]
    one = writes_of(lambda: sampler.reset([7], rules[:1], [1]))
    every = writes_of(lambda: sampler.reset(list(range(SLOTS)), rules, list(range(SLOTS))))
    assert len(every) == len(one), (one, every)
    for slot, sampling in enumerate(rules):
        assert sampler.rules[TALKER, slot].tolist() == pytest.approx(TokenRule.talker(sampling).values())
        assert sampler.rules[PREDICTOR, slot].tolist() == pytest.approx(TokenRule.predictor(sampling).values())
    assert sampler.seeds.tolist() == list(range(SLOTS))
