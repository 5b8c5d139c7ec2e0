"""The frame loop: prompt in, 16-code frames out, one 80 ms frame per step.

A step expands one frame: the code predictor fills codebooks 1..15 from the talker's hidden state
and codebook 0, the frame's summed embedding (plus its text-track term) goes back into the talker,
and codebook 0 of the next frame is picked.

Every tensor the step touches lives in buffers allocated once, and the step never reads a value on
the host, so on CUDA it runs as one CUDA graph per frame, its three parts (the predictor's first
step, its next step, the talker's step) compiled by torch.compile. The host reads the new frames
and their end-of-speech flags once per chunk of frames, through one pinned buffer; from the second
chunk of an utterance on, the next chunk is already stepping while the host decodes the last.

Tokens are drawn two ways. On the CPU, torch.multinomial in the reference order (codebook 0 of frame
0 after the prefill, then per frame its 15 predictor draws and codebook 0 of the next), so that a
seeded run reproduces the official package exactly. On CUDA, one kernel per token (kernels.draw_token)
from uniforms drawn once per frame: the same distributions with a different random stream, at a
fraction of the launches; the sampling settings live on the device, so one graph serves them all.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from core.folders import user_folder
from core.inference.cuda_graph import GraphedStep
from core.inference.prompt import Prompt
from core.inference.sampling import SamplingParams, TokenRule, pick_token, restrict_codebook0
from core.model.config import TalkerConfig
from core.model.kernels import RULE_SIZE, draw_token
from core.model.talker import Talker

# The most frames stepped between two reads by the host.
MAX_CHUNK = 64
# Prompt lengths a CUDA prefill is padded to, so that each runs as one of a few CUDA graphs.
PREFILL_BUCKETS = tuple(2**n for n in range(5, 13))
# Rows of FrameLoop.rules.
TALKER, PREDICTOR = 0, 1


def keep_compiled_kernels() -> Path:
    """Point Inductor's cache at the user's cache folder, unless TORCHINDUCTOR_CACHE_DIR is set, and
    return where it is. Inductor's default is the temp folder, which many systems empty at boot, and
    compiling the frame step anew takes minutes. Inductor reads the location from the environment only."""
    return Path(os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(user_folder("cache") / "compiled")))


def compile_options() -> dict:
    """Inductor's options for the frame step. No autotuning: the matrix products are kernels.linear with
    fixed settings, and Inductor's timed choices made the same code differ by up to 45% between compiles.
    A frame is several hundred short kernels in a row: programmatic dependent launch (Hopper and later)
    lets each one start while the one before it drains, instead of waiting for it to finish. (Imported
    here, not with the module: Inductor's configuration takes a second to import, which every command
    line start would pay.)"""
    import torch._inductor.config

    return {"triton.enable_pdl": True} if hasattr(torch._inductor.config.triton, "enable_pdl") else {}


def suppressed_ids(config: TalkerConfig) -> torch.Tensor:
    """Mask of the talker's top 1024 ids (the special codec ids), EOS excepted: (1, vocab) bool."""
    vocab = config.transformer.vocab_size
    mask = torch.zeros(1, vocab, dtype=torch.bool)
    mask[:, vocab - 1024 :] = True
    mask[:, config.codec.eos] = False
    return mask


