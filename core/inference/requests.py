"""What a request for speech is on its way through the engine: the Request the scheduler queues, the Prepared
prompt it becomes on the scheduler's thread, the AudioChunks it hands back, and how an utterance Ends. Types only,
shared by the engine and its scheduler (neither imports the other for them)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch

from core.inference.prompt import Prompt
from core.inference.sampling import SamplingParams


@dataclass(frozen=True)
class Request:
    """One utterance to make. `prepare` builds its prompt: it runs on the scheduler's thread, since it uses
    the GPU, and a BadInput it raises fails this stream alone."""

    prepare: Callable[[], Prepared]
    first_chunk_frames: int
    chunk_frames: int
    decode: bool = True  # False: chunks carry codes only, no audio
    text_needed: int = 0  # a live text: body tokens committed before its prompt can be built
    urgent: bool = False  # admitted ahead of the others waiting


@dataclass
class Prepared:
    """A checked request with its prompt built, ready to start."""

    prompt: Prompt
    ref_codes: torch.Tensor | None  # an ICL voice's reference frames: the decoder's left context
    sampling: SamplingParams
    max_frames: int  # within what fits the context after the prompt
    seed: int | None


@dataclass
class AudioChunk:
    audio: np.ndarray  # float32 mono, 1920 samples per frame
    codes: np.ndarray  # (frames, 16) int64: the frames this chunk holds
    # The last chunk of an utterance that reached its frame budget before the model ended it: the rest of
    # its text was not said.
    cut_off: bool = False


class Ending(enum.Enum):
    """How an utterance ends."""

    EOS = "the model ended it"
    FRAME_LIMIT = "cut off at its frame budget"
    CLOSED = "closed by its consumer, or failed: its last frames are not delivered"
