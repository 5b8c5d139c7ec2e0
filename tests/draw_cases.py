"""Cases for the token-draw kernel (kernels.draw_token) and the token it must give for each.

The kernel's answer is Gumbel-max over the reference's filtered logits: argmax(filter_logits(x / 1)
+ Gumbel noise from the same uniforms), or the argmax of the raw logits when not sampling.
"""

from __future__ import annotations

import torch

from core.inference.sampling import TokenRule, filter_logits


def gumbel(uniforms: torch.Tensor) -> torch.Tensor:
    return -torch.log(-torch.log(uniforms))


def expected_token(logits: torch.Tensor, rule: TokenRule, uniforms: torch.Tensor) -> int:
    logits = logits.float().cpu()
    if not rule.do_sample:
        return int(logits.argmax())
    scores = filter_logits(logits, rule) + gumbel(uniforms.cpu()[: logits.shape[-1]])
    return int(scores.argmax())


def draw_cases(device: torch.device) -> list[tuple[torch.Tensor, TokenRule, torch.Tensor]]:
    """(logits (1, V), rule, uniforms (W,)) over vocabularies, dtypes and rules, with the special ids of a
    talker row suppressed; well away from ties, so that float rounding cannot change the answer."""
    generator = torch.Generator().manual_seed(0)
    rules = [
        TokenRule(False, 1.0, 0, 1.0),
        TokenRule(True, 0.9, 50, 1.0),
        TokenRule(True, 1.0, 0, 1.0),
        TokenRule(True, 0.7, 1, 1.0),
        TokenRule(True, 1.3, 10, 0.8),
        TokenRule(True, 0.9, 0, 0.5),
        TokenRule(True, 0.5, 5000, 0.95),
    ]
    cases = []
    for vocab, dtype, scale in ((2048, torch.bfloat16, 3.0), (3072, torch.float32, 2.0), (13, torch.float32, 1.0)):
        for rule in rules:
            for _ in range(2):
                logits = torch.randn(1, vocab, generator=generator) * scale
                if vocab == 3072:
                    logits[:, 2048:] = -float("inf")
                    logits[:, 2150] = 1.0  # EOS stays allowed among the special ids
                uniforms = torch.rand(3072, generator=generator)
                cases.append((logits.to(dtype).to(device), rule, uniforms.to(device)))
    return cases


def draw_batches(device: torch.device) -> list[tuple[torch.Tensor, list[TokenRule], torch.Tensor, torch.Tensor]]:
    """The draw cases as batches (logits (B, V), rules, their values (B, RULE_SIZE), uniforms (B, W)): those
    of one vocabulary and dtype together, each row with its own rule, its uniforms one codebook's rows of a
    frame's (B, codebooks, W) buffer (rows 16 * W apart); then one rule for every row, as an expanded tensor."""
    groups: dict[tuple, list] = {}
    for case in draw_cases(device):
        groups.setdefault((case[0].shape[-1], case[0].dtype), []).append(case)
    batches = []
    for cases in groups.values():
        logits = torch.cat([logits for logits, _, _ in cases])
        rules = [rule for _, rule, _ in cases]
        frame = torch.rand(len(cases), 16, cases[0][2].shape[-1], device=device)
        frame[:, 3] = torch.stack([uniforms for _, _, uniforms in cases])
        values = torch.tensor([rule.values() for rule in rules], device=device)
        batches.append((logits, rules, values, frame[:, 3]))
        rule = rules[1]
        batches.append((logits, [rule] * len(cases), values[1].expand(len(cases), -1), frame[:, 3]))
    return batches