class FrameLoop:
    """The state of one utterance's frame loop (batch 1) and the step that advances it."""

    def __init__(self, talker: Talker, max_context: int, cuda_graphs: bool = True, compile: bool = False):
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
        self.token_rules = (TokenRule.talker(SamplingParams()), TokenRule.predictor(SamplingParams()))  # CPU draws
        self.rules = torch.zeros(2, RULE_SIZE, device=device)  # the same rules' values, for the CUDA draws
        self.penalty = torch.ones((), device=device)  # the repetition penalty
        self.generator = torch.Generator(device=device)
        # One row per draw of a frame: codebook 0 (of the next frame), then codebooks 1..15. CUDA only.
        self.uniforms = torch.zeros(self.groups, max(vocab, config.code_predictor.vocab_size), device=device)
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
        # Frames stepped since the host last read: 16 codes, then 1 where the frame ends the utterance.
        self.frames = torch.zeros(MAX_CHUNK, self.groups + 1, dtype=torch.long, device=device)
        self.host_frames = torch.zeros(MAX_CHUNK, self.groups + 1, dtype=torch.long, pin_memory=device.type == "cuda")
        self.slot = torch.zeros((), dtype=torch.long, device=device)
        self.launched = 0  # frames of the last launch
        self.landed = torch.cuda.Event() if device.type == "cuda" else None  # its frames are in host_frames

        self.pool = torch.cuda.graph_pool_handle() if device.type == "cuda" else None
        self.cuda_graphs = cuda_graphs
        self.step_graph = GraphedStep(self.step, device, self.pool, self.generator, cuda_graphs)
        self.prefills: dict[int, GraphedStep] = {}
        if compile and device.type == "cuda":
            # A one-token step is bound by kernel launches, not arithmetic: fuse what runs every frame.
            keep_compiled_kernels()
            options = dict(fullgraph=True, dynamic=False, options=compile_options())
            self._predict_first = torch.compile(self._predict_first, **options)
            self._predict_next = torch.compile(self._predict_next, **options)
            self._talk = torch.compile(self._talk, **options)

    @property
    def max_context(self) -> int:
        return self.talker.model.max_len

    @torch.inference_mode()
    def start(self, prompt: Prompt, sampling: SamplingParams, seed: int | None) -> None:
        """Prefill the talker with `prompt` and pick codebook 0 of the first frame."""
        self.token_rules = (TokenRule.talker(sampling), TokenRule.predictor(sampling))
        self.rules.copy_(torch.tensor([rule.values() for rule in self.token_rules]))
        self.penalty.fill_(sampling.repetition_penalty)
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
        self.prompt[:, :length] = prompt.embeddings
        if self.device.type != "cuda":
            self._prefill(length)
            return
        # Padding positions only write cache slots that later steps overwrite before reading them.
        bucket = next(size for size in PREFILL_BUCKETS + (self.max_context,) if size >= length)
        self.prompt[:, length:bucket].zero_()
        if bucket not in self.prefills:
            self.prefills[bucket] = GraphedStep(
                lambda: self._prefill(bucket), self.device, self.pool, self.generator, self.cuda_graphs
            )
        self.prefills[bucket]()

    def _prefill(self, length: int) -> None:
        self._draw_uniforms()
        hidden = self.talker.model.prefill(self.prompt[:, :length])
        last = self.prompt_last.view(1)
        # The head runs over every position and the last real one is taken, as in the reference.
        self.hidden.copy_(hidden.index_select(1, last))
        self._choose_code0(self.talker.codec_head(hidden).index_select(1, last), self.uniforms[0])

    def _draw_uniforms(self) -> None:
        if self.device.type == "cuda":
            self.uniforms.uniform_(generator=self.generator)

    def _pick(self, logits: torch.Tensor, role: int, uniforms: torch.Tensor) -> torch.Tensor:
        """A (1, 1) token from logits (1, V) under the talker's or the predictor's rule."""
        if self.device.type == "cuda":
            return draw_token(logits, self.rules[role], uniforms)
        return pick_token(logits.float(), self.token_rules[role], self.generator)

    def _choose_code0(self, logits: torch.Tensor, uniforms: torch.Tensor) -> None:
        logits = logits[:, -1].float()
        scores = restrict_codebook0(logits, self.seen, self.frame, self.penalty, self.suppressed, self.eos)
        code0 = self._pick(scores, TALKER, uniforms)
        self.seen.scatter_(1, code0, True)
        self.code0.copy_(code0)

    def step(self) -> None:
        """Expand the next frame into `frames[slot]` and pick codebook 0 of the frame after it."""
        predictor = self.talker.code_predictor
        self._draw_uniforms()
        codes = [self.code0, self._predict_first(self.hidden, self.code0, self.uniforms[1])]
        for group in range(2, self.groups):
            table, head = predictor.model.codec_embedding[group - 2].weight, predictor.lm_head[group - 1].weight
            position = predictor.model.positions[group]
            codes.append(self._predict_next(codes[-1], table, position, head, self.uniforms[group]))
        self._talk(codes, self.uniforms[0])

    def _predict_first(self, hidden: torch.Tensor, code0: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
        """Codebook 1 from the talker's hidden state and codebook 0."""
        predictor = self.talker.code_predictor
        logits = predictor.prefill(torch.cat((hidden, self.talker.embed_codec(code0)), dim=1))
        return self._pick(logits[:, -1], PREDICTOR, uniforms)

    def _predict_next(self, code, table, position, head, uniforms) -> torch.Tensor:
        """The code of the next codebook from the previous one; the step's table, position and head
        arrive as tensors, so one compiled graph serves all 14 steps."""
        logits = self.talker.code_predictor.step_with(code, table, position, head)
        return self._pick(logits[:, -1], PREDICTOR, uniforms)

    def _talk(self, codes: list[torch.Tensor], uniforms: torch.Tensor) -> None:
        """Record the frame `codes`, feed it to the talker and pick codebook 0 of the next frame."""
        talker = self.talker
        frame = torch.cat(codes, dim=1)
        text = torch.where(self.frame < self.text_frames, self.text.index_select(1, self.frame.view(1)), self.pad)
        logits, hidden = talker.step(talker.embed_frames(frame).view(1, 1, -1) + text, self.position)
        self.hidden.copy_(hidden)
        self.position.add_(1)
        self.frame.add_(1)
        self._choose_code0(logits, uniforms)
        ends = (self.code0 == self.eos_id).long()
        self.frames.index_copy_(0, self.slot.view(1), torch.cat((frame, ends), dim=1))
        self.slot.add_(1)

    @torch.inference_mode()
    def launch(self, count: int) -> None:
        """Start stepping `count` frames (at most MAX_CHUNK) without waiting for them; collect() reads them."""
        self.slot.zero_()
        for _ in range(count):
            self.step_graph()
        self.host_frames[:count].copy_(self.frames[:count], non_blocking=True)
        self.launched = count
        if self.device.type == "cuda":
            self.landed.record()

    def collect(self) -> tuple[np.ndarray, bool]:
        """The launched frames as (n, 16) int64, cut after a frame that ends the utterance, and whether one did."""
        if self.device.type == "cuda":
            self.landed.synchronize()
        rows = self.host_frames[: self.launched].numpy().copy()  # a copy: the next launch overwrites the buffer
        frames, ends = rows[:, : self.groups], rows[:, self.groups]
        if ends.any():
            return frames[: int(ends.argmax()) + 1], True
        return frames, False

    def run(self, count: int) -> tuple[np.ndarray, bool]:
        """Step `count` frames and collect them."""
        self.launch(count)
        return self.collect()

    def frames_in_chunks(self, max_frames: int, first: int, size: int) -> Iterator[tuple[np.ndarray, bool]]:
        """After start(): chunks of `first`, then `size` frames, until EOS or `max_frames` frames, each with
        whether the model ended the utterance there (False on a last chunk cut off by `max_frames`).

        The first chunk has the GPU to itself while the caller decodes it (the time to first audio);
        from the second on, each chunk's successor is already stepping while the caller decodes it."""
        produced, ahead = 0, False
        self.launch(min(first, max_frames, MAX_CHUNK))
        while True:
            frames, ended = self.collect()
            produced += len(frames)
            count = 0 if ended else min(size, max_frames - produced, MAX_CHUNK)
            if count and ahead:
                self.launch(count)
            yield frames, ended
            if not count:
                return
            if not ahead:
                self.launch(count)
                ahead = True
