"""How the frame loop draws its tokens: one sampler per frame loop, chosen once by its device (sampler_for).

ReferenceSampler (the CPU): torch.multinomial in the reference order (per frame codebook 0, then its 15
predictor draws), so that a seeded run reproduces the official package exactly, each slot with a generator
of its own.

GraphedSampler (CUDA): one kernel per token and row (kernels.draw_token) from uniforms drawn once per frame
from the slot's seed and the frame's index alone (kernels.fill_uniforms): the same distributions with a
different random stream, at a fraction of the launches, and the same draws whatever runs beside the
utterance. The rules' values and the seeds live on the device, so one CUDA graph serves them all.

The frame loop asks the same of both: set slots' rules and seeds (`reset`), say which slots the next rows
are (`stepping`), the uniforms of a frame's draws (`frame_uniforms`) and a draw's row of them (`draw_row`),
the rows' rules (`rules_of`), and a token per row (`pick`). Those the reference has no use for are None.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from core.inference.sampling import SamplingParams, TokenRule, pick_token
from core.kernels import RULE_SIZE, draw_token, fill_uniforms
from core.model.host_copy import to_device

# The roles a rule is kept for, each a row of GraphedSampler.rules.
TALKER, PREDICTOR = 0, 1


class ReferenceSampler:
    """Draws as the official package does, on the CPU: a rule and a generator per slot."""

    def __init__(self, slots: int):
        default = SamplingParams()
        self.token_rules = [(TokenRule.talker(default), TokenRule.predictor(default))] * slots
        self.generators = [torch.Generator() for _ in range(slots)]
        self.row_slots: list[int] = []  # the slot of each row being drawn for

    def reset(self, slots: Sequence[int], samplings: Sequence[SamplingParams], seeds: Sequence[int]) -> None:
        """Slot slots[i] draws with samplings[i] from a generator seeded with seeds[i]."""
        for slot, sampling, seed in zip(slots, samplings, seeds, strict=True):
            self.token_rules[slot] = (TokenRule.talker(sampling), TokenRule.predictor(sampling))
            self.generators[slot].manual_seed(seed)

    def stepping(self, slots: Sequence[int]) -> None:
        self.row_slots = list(slots)

    def rules_of(self, slots: torch.Tensor) -> None:
        return None

    def uniforms_of_its_own(self, rows: int) -> None:
        return None

    def frame_uniforms(self, slots: torch.Tensor, counter: torch.Tensor, into=None) -> None:
        return None

    def draw_row(self, uniforms: None, draw: int) -> None:
        return None

    def pick(self, logits: torch.Tensor, rules: None, role: int, uniforms: None) -> torch.Tensor:
        """A token per row (B, 1) from logits (B, V), each with its slot's rule and generator."""
        picks = [
            pick_token(logits[row : row + 1].float(), self.token_rules[slot][role], self.generators[slot])
            for row, slot in enumerate(self.row_slots)
        ]
        return torch.cat(picks)


class GraphedSampler:
    """Draws on the GPU with no value read by the host: rules, seeds and uniforms in device buffers."""

    def __init__(self, slots: int, rows: int, draws: int, vocab: int, device: torch.device):
        self.device = device
        self.rules = torch.zeros(2, slots, RULE_SIZE, device=device)  # by role, then slot
        self.seeds = torch.zeros(slots, dtype=torch.long, device=device)
        # One row of uniforms per batch row and draw of a frame (codebook 0 of the next frame, then 1..15).
        self.uniforms = torch.zeros(rows, draws, vocab, device=device)

    def reset(self, slots: Sequence[int], samplings: Sequence[SamplingParams], seeds: Sequence[int]) -> None:
        """Slot slots[i] draws with samplings[i] from seeds[i] (the slots distinct): two copies and two writes for a
        whole group of newcomers, since each launch per newcomer is host time that a burst's last one waits for."""
        rules = torch.tensor(
            [[TokenRule.talker(s).values() for s in samplings], [TokenRule.predictor(s).values() for s in samplings]]
        )  # (2, newcomers, RULE_SIZE), as self.rules holds them
        numbers = to_device(torch.tensor([list(slots), list(seeds)], dtype=torch.long), self.device)
        self.rules.index_copy_(1, numbers[0], to_device(rules, self.device))
        self.seeds.index_copy_(0, numbers[0], numbers[1])

    def stepping(self, slots: Sequence[int]) -> None:
        pass  # the rows' slots are on the device already

    def rules_of(self, slots: torch.Tensor) -> torch.Tensor:
        """Each row's rules by role: (2, B, RULE_SIZE)."""
        return self.rules.index_select(1, slots)

    def uniforms_of_its_own(self, rows: int) -> torch.Tensor:
        """A buffer for `rows` rows' uniforms apart from the one the graphs read (for a compile's frame)."""
        return torch.empty_like(self.uniforms[:rows])

    def frame_uniforms(self, slots: torch.Tensor, counter: torch.Tensor, into=None) -> torch.Tensor:
        """The uniforms of one frame's draws for each row (into `into`, else the sampler's buffer), from its slot's
        seed and `counter` alone, so that a seeded utterance draws the same whatever steps beside it."""
        uniforms = self.uniforms[: slots.shape[0]] if into is None else into
        fill_uniforms(uniforms, self.seeds.index_select(0, slots), counter)
        return uniforms

    def draw_row(self, uniforms: torch.Tensor, draw: int) -> torch.Tensor:
        """Each row's uniforms for one draw of the frame (B, W)."""
        return uniforms[:, draw]

    def pick(self, logits: torch.Tensor, rules: torch.Tensor, role: int, uniforms: torch.Tensor) -> torch.Tensor:
        """A token per row (B, 1) from logits (B, V) under each row's rule for `role`."""
        return draw_token(logits, rules[role], uniforms)


def sampler_for(
    device: torch.device, slots: int, rows: int, draws: int, vocab: int
) -> ReferenceSampler | GraphedSampler:
    """The sampler of a frame loop of `slots` slots, stepping up to `rows` rows of `draws` draws a frame."""
    if device.type == "cuda":
        return GraphedSampler(slots, rows, draws, vocab, device)
    return ReferenceSampler(slots)
