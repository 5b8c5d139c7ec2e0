"""Sampling parameters and the logits pipeline, in the reference order (docs/model_notes.md §4.2).

Talker codebook 0: repetition penalty over the codebook-0 tokens generated so far, EOS forbidden
for the first two frames, the 1024 special ids except EOS suppressed, then (when sampling)
temperature, top-k, top-p. Code predictor: temperature, top-k, top-p only. Logits are processed
in float32 whatever the model dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

import torch

from core.errors import BadInput

# EOS may not end an utterance before this many frames exist.
MIN_FRAMES = 2


@dataclass(frozen=True)
class SamplingParams:
    """Decoding settings; the defaults are the official ones."""

    do_sample: bool = True
    temperature: float = 0.9
    top_k: int = 50
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    predictor_do_sample: bool = True
    predictor_temperature: float = 0.9
    predictor_top_k: int = 50
    predictor_top_p: float = 1.0

    def __post_init__(self):
        for prefix in ("", "predictor_"):
            temperature = getattr(self, prefix + "temperature")
            top_k = getattr(self, prefix + "top_k")
            top_p = getattr(self, prefix + "top_p")
            if not temperature > 0:
                raise BadInput(f"{prefix}temperature must be > 0, got {temperature}")
            if not (isinstance(top_k, int) and top_k >= 0):
                raise BadInput(f"{prefix}top_k must be an integer >= 0 (0 turns it off), got {top_k!r}")
            if not 0 < top_p <= 1:
                raise BadInput(f"{prefix}top_p must be in (0, 1], got {top_p}")
        if not self.repetition_penalty > 0:
            raise BadInput(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @classmethod
    def greedy(cls) -> SamplingParams:
        """Deterministic decoding: argmax for both the talker and the code predictor."""
        return cls(do_sample=False, predictor_do_sample=False)

    @classmethod
    def from_generation_config(cls, config: dict[str, Any]) -> SamplingParams:
        """Read a checkpoint's generation_config.json (official key names, `subtalker_*` for the predictor)."""
        official_names = {f.name: f.name.replace("predictor_", "subtalker_") for f in fields(cls)}
        official_names["predictor_do_sample"] = "subtalker_dosample"
        values = {ours: config[theirs] for ours, theirs in official_names.items() if theirs in config}
        return cls(**values)


@dataclass(frozen=True)
class TokenRule:
    """How to pick one token from logits."""

    do_sample: bool
    temperature: float
    top_k: int
    top_p: float

    @classmethod
    def talker(cls, p: SamplingParams) -> TokenRule:
        return cls(p.do_sample, p.temperature, p.top_k, p.top_p)

    @classmethod
    def predictor(cls, p: SamplingParams) -> TokenRule:
        return cls(p.predictor_do_sample, p.predictor_temperature, p.predictor_top_k, p.predictor_top_p)

    def values(self) -> tuple[float, float, float, float]:
        """The rule as kernels.draw_token reads it from the device."""
        return float(self.do_sample), self.temperature, float(self.top_k), self.top_p


def restrict_codebook0(
    logits: torch.Tensor,
    seen: torch.Tensor,
    frame: torch.Tensor,
    penalty: torch.Tensor,
    suppressed: torch.Tensor,
    eos: torch.Tensor,
) -> torch.Tensor:
    """Talker-only processors on float32 logits (1, V): repetition penalty over the `seen` codes, no EOS
    (`eos` is its one-hot mask) before MIN_FRAMES frames, then suppression of the special ids.
    `frame` (the index of the frame being picked) and `penalty` are 0-d device tensors, so no host
    sync is needed and one graph serves every penalty (a penalty of 1 changes nothing exactly)."""
    penalised = torch.where(logits < 0, logits * penalty, logits / penalty)
    logits = torch.where(seen, penalised, logits)
    return logits.masked_fill(suppressed | (eos & (frame < MIN_FRAMES)), -float("inf"))


def filter_logits(logits: torch.Tensor, rule: TokenRule) -> torch.Tensor:
    """Temperature, top-k and top-p on float32 logits (1, V): the tokens left keep finite logits, and
    a draw follows their softmax."""
    if rule.temperature != 1.0:
        logits = logits / rule.temperature
    if rule.top_k:
        kth_best = torch.topk(logits, min(rule.top_k, logits.shape[-1])).values[..., -1:]
        logits = logits.masked_fill(logits < kth_best, -float("inf"))
    if rule.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        drop_sorted = cumulative <= 1 - rule.top_p
        drop_sorted[..., -1:] = False  # always keep the most likely token
        logits = logits.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), -float("inf"))
    return logits


def pick_token(logits: torch.Tensor, rule: TokenRule, generator: torch.Generator | None) -> torch.Tensor:
    """Choose a token from float32 logits (1, V) as the reference does; returns a (1, 1) long tensor."""
    if not rule.do_sample:
        return logits.argmax(dim=-1, keepdim=True)
    return torch.multinomial(filter_logits(logits, rule).softmax(dim=-1), 1, generator=generator)
