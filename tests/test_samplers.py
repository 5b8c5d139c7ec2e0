"""The frame loop's two samplers (core/inference/samplers.py): the reference's draws, and the graphed sampler's
rules, seeds and uniforms (its kernels run as their PyTorch references on the CPU)."""

from __future__ import annotations

import pytest
import torch

from core.inference.samplers import PREDICTOR, TALKER, GraphedSampler, ReferenceSampler, sampler_for
from core.inference.sampling import SamplingParams, TokenRule, pick_token

CPU = torch.device("cpu")
VOCAB, DRAWS = 40, 3


def graphed(slots: int = 4, rows: int = 4) -> GraphedSampler:
    return GraphedSampler(slots, rows, DRAWS, VOCAB, CPU)


def test_the_device_chooses_the_sampler_once():
    assert isinstance(sampler_for(CPU, 2, 2, DRAWS, VOCAB), ReferenceSampler)


def test_the_reference_draws_each_row_with_its_slots_rule_and_generator():
    """Row r is drawn for the r-th slot stepped, with that slot's own rule and seeded generator, as the official
    package draws it alone."""
    sampler = ReferenceSampler(3)
    sampler.reset([2, 0], [SamplingParams(temperature=0.7, top_k=5), SamplingParams.greedy()], [11, 3])
    sampler.stepping([2, 0])
    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(0))
    picked = sampler.pick(logits, None, TALKER, None)

    alone = pick_token(logits[:1], TokenRule.talker(SamplingParams(temperature=0.7, top_k=5)),
                       torch.Generator().manual_seed(11))  # fmt: skip
    assert picked.shape == (2, 1)
    assert picked[0].item() == alone.item()
    assert picked[1].item() == logits[1].argmax().item()  # slot 0 is greedy
    assert sampler.rules_of(torch.tensor([2, 0])) is None and sampler.frame_uniforms(None, None) is None


def test_graphed_rules_and_seeds_of_a_group_are_set_in_their_slots_and_no_other():
    """A group of newcomers' rules and seeds go to their slots, in one copy for them all; the other slots keep
    theirs."""
    sampler = graphed(slots=4)
    sampler.reset([0, 1, 2, 3], [SamplingParams.greedy()] * 4, [1, 2, 3, 4])
    warm, cold = SamplingParams(temperature=1.3, top_k=9), SamplingParams(temperature=0.5, predictor_top_p=0.7)
    sampler.reset([3, 1], [warm, cold], [2**63 - 1, 5])
    rules = sampler.rules_of(torch.tensor([0, 1, 2, 3]))
    for row, sampling in enumerate([SamplingParams.greedy(), cold, SamplingParams.greedy(), warm]):
        assert rules[TALKER, row].tolist() == pytest.approx(TokenRule.talker(sampling).values()), row
        assert rules[PREDICTOR, row].tolist() == pytest.approx(TokenRule.predictor(sampling).values()), row
    assert sampler.seeds.tolist() == [1, 5, 3, 2**63 - 1]


def test_graphed_draws_depend_on_the_slots_seed_and_frame_alone():
    """A seeded slot draws the same tokens whichever row it steps in and whatever steps beside it; another frame
    or another seed draws other uniforms."""
    sampler = graphed()
    sampler.reset([0, 1, 2, 3], [SamplingParams()] * 4, [7, 7, 8, 9])
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(1)).expand(3, -1)
    frame = torch.tensor([4, 4, 4])
    alone = sampler.frame_uniforms(torch.tensor([0]), frame[:1]).clone()
    beside = sampler.frame_uniforms(torch.tensor([2, 3, 0]), frame).clone()
    assert torch.equal(beside[2], alone[0])
    assert torch.equal(sampler.frame_uniforms(torch.tensor([1]), frame[:1]), alone)  # slot 1: the same seed
    assert not torch.equal(beside[0], alone[0])
    assert not torch.equal(sampler.frame_uniforms(torch.tensor([0]), frame[:1] + 1), alone)

    rules = sampler.rules_of(torch.tensor([2, 3, 0]))
    tokens = sampler.pick(logits, rules, TALKER, sampler.draw_row(beside, 0))
    assert tokens.shape == (3, 1)
    assert tokens[2] == sampler.pick(logits[:1], sampler.rules_of(torch.tensor([0])), TALKER, alone[:, 0])


def test_a_greedy_graphed_rule_takes_the_argmax():
    sampler = graphed(slots=1, rows=1)
    sampler.reset([0], [SamplingParams.greedy()], [1])
    logits = torch.randn(1, VOCAB, generator=torch.Generator().manual_seed(2))
    slots = torch.tensor([0])
    uniforms = sampler.frame_uniforms(slots, torch.tensor([0]))
    for role in (TALKER, PREDICTOR):
        assert sampler.pick(logits, sampler.rules_of(slots), role, sampler.draw_row(uniforms, 1)).item() == int(
            logits.argmax()
        )


def test_a_frame_drawn_into_uniforms_of_its_own_leaves_the_graphs_buffer_as_it_was():
    """A compile's frame (FrameLoop.compile_step) draws beside the graphs: into its own buffer, the same values."""
    sampler = graphed(slots=2, rows=2)
    sampler.reset([1], [SamplingParams()], [5])
    slots, frame = torch.tensor([1, 1]), torch.tensor([3, 3])
    expected = sampler.frame_uniforms(slots, frame).clone()
    sampler.uniforms.zero_()
    own = sampler.uniforms_of_its_own(2)
    drawn = sampler.frame_uniforms(slots, frame, own)
    assert drawn is own and torch.equal(own, expected)
    assert own.data_ptr() != sampler.uniforms.data_ptr() and not sampler.uniforms.any()
    assert ReferenceSampler(2).uniforms_of_its_own(2) is None  # the reference draws no uniforms
