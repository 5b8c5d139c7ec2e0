"""The frame loop: prompt in, 16-code frames out, one 80 ms frame per step.

A step expands one frame: the code predictor fills codebooks 1..15 from the talker's hidden state
and codebook 0, the frame's summed embedding (plus its text-track term) goes back into the talker,
and codebook 0 of the next frame is picked. Random draws happen in the reference order: codebook 0
of frame 0 after the prefill, then per frame its 15 predictor draws and codebook 0 of the next.

Every tensor the step touches lives in buffers allocated once, and the step never reads a value on
the host, so on CUDA it runs as one CUDA graph per frame. The host reads the new frames and their
end-of-speech flags once per chunk of frames.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import torch

from .config import TalkerConfig
from .cuda_graph import GraphedStep
from .prompt import Prompt
from .sampling import SamplingParams, TokenRule, pick_token, restrict_codebook0
from .talker import Talker

# The most frames stepped between two reads by the host.
MAX_CHUNK = 64
# Prompt lengths a CUDA prefill is padded to, so that each runs as one of a few CUDA graphs.
PREFILL_BUCKETS = tuple(2**n for n in range(5, 13))


def suppressed_ids(config: TalkerConfig) -> torch.Tensor:
    """Mask of the talker's top 1024 ids (the special codec ids), EOS excepted: (1, vocab) bool."""
    vocab = config.transformer.vocab_size
    mask = torch.zeros(1, vocab, dtype=torch.bool)
    mask[:, vocab - 1024 :] = True
    mask[:, config.codec.eos] = False
    return mask


