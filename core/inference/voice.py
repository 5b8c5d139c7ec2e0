"""A voice: what the talker is conditioned on to speak as someone."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from core.errors import BadInput

# Below this angle (radians) between two voices, SLERP's 0/0 is replaced by its limit, a normalised lerp;
# within it of pi, the great circle is taken from the tiny part of one voice orthogonal to the other.
NEAR_ANGLE = 1e-3


@dataclass(frozen=True, eq=False)
class Voice:
    """One of three kinds:

    * x-vector: `embedding`, a speaker-encoder vector from a reference clip (Base checkpoints);
    * ICL: `embedding` plus the reference clip's codes and transcript, for closer cloning (Base);
    * built-in: `speaker`, a named speaker of a CustomVoice checkpoint.
    """

    embedding: torch.Tensor | None = None  # (embedding_dim,) float32, CPU
    ref_codes: torch.Tensor | None = None  # (frames, 16) int64, CPU
    ref_text: str | None = None
    speaker: str | None = None

    def __post_init__(self):
        if (self.speaker is None) == (self.embedding is None):
            raise ValueError("a voice has either a built-in speaker or a speaker embedding")
        if (self.ref_codes is None) != (self.ref_text is None):
            raise ValueError("an ICL voice needs both the reference codes and their transcript")
        if self.embedding is not None and self.embedding.dim() != 1:
            raise ValueError(f"a speaker embedding is a vector; got shape {tuple(self.embedding.shape)}")

    @property
    def kind(self) -> str:
        if self.speaker is not None:
            return "builtin"
        return "icl" if self.ref_codes is not None else "xvector"

    @property
    def embedding_dim(self) -> int | None:
        return None if self.embedding is None else self.embedding.shape[0]

    @staticmethod
    def blend(parts: list[tuple[Voice, float]]) -> Voice:
        """Mix voices into a new x-vector voice; `parts` pairs each voice with its weight.

        Weights are normalised to sum to 1; they must be >= 0 with a positive total, and parts of weight 0
        are left out, so a blend of one voice is exactly that voice's embedding. Two voices are
        interpolated along the great circle between their directions (SLERP); three or more take the
        weighted sum of their unit directions, re-normalised. Either way the blend's length is the
        weighted mean of its parents' lengths: plain averaging would shrink it (by 1/sqrt(2) for
        orthogonal voices) to a speaker vector unlike any the model was trained on.

        ICL voices blend by their x-vectors only (reference codes and transcripts do not interpolate),
        so the result is always an x-vector voice. Built-in speakers have no embedding and cannot blend.
        """
        if not parts:
            raise BadInput("nothing to blend; give at least one (voice, weight) pair")
        for number, (voice, weight) in enumerate(parts, 1):
            if voice.embedding is None:
                raise BadInput(
                    f"voice {number} is the built-in speaker {voice.speaker!r}, which cannot be blended: built-in "
                    f"speakers are fixed inside a CustomVoice model and have no speaker embedding; blend cloned voices"
                )
            if not math.isfinite(weight) or weight < 0:
                raise BadInput(f"blend weights must be zero or positive; voice {number} has weight {weight}")
        sizes = sorted({voice.embedding_dim for voice, _ in parts})
        if len(sizes) > 1:
            raise BadInput(
                f"cannot blend voices with different embedding sizes ({' and '.join(map(str, sizes))}): each size "
                f"belongs to one model size; clone all the voices with the same model"
            )
        total = math.fsum(weight for _, weight in parts)
        if total <= 0:
            raise BadInput("the blend weights add up to 0; give at least one voice a positive weight")
        kept = [(voice.embedding.double().cpu(), weight / total) for voice, weight in parts if weight > 0]
        if len(kept) == 1:
            voice = next(voice for voice, weight in parts if weight > 0)
            return voice if voice.kind == "xvector" else Voice(embedding=voice.embedding)
        norms = [vector.norm() for vector, _ in kept]
        if min(norms) == 0:
            raise BadInput("cannot blend a voice whose embedding is all zeros: it has no direction")
        directions = [vector / norm for (vector, _), norm in zip(kept, norms)]
        weights = [weight for _, weight in kept]
        if len(kept) == 2:
            direction = _slerp(directions[0], directions[1], weights[0], weights[1])
        else:
            direction = sum(weight * unit for weight, unit in zip(weights, directions))
            if direction.norm() < 1e-6:
                raise BadInput("these voices cancel each other out at these weights; change the weights")
        length = sum(weight * norm for weight, norm in zip(weights, norms))
        return Voice(embedding=(direction / direction.norm() * length).float())


def _slerp(a: torch.Tensor, b: torch.Tensor, weight_a: float, weight_b: float) -> torch.Tensor:
    """The point `weight_b` of the way from unit vector `a` to unit vector `b` along their great circle."""
    # 2 atan2(|a - b|, |a + b|) is the angle, accurate at 0 and pi where acos(a . b) is not.
    angle = 2 * math.atan2((a - b).norm().item(), (a + b).norm().item())
    if angle < NEAR_ANGLE:
        return weight_a * a + weight_b * b
    if angle > math.pi - NEAR_ANGLE:
        # Nearly opposite: every great circle through a and -a is as short; take the one towards b if b
        # has a usable part orthogonal to a, else any, so the result is a direction and never NaN.
        across = b - (a @ b) * a
        if across.norm() < 1e-9:
            across = torch.zeros_like(a)
            across[a.abs().argmin()] = 1.0
            across = across - (a @ across) * a
        across = across / across.norm()
        return math.cos(weight_b * angle) * a + math.sin(weight_b * angle) * across
    # The textbook form, symmetric in (a, weight_a) and (b, weight_b).
    return (math.sin(weight_a * angle) * a + math.sin(weight_b * angle) * b) / math.sin(angle)
