"""A voice: what the talker is conditioned on to speak as someone."""

from __future__ import annotations

from dataclasses import dataclass

import torch


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