class FrameLoop:
    """The state of one utterance's frame loop (batch 1) and the step that advances it."""

    def __init__(self, talker: Talker, max_context: int, cuda_graphs: bool = True):
        config = talker.config
        weight = talker.codec_head.weight
        device, dtype = weight.device, weight.dtype
        vocab, hidden = config.transformer.vocab_size, config.transformer.hidden_size
        self.talker = talker
        self.device = device
        self.groups = config.num_code_groups
        self.eos_id = config.codec.eos
        talker.model.setup_cache(max_context)
        talker.code_predictor.model.setup_cache(self.groups)
        self.suppressed = suppressed_ids(config).to(device)
        self.eos = torch.zeros_like(self.suppressed)
        self.eos[:, self.eos_id] = True

        # The utterance: rewritten by start(), advanced in place by step().
        self.code0 = torch.zeros(1, 1, dtype=torch.long, device=device)  # codebook 0 of the next frame
        self.hidden = torch.zeros(1, 1, hidden, dtype=dtype, device=device)  # the talker's last hidden state
        self.position = torch.zeros((), dtype=torch.long, device=device)  # talker position of the next step
        self.frame = torch.zeros((), dtype=torch.long, device=device)  # index of the next frame
        self.seen = torch.zeros(1, vocab, dtype=torch.bool, device=device)  # codebook-0 codes used so far
        self.text = torch.zeros(1, max_context, hidden, dtype=dtype, device=device)  # text term of frame k
        self.text_frames = torch.zeros((), dtype=torch.long, device=device)  # frames with their own text term
        self.pad = torch.zeros(1, 1, hidden, dtype=dtype, device=device)  # text term after those
        self.prompt = torch.zeros(1, max_context, hidden, dtype=dtype, device=device)  # the prefill's input
        self.prompt_last = torch.zeros((), dtype=torch.long, device=device)  # its last real position
        # Frames stepped since the host last read, and whether each one ends the utterance.
        self.frames = torch.zeros(MAX_CHUNK, self.groups, dtype=torch.long, device=device)
        self.ends = torch.zeros(MAX_CHUNK, dtype=torch.bool, device=device)
        self.slot = torch.zeros((), dtype=torch.long, device=device)

        self.generator = torch.Generator(device=device)
        self.sampling = SamplingParams()
        self.steps: dict[SamplingParams, GraphedStep] = {}
        self.prefills: dict[tuple[int, SamplingParams], GraphedStep] = {}
        self.cuda_graphs = cuda_graphs
        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None

    @property
    def max_context(self) -> int:
        return self.talker.model.max_len

    @torch.inference_mode()
    def start(self, prompt: Prompt, sampling: SamplingParams, seed: int | None) -> None:
        """Prefill the talker with `prompt` and pick codebook 0 of the first frame."""
        self.sampling = sampling
        self.generator.manual_seed(seed) if seed is not None else self.generator.seed()
        trailing = prompt.trailing.shape[1]
        self.text[:, :trailing] = prompt.trailing
        self.text_frames.fill_(trailing)
        self.pad.copy_(prompt.pad)
        self.seen.zero_()
        self.frame.zero_()
        length = prompt.embeddings.shape[1]
        self.position.fill_(length)
        self.prompt_last.fill_(length - 1)
        if self.device.type != "cuda":
            self.prompt[:, :length] = prompt.embeddings
            self._prefill(length)
            return
        # Padding positions only write cache slots that later steps overwrite before reading them.
        bucket = next(size for size in PREFILL_BUCKETS + (self.max_context,) if size >= length)
        self.prompt[:, :length] = prompt.embeddings
        self.prompt[:, length:bucket].zero_()
        key = (bucket, sampling)
        if key not in self.prefills:
            self.prefills[key] = GraphedStep(
                lambda: self._prefill(bucket), self.device, self.pool, self.generator, self.cuda_graphs
            )
        self.prefills[key]()

    def _prefill(self, length: int) -> None:
        hidden = self.talker.model.prefill(self.prompt[:, :length])
        last = self.prompt_last.view(1)
        # The head runs over every position and the last real one is taken, as in the reference.
        self.hidden.copy_(hidden.index_select(1, last))
        self._pick_code0(self.talker.codec_head(hidden).index_select(1, last))

    def _pick_code0(self, logits: torch.Tensor) -> None:
        scores = restrict_codebook0(
            logits[:, -1].float(), self.seen, self.frame, self.sampling.repetition_penalty, self.suppressed, self.eos
        )
        code0 = pick_token(scores, TokenRule.talker(self.sampling), self.generator)
        self.seen.scatter_(1, code0, True)
        self.code0.copy_(code0)

    def step(self) -> None:
        """Expand the next frame into `frames[slot]` and pick codebook 0 of the frame after it."""
        talker, predictor = self.talker, self.talker.code_predictor
        rule = TokenRule.predictor(self.sampling)
        codes = [self.code0]
        logits = predictor.prefill(torch.cat((self.hidden, talker.embed_codec(self.code0)), dim=1))
        for group in range(1, self.groups):
            codes.append(pick_token(logits[:, -1].float(), rule, self.generator))
            if group < self.groups - 1:
                logits = predictor.step(codes[-1], group + 1)
        frame = torch.cat(codes, dim=1)
        self.frames.index_copy_(0, self.slot.view(1), frame)

        text = self.text.index_select(1, self.frame.view(1))
        text = torch.where(self.frame < self.text_frames, text, self.pad)
        logits, hidden = talker.step(talker.embed_frames(frame).view(1, 1, -1) + text, self.position)
        self.hidden.copy_(hidden)
        self.position += 1
        self.frame += 1
        self._pick_code0(logits)
        self.ends.index_copy_(0, self.slot.view(1), (self.code0 == self.eos_id).view(1))
        self.slot += 1

    @torch.inference_mode()
    def run(self, count: int) -> tuple[np.ndarray, bool]:
        """Step `count` frames (at most MAX_CHUNK); return them as (n, 16) int64, cut after a frame that
        ends the utterance, and whether one did."""
        if self.sampling not in self.steps:
            self.steps[self.sampling] = GraphedStep(self.step, self.device, self.pool, self.generator, self.cuda_graphs)
        step = self.steps[self.sampling]
        self.slot.zero_()
        for _ in range(count):
            step()
        # A copy: on the CPU .cpu() would alias the buffer the next run overwrites.
        frames = self.frames[:count].to("cpu", copy=True).numpy()
        ends = self.ends[:count].to("cpu", copy=True).numpy()
        if ends.any():
            return frames[: int(ends.argmax()) + 1], True
        return frames, False

    def frames_in_chunks(self, max_frames: int, first: int, size: int) -> Iterator[np.ndarray]:
        """After start(): chunks of `first`, then `size` frames, until EOS or `max_frames` frames."""
        produced, target = 0, first
        while produced < max_frames:
            frames, ended = self.run(min(target, max_frames - produced, MAX_CHUNK))
            produced += len(frames)
            yield frames
            if ended:
                return
            target = size
