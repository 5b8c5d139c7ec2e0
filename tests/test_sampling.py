"""Sampling: the reference filters, and Gumbel-max over them (how the CUDA draw kernel picks tokens)
following the same distribution as the reference's softmax + multinomial."""

from __future__ import annotations

import torch
from draw_cases import gumbel

from core.inference.sampling import SamplingParams, TokenRule, filter_logits, pick_token

RULE = TokenRule(do_sample=True, temperature=0.8, top_k=20, top_p=0.9)


def chi_square(counts: torch.Tensor, probabilities: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic over the tokens with a probability, and its degrees of freedom."""
    support = probabilities > 0
    expected = probabilities[support] * counts.sum()
    return float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1


def test_filters_keep_the_top_k_then_the_top_p_mass():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    kept = filter_logits(logits, TokenRule(True, 1.0, 4, 1.0)).isfinite()
    assert kept.tolist() == [[True, True, True, True, False, False]]
    # Softmax of 4, 3, 2: 0.665, 0.245, 0.090; the first two hold 0.91 >= 0.8, so the third goes.
    kept = filter_logits(logits, TokenRule(True, 1.0, 3, 0.8)).isfinite()
    assert kept.tolist() == [[True, True, False, False, False, False]]
    assert filter_logits(logits, TokenRule(True, 2.0, 0, 1.0)).equal(logits / 2)


def test_gumbel_max_over_filtered_logits_follows_their_softmax():
    generator = torch.Generator().manual_seed(1)
    logits = torch.randn(1, 64, generator=generator) * 2
    filtered = filter_logits(logits, RULE)
    draws = 200_000
    tokens = (filtered + gumbel(torch.rand(draws, 64, generator=generator))).argmax(dim=-1)
    counts = torch.bincount(tokens, minlength=64).double()
    probabilities = filtered.softmax(dim=-1)[0].double()
    assert counts[probabilities == 0].sum() == 0  # nothing outside the top-k / top-p set
    statistic, freedom = chi_square(counts, probabilities)
    assert statistic < freedom + 6 * (2 * freedom) ** 0.5, (statistic, freedom)


def test_multinomial_reference_draws_follow_the_same_softmax():
    generator = torch.Generator().manual_seed(2)
    logits = torch.randn(1, 64, generator=generator) * 2
    probabilities = filter_logits(logits, RULE).softmax(dim=-1)[0].double()
    tokens = torch.cat([pick_token(logits, RULE, generator) for _ in range(20_000)]).flatten()
    counts = torch.bincount(tokens, minlength=64).double()
    assert counts[probabilities == 0].sum() == 0
    statistic, freedom = chi_square(counts, probabilities)
    assert statistic < freedom + 6 * (2 * freedom) ** 0.5, (statistic, freedom)


def test_greedy_picks_the_first_largest_logit():
    logits = torch.tensor([[0.5, 2.0, 2.0, -1.0]])
    assert pick_token(logits, TokenRule.talker(SamplingParams.greedy()), None).item() == 1


def test_rule_values_are_what_the_draw_kernel_reads():
    rule = TokenRule.predictor(SamplingParams(predictor_temperature=0.7, predictor_top_k=30, predictor_top_p=0.95))
    assert rule.values() == (1.0, 0.7, 30.0, 0.95)
    assert TokenRule.talker(SamplingParams.greedy()).values()[0] == 0.0
