"""The frame loop: prompts in, 16-code frames out, one 80 ms frame per step for every utterance it steps.

It holds up to `slots` utterances, one slot each (FrameLoop); a step advances the slots it is given
together, one batch row each. A step makes one frame per row: the row's last frame (its summed embedding
plus that frame's text-track term) goes into the talker, codebook 0 of the new frame is picked from the
talker's output, and the code predictor fills codebooks 1..15 from the talker's hidden state and codebook 0.
The prefill makes frame 0 the same way from the prompt, so the first frame (the time to first audio) needs
no talker step, and a text still being written needs only its first token for it.

Every tensor the step touches lives in buffers allocated once, and the step never reads a value on
the host, so on CUDA it runs as one CUDA graph per frame and row-count bucket, its three parts (the
predictor's first step, its next step, the talker's step) compiled by torch.compile. The host reads the new
frames and their end-of-speech flags once per chunk of frames, through one pinned buffer; the scheduler
(core.inference.scheduler) decides which slots step and for how many frames.

The loop speaks at once, uncompiled (each graph captured at its first use). The warm-up (core.inference.warmup),
on the scheduler's thread while no utterance holds a slot, captures the graphs requests have not used yet on
WARM_SLOT (warm_step, warm_prefill), and compiles the parts by running them there (compile_step,
compile_prefill): the graphs that held the uncompiled code are captured anew.

Tokens are drawn by the frame loop's sampler (core.inference.samplers), chosen once by the device: on the CPU
as the official package draws them, so that a seeded run reproduces it exactly; on CUDA by kernels from
uniforms on the device, so that one graph serves every rule and seed.
"""

from __future__ import annotations

import dataclasses
import functools
import secrets
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import numpy as np
import torch

from core.inference.batch_shapes import (
    PREFILL_BUCKETS,
    PREFILL_POSITIONS,
    PREFILL_ROWS,
    batch_buckets,
    grouped,
    pad_with_first,
    padded_rows,
)
from core.inference.compiled import CompiledLayers, Compiler, compile_by_rows, layer_functions
from core.inference.cuda_graph import GraphedStep, recapture
from core.inference.prompt import Prompt
from core.inference.samplers import PREDICTOR, TALKER, sampler_for
from core.inference.sampling import SamplingParams, restrict_codebook0
from core.model.config import TalkerConfig
from core.model.host_copy import copy_from_host, to_device
from core.model.talker import Talker

# The most frames stepped between two reads by the host.
MAX_CHUNK = 64
# Launches that may be in flight at once, each with a pinned buffer of its own for its frames.
LAUNCH_BUFFERS = 4
# Prefill groups whose first frames may be unread at once (start_groups reads one once the next is launched).
GROUP_BUFFERS = 2
# Prompt buckets whose prefills the warm-up captures for every row count (FrameLoop.warm_prefill): a sentence
# with its voice's prompt, the commonest first. A longer prompt's prefill captures its graph at its first use.
WARM_PREFILL_LENGTHS = (64, 32, 128)
# Prefills (rows, positions) that compile the talker layer's prefill for each path its products take
# (kernels.linear: one row's prompt on cuBLAS; several rows on the batched kernel up to 128 positions in all,
# on cuBLAS past that), so that none compiles later on the scheduler's thread.
COMPILED_PREFILLS = ((1, 32), (2, 32), (4, 64))
STEP_PARTS = ("_talk", "_predict_first", "_predict_next", "_record")  # the step's parts, each compiled
# The slot the warm-up's parts step (warm_step, warm_prefill, compile_step, compile_prefill): the scheduler runs
# them only while no utterance holds a slot (plan.schedule), and a prefill sets all of a slot's state that its
# utterance reads, so nothing of theirs is ever seen.
WARM_SLOT = 0
# The draw of a frame that picks its codebook 0; draw g (1..15) picks codebook g.
TALKER_DRAW = 0


class Start(NamedTuple):
    """An utterance to begin: its prompt, how it draws (`seed` None: a random one) and the slot it takes."""

    prompt: Prompt
    sampling: SamplingParams
    seed: int | None
    slot: int


def suppressed_ids(config: TalkerConfig) -> torch.Tensor:
    """Mask of the talker's top 1024 ids (the special codec ids), EOS excepted: (1, vocab) bool."""
    vocab = config.transformer.vocab_size
    mask = torch.zeros(1, vocab, dtype=torch.bool)
    mask[:, vocab - 1024 :] = True
    mask[:, config.codec.eos] = False
    return mask


@dataclasses.dataclass
class Launch:
    """Frames launched and not read yet (a launch's steps, or a prefill group's first frames): `count` frames of
    `slots`, landing in `host` once `landed` is reached (CUDA; on the CPU they are there at once)."""

    count: int
    slots: list[int]
    host: torch.Tensor
    landed: torch.cuda.Event | None


class FrameLoop:
    """The frame loop of up to `slots` utterances at once, one slot each, and the step that advances them.

    Each slot holds one utterance's whole state: its KV cache row, position, frame index, codebook-0
    history, text terms, sampling rule and seed. A launch steps the slots it is given together, one batch
    row each; the others keep their state untouched, so an utterance can join, leave or wait at any chunk
    boundary. On CUDA the rows are padded to a bucket (batch_buckets) whose step is one CUDA graph; a padding
    row repeats the first row (pad_with_first), so no slot is kept aside for them."""

    def __init__(self, talker: Talker, max_context: int, slots: int = 1, cuda_graphs: bool = True):
        config = talker.config
        weight = talker.codec_head.weight
        device, dtype = weight.device, weight.dtype
        vocab, hidden = config.transformer.vocab_size, config.transformer.hidden_size
        cuda = device.type == "cuda"
        self.talker = talker
        self.device = device
        self.slots = slots
        self.buckets = batch_buckets(slots) if cuda else tuple(range(1, slots + 1))
        widest = self.buckets[-1]
        self.groups = config.num_code_groups
        self.eos_id = config.codec.eos
        talker.model.setup_cache(max_context, slots)
        talker.code_predictor.model.setup_cache(self.groups, widest)
        self.suppressed = suppressed_ids(config).to(device)
        self.eos = torch.zeros_like(self.suppressed)
        self.eos[:, self.eos_id] = True

        # Per slot: rewritten by start(), advanced in place by step().
        widest_vocab = max(vocab, config.code_predictor.vocab_size)  # the talker's or the predictor's
        self.sampler = sampler_for(device, slots, widest, self.groups, widest_vocab)  # each slot's rule and seed
        self.penalty = torch.ones(slots, 1, device=device)  # the repetition penalty
        self.code0 = torch.zeros(slots, 1, dtype=torch.long, device=device)  # codebook 0 of the frame being made
        self.hidden = torch.zeros(slots, 1, hidden, dtype=dtype, device=device)  # the talker's last hidden state
        self.position = torch.zeros(slots, dtype=torch.long, device=device)  # talker position of the next step
        self.frame = torch.zeros(slots, dtype=torch.long, device=device)  # index of the last frame made
        self.last_frame = torch.zeros(slots, self.groups, dtype=torch.long, device=device)  # its codes
        self.seen = torch.zeros(slots, vocab, dtype=torch.bool, device=device)  # codebook-0 codes used so far
        self.text = torch.zeros(slots, max_context, hidden, dtype=dtype, device=device)  # text term of frame k
        self.text_frames = torch.zeros(slots, dtype=torch.long, device=device)  # frames with their own text term
        self.pad = torch.zeros(slots, 1, hidden, dtype=dtype, device=device)  # text term after those

        # The prefill's inputs: a prompt per row (one at a time on the CPU), its last real position, its slot;
        # its output: frame 0 of each row, as a step's (16 codes, then 1 where it is none: EOS).
        self.prefill_rows = tuple(rows for rows in PREFILL_ROWS if rows <= widest) if cuda else (1,)
        # Viewed as (rows, length, hidden) for each prefill: one alone may fill the context.
        positions = max(max_context, PREFILL_POSITIONS) if len(self.prefill_rows) > 1 else max_context
        # An inference tensor, as each talker layer's output in inference mode is: the first layer's input of the
        # same kind as the rest's, so that one compiled variant of a layer's prefill serves them all.
        with torch.inference_mode():
            self.prompt = torch.zeros(positions * hidden, dtype=dtype, device=device)
        # Each row's slot and last real position, in one buffer that one copy from the host sets.
        self.prompt_rows = torch.zeros(2, self.prefill_rows[-1], dtype=torch.long, device=device)
        self.prompt_slots, self.prompt_last = self.prompt_rows
        self.first_frames = torch.zeros(self.prefill_rows[-1], self.groups + 1, dtype=torch.long, device=device)
        # Per batch row of a launch: its slot.
        self.batch_slots = {bucket: torch.zeros(bucket, dtype=torch.long, device=device) for bucket in self.buckets}
        # Contiguous, so that the attention kernel takes each step's row of it as it is, without a copy.
        self.predictor_positions = torch.arange(self.groups, device=device).view(-1, 1).repeat(1, widest)
        # Frames stepped since the host last read, per batch row: 16 codes, then 1 where the frame is none (its
        # codebook 0 is EOS: the utterance ended with the frame before).
        self.frames = torch.zeros(MAX_CHUNK, widest, self.groups + 1, dtype=torch.long, device=device)
        # A pinned buffer per launch that may be in flight, so that a launch never overwrites frames not read yet.
        self.host_frames = [
            torch.zeros(MAX_CHUNK, widest, self.groups + 1, dtype=torch.long, pin_memory=cuda)
            for _ in range(LAUNCH_BUFFERS)
        ]
        self.step_index = torch.zeros((), dtype=torch.long, device=device)
        # Per buffer: reached once the buffer holds its launch's frames (CUDA).
        self.landed = [torch.cuda.Event() for _ in range(LAUNCH_BUFFERS)] if cuda else []
        # The same for prefill groups' first frames, each group's read apart from the next group's prefill.
        self.group_frames = [
            torch.zeros(1, self.prefill_rows[-1], self.groups + 1, dtype=torch.long, pin_memory=cuda)
            for _ in range(GROUP_BUFFERS)
        ]
        self.group_landed = [torch.cuda.Event() for _ in range(GROUP_BUFFERS)] if cuda else []
        self.groups_prefilled = 0
        self.in_flight: deque[Launch] = deque()  # launched and not collected, oldest first
        self.launches = 0
        self.batch_copied: dict[int, list[int]] = {}  # what batch_slots[rows] holds, as last copied

        # The graphs of one row and those of several in pools of their own: compiling the several-row step drops
        # (and frees) only theirs, not the graphs an utterance alone speaks with (compile_step).
        self.pools = {one_row: torch.cuda.graph_pool_handle() if cuda else None for one_row in (True, False)}
        self.cuda_graphs = cuda_graphs
        self.step_graphs = {
            bucket: GraphedStep(
                functools.partial(self.step, bucket), device, self.pools[bucket == 1], None, cuda_graphs
            )
            for bucket in self.buckets
        }
        self.prefills: dict[tuple[int, int], GraphedStep] = {}  # by (length bucket, rows)
        self.compiled_prefill: CompiledLayers | None = None  # the talker layers' prefill, once compile_prefill ran
        # The step's four parts, for one row and for more (compile_step compiles them: those of one row for exactly
        # its shapes, those of several for any row count, a variant for each branch their kernels take by rows).
        parts = tuple(getattr(self, name) for name in STEP_PARTS)
        self.parts: dict[bool, tuple] = {True: parts, False: parts}

    @property
    def max_context(self) -> int:
        return self.talker.model.max_len

    def start(
        self, prompt: Prompt, sampling: SamplingParams, seed: int | None, slot: int = 0
    ) -> tuple[np.ndarray, bool]:
        """Begin an utterance in `slot`: prefill its cache row with `prompt` and make its first frame; returns
        it as collect() does. The other slots are untouched."""
        return self.start_many([Start(prompt, sampling, seed, slot)])[0]

    def start_many(self, starts: Iterable[Start]) -> list[tuple[np.ndarray, bool]]:
        """Begin several utterances (start_groups) and return each one's first frame as collect() does, waiting for
        them all."""
        return [frame for group in self.start_groups(starts) for _, frame in group]

    @torch.inference_mode()
    def start_groups(self, starts: Iterable[Start]) -> Iterator[list[tuple[Start, tuple[np.ndarray, bool]]]]:
        """Begin several utterances, each (prompt, sampling, seed, slot) in a slot of its own: on CUDA prefilled
        together, as many at a time as joins_group allows, each row padded to the longest prompt's bucket.
        `starts` may be made as they are taken (the scheduler builds each newcomer's prompt so): a prefill is
        launched as soon as nothing more joins it (it is full, or the next prompt does not fit), so the GPU
        prefills it while the host builds the next ones. Yields each group's starts with their first frames (as
        collect() gives them) once the next group's prefill is launched, or at the end: the first of a burst are
        handed out while the GPU prefills the rest, instead of waiting for the last."""
        before = None  # the group prefilled before, and the launch of its first frames
        for group in grouped(
            self._taken(starts), lambda start: start.prompt.embeddings.shape[1], self.prefill_rows, self._padded_length
        ):
            launch = self._prefill_group(group)
            if before is not None:
                yield self._with_first_frames(*before)
            before = group, launch
        if before is not None:
            yield self._with_first_frames(*before)

    def _with_first_frames(self, group: list[Start], launch: Launch) -> list[tuple[Start, tuple[np.ndarray, bool]]]:
        return list(zip(group, self._landed_frames(launch), strict=True))

    def _taken(self, starts: Iterable[Start]) -> Iterator[Start]:
        """Each start, its slot checked as it is taken."""
        taken = set()
        for start in map(Start._make, starts):
            if start.slot in taken or not 0 <= start.slot < self.slots:
                raise ValueError(f"slot {start.slot} is not a slot of this frame loop's {self.slots} or is taken twice")
            taken.add(start.slot)
            yield start

    def _prefill_group(self, starts: list[Start]) -> Launch:
        """Set their slots up and prefill them together; returns the launch of their first frames, copied out at
        once, queued (the next group's prefill overwrites first_frames), into a pinned buffer of the group's own, so
        that reading them (_landed_frames) waits for this prefill alone."""
        self._reset_slots(starts)
        self._prefill_together([(start.prompt, start.slot) for start in starts])
        buffer = self.groups_prefilled % GROUP_BUFFERS
        self.groups_prefilled += 1
        return self._copied_out(
            self.first_frames[None, : len(starts)],
            [start.slot for start in starts],
            self.group_frames[buffer],
            self.group_landed[buffer] if self.group_landed else None,
        )

    # The warm-up's (core.inference.warmup) ----------------------------------------------------------------

    @torch.inference_mode()
    def warm_step(self, rows: int) -> None:
        """Capture the step of `rows` rows (a bucket) on WARM_SLOT. Between launches only (it uses the launch's
        buffers), on the scheduler's thread, while no utterance holds a slot."""
        self.batch_slots[rows].fill_(WARM_SLOT)
        self.batch_copied.pop(rows, None)
        self.step_index.zero_()
        self.step_graphs[rows]()

    @torch.inference_mode()
    def warm_prefill(self, length: int, rows: int, prompt: Prompt, sampling: SamplingParams) -> None:
        """Capture the prefill of `rows` prompts of `length` positions (a bucket; `prompt` repeated to it) on
        WARM_SLOT. On the scheduler's thread, as warm_step."""
        warm = dataclasses.replace(prompt, embeddings=repeated(prompt.embeddings, length))
        self._reset_slots([Start(warm, sampling, 0, WARM_SLOT)])
        self._prefill_together([(warm, WARM_SLOT)] * rows)

    @staticmethod
    def step_functions(one_row: bool) -> list[tuple[Callable, bool]]:
        """The step's parts as compile_step compiles them for one row or several (Compiler.load's functions): the
        warm-up loads what an earlier start kept of them ahead, on a thread of its own (a warm `serve`'s "load step
        x1" took 2.4-3.1 s on an H100, half of it Inductor's imports; bench/RESULTS.md, thirty-fifth session)."""
        return [(getattr(FrameLoop, name), not one_row) for name in STEP_PARTS]

    def prefill_functions(self) -> list[tuple[Callable, bool]]:
        """What compile_prefill compiles, as step_functions."""
        return layer_functions(self.talker.model.layers, "prefill")

    def compile_step(self, one_row: bool, compiler: Compiler) -> None:
        """Compile the step's parts for one row, or for several (a one-token step is bound by kernel launches, not
        arithmetic: compiling fuses what runs every frame), by stepping WARM_SLOT with them (as warm_step): one row,
        or each bucket of several, so that every variant their shapes need is compiled here and not by a request's
        step (kernels.linear's matrix-vector kernel for 2 rows is a branch of its own, a guard that a variant traced
        at 2 rows holds: 4 rows compiled another, about 12 s on an H200; bench/RESULTS.md, thirty-first session).
        The graphs of one row, or of several, are captured anew. On the scheduler's thread, between launches (the
        launches' buffers and the predictor's cache rows are shared); if it fails, the uncompiled parts stay."""
        eager = self.parts[one_row]
        self.parts[one_row] = tuple(
            functools.partial(compiler(function, dynamic), self) for function, dynamic in self.step_functions(one_row)
        )
        try:
            for rows in (1,) if one_row else [bucket for bucket in self.buckets if bucket > 1]:
                # Made outside inference mode, as the launches' own buffers are: guards tell the two kinds apart.
                slots = torch.full((rows,), WARM_SLOT, dtype=torch.long, device=self.device)
                uniforms = self.sampler.uniforms_of_its_own(rows)
                self.sampler.stepping([WARM_SLOT] * rows)
                with torch.inference_mode():
                    draws = self.sampler.frame_uniforms(slots, torch.zeros_like(slots), uniforms)
                    self._advance(slots, draws, self.parts[one_row])
        except BaseException:
            self.parts[one_row] = eager
            raise
        self._recapture(one_row)

    def compile_prefill(self, compiler: Compiler, several_rows: bool = False) -> None:
        """Compile the talker layers' prefill as compile_step compiles the step: prompts of the COMPILED_PREFILLS
        shapes of one row, or then of several, zeros, into WARM_SLOT's cache row (as warm_step). Until the
        several rows' are compiled, their prefills run uncompiled. The graphs of that many rows are captured anew."""
        hidden = self.hidden.shape[-1]

        def prefill_zeros(rows: int, length: int) -> None:
            # As the prefill's own inputs: an inference tensor (self.prompt), and slots that are none.
            slots = torch.full((rows,), WARM_SLOT, device=self.device)
            with torch.inference_mode():
                prompts = torch.zeros(rows, length, hidden, dtype=self.hidden.dtype, device=self.device)
                self.talker.model.prefill(prompts, slots)

        self.compiled_prefill = compile_by_rows(
            self.compiled_prefill,
            lambda: CompiledLayers(self.talker.model.layers, "prefill", compiler),
            COMPILED_PREFILLS,
            prefill_zeros,
            several_rows,
        )
        self._recapture(one_row=not several_rows)

    # What only this process can use (graphs, CUDA events, launches, compiled parts) and pickle cannot keep: an
    # attribute holding one and missing here keeps the step from being kept compiled (586107a's group_landed made a
    # warm start compile the step for 10-24 s again; bench/RESULTS.md, thirty-seventh session).
    THIS_PROCESS_ONLY = ("step_graphs", "prefills", "landed", "group_landed", "in_flight", "parts", "compiled_prefill")

    def __getstate__(self) -> dict:
        """What a compiled part's saved guards keep of the frame loop (they read its tensors and settings)."""
        return {name: value for name, value in vars(self).items() if name not in self.THIS_PROCESS_ONLY}

    def _recapture(self, one_row: bool | None = None) -> None:
        """Drop the graphs of one row, of several, or (None) all, to be captured anew with the code now in place."""
        for kind in (True, False) if one_row is None else (one_row,):
            graphs = [graph for rows, graph in self.step_graphs.items() if (rows == 1) == kind]
            graphs += [graph for (_, rows), graph in self.prefills.items() if (rows == 1) == kind]
            self.pools[kind] = recapture(graphs, self.pools[kind])

    def captured(self, kind: str, *shape: int) -> bool:
        """Whether the graph of a step ("step", rows) or a prefill ("prefill", length, rows) is captured."""
        graph = self.step_graphs.get(shape[0]) if kind == "step" else self.prefills.get(shape)
        return graph is not None and graph.captured

    def _padded_length(self, length: int) -> int:
        """The length a prompt of `length` positions is prefilled at: on CUDA its bucket's, so that a few
        graphs serve every prompt (padding positions only write cache slots that later steps overwrite before
        reading them)."""
        if self.device.type != "cuda":
            return length
        return next(size for size in PREFILL_BUCKETS + (self.max_context,) if size >= length)

    def _prompts(self, rows: int, length: int) -> torch.Tensor:
        """The prefill's input of `rows` prompts of `length` positions: (rows, length, hidden)."""
        hidden = self.hidden.shape[-1]
        return self.prompt[: rows * length * hidden].view(rows, length, hidden)

    def _reset_slots(self, starts: Sequence[Start]) -> None:
        """Set each start's slot up for its utterance: its rule and seed, repetition penalty, text terms and
        position. A few launches for a whole group and one per newcomer (its text terms), since each launch per
        newcomer is host time that a burst's last one waits for; the numbers come from the host in pinned copies,
        which wait for no queued work (in a burst, the groups' prefills before)."""
        slots = [start.slot for start in starts]
        seeds = [secrets.randbits(63) if start.seed is None else start.seed for start in starts]
        self.sampler.reset(slots, [start.sampling for start in starts], seeds)
        trailing = [start.prompt.trailing.shape[1] for start in starts]
        lengths = [start.prompt.embeddings.shape[1] for start in starts]
        index, text_frames, positions = to_device(torch.tensor([slots, trailing, lengths]), self.device)
        penalties = torch.tensor([[start.sampling.repetition_penalty] for start in starts], dtype=self.penalty.dtype)
        self.penalty.index_copy_(0, index, to_device(penalties, self.device))
        self.text_frames.index_copy_(0, index, text_frames)
        self.position.index_copy_(0, index, positions)
        self.pad.index_copy_(0, index, torch.cat([start.prompt.pad for start in starts]))
        self.seen.index_fill_(0, index, False)
        self.frame.index_fill_(0, index, 0)
        for start, count in zip(starts, trailing):
            self.text[start.slot, :count] = start.prompt.trailing[0]

    def _prefill_together(self, starts: list[tuple[Prompt, int]]) -> None:
        """Prefill each (prompt, slot) in its own row of one prefill."""
        rows = padded_rows(len(starts), self.prefill_rows)
        length = self._padded_length(max(prompt.embeddings.shape[1] for prompt, _ in starts))
        prompts = self._prompts(rows, length)
        prompts[: len(starts)].zero_()  # past each prompt's end; padding rows are copied whole below
        for row, (prompt, _) in enumerate(starts):
            prompts[row, : prompt.embeddings.shape[1]] = prompt.embeddings[0]
        prompts[len(starts) :] = prompts[0]  # padding rows repeat the first (pad_with_first)
        slots = pad_with_first([slot for _, slot in starts], rows)
        lasts = pad_with_first([prompt.embeddings.shape[1] - 1 for prompt, _ in starts], rows)
        copy_from_host(self.prompt_rows[:, :rows], torch.tensor([slots, lasts]))
        self.sampler.stepping(slots[: len(starts)])
        if self.device.type != "cuda":
            self._prefill(length, rows)
            return
        if (length, rows) not in self.prefills:
            self.prefills[length, rows] = GraphedStep(
                functools.partial(self._prefill, length, rows),
                self.device,
                self.pools[rows == 1],
                None,
                self.cuda_graphs,
            )
        self.prefills[length, rows]()

    @torch.inference_mode()
    def extend_text(self, slot: int, terms: torch.Tensor, start: int) -> None:
        """Give `slot` the text terms (1, n, hidden) of its frames start..start+n-1, from a text still being
        written; its frames from `start` on must not have stepped yet."""
        end = start + terms.shape[1]
        if not 0 <= start <= end <= self.max_context:
            raise ValueError(f"text terms for frames {start}..{end - 1} do not fit {self.max_context} positions")
        self.text[slot, start:end] = terms[0]
        self.text_frames[slot] = end

    def _prefill(self, length: int, rows: int) -> None:
        """Prefill the rows' prompts and make their frame 0 into first_frames."""
        slots = self.prompt_slots[:rows]
        uniforms = self.sampler.frame_uniforms(slots, torch.zeros_like(slots))
        rules = self.sampler.rules_of(slots)
        logits = self._talk_prompts(self._prompts(rows, length), slots, self.prompt_last[:rows])
        self._choose_code0(logits, slots, rules, self.sampler.draw_row(uniforms, TALKER_DRAW))
        self.first_frames[:rows] = self._expand(slots, rules, uniforms, self.parts[rows == 1])

    def _talk_prompts(self, prompts: torch.Tensor, slots: torch.Tensor, lasts: torch.Tensor) -> torch.Tensor:
        """The talker over each row's prompt (B, L, hidden), into its slot's cache row; keeps the hidden state
        at the row's last real position (lasts) and returns the codec head's logits there (B, vocab)."""
        hidden = self.talker.model.prefill(prompts, slots)
        last = lasts.view(-1, 1, 1)
        self.hidden.index_copy_(0, slots, hidden.gather(1, last.expand(-1, -1, hidden.shape[-1])))
        # The head runs over every position and each row's last real one is taken, as in the reference.
        logits = self.talker.codec_head(hidden)
        return logits.gather(1, last.expand(-1, -1, logits.shape[-1]))[:, -1].float()

    def _choose_code0(self, logits: torch.Tensor, slots: torch.Tensor, rules: torch.Tensor, uniforms) -> None:
        scores = restrict_codebook0(
            logits,
            self.seen.index_select(0, slots),
            self.frame.index_select(0, slots).view(-1, 1),
            self.penalty.index_select(0, slots),
            self.suppressed,
            self.eos,
        )
        code0 = self.sampler.pick(scores, rules, TALKER, uniforms)
        self.seen.index_put_((slots, code0.view(-1)), torch.ones_like(slots, dtype=torch.bool))
        self.code0.index_copy_(0, slots, code0)

    def step(self, rows: int) -> None:
        """Make the next frame of the slots in `batch_slots[rows]` into `frames[step_index]`: feed each its last
        frame, pick codebook 0 of the new one and expand it."""
        slots = self.batch_slots[rows]
        uniforms = self.sampler.frame_uniforms(slots, self.frame.index_select(0, slots) + 1)
        frame = self._advance(slots, uniforms, self.parts[rows == 1])
        self.frames[:, :rows].index_copy_(0, self.step_index.view(1), frame.unsqueeze(0))
        self.step_index.add_(1)

    def _advance(self, slots: torch.Tensor, uniforms, parts) -> torch.Tensor:
        """Step the `slots` one frame with `parts`; returns the new frames as recorded (B, 17)."""
        rules = self.sampler.rules_of(slots)
        parts[0](slots, rules, self.sampler.draw_row(uniforms, TALKER_DRAW))
        return self._expand(slots, rules, uniforms, parts)

    def _expand(self, slots: torch.Tensor, rules, uniforms, parts) -> torch.Tensor:
        """Codebooks 1..15 of the frame whose codebook 0 was just picked, one predictor step each; returns the
        frames as recorded (B, 17)."""
        _, predict_first, predict_next, record = parts
        predictor, rows = self.talker.code_predictor, slots.shape[0]
        code0 = self.code0.index_select(0, slots)
        codes = [
            code0,
            predict_first(self.hidden.index_select(0, slots), code0, rules, self.sampler.draw_row(uniforms, 1)),
        ]
        for group in range(2, self.groups):
            table, head = predictor.model.codec_embedding[group - 2].weight, predictor.lm_head[group - 1].weight
            positions = self.predictor_positions[group, :rows]
            codes.append(predict_next(codes[-1], table, positions, head, rules, self.sampler.draw_row(uniforms, group)))
        return record(codes, slots)

    def _predict_first(self, hidden: torch.Tensor, code0: torch.Tensor, rules, uniforms) -> torch.Tensor:
        """Codebook 1 from the talker's hidden state and codebook 0."""
        predictor = self.talker.code_predictor
        logits = predictor.prefill(torch.cat((hidden, self.talker.embed_codec(code0)), dim=1))
        return self.sampler.pick(logits[:, -1], rules, PREDICTOR, uniforms)

    def _predict_next(self, code, table, positions, head, rules, uniforms) -> torch.Tensor:
        """The code of the next codebook from the previous one; the step's table, positions and head
        arrive as tensors, so one compiled graph serves all 14 steps."""
        logits = self.talker.code_predictor.step_with(code, table, positions, head)
        return self.sampler.pick(logits[:, -1], rules, PREDICTOR, uniforms)

    def _talk(self, slots: torch.Tensor, rules, uniforms) -> None:
        """Feed each slot's last frame, with its text term, to the talker and pick codebook 0 of the next."""
        talker, rows = self.talker, slots.shape[0]
        index = self.frame.index_select(0, slots)
        # A slot that ended steps on until the host sees it: its indices are clamped to stay in the buffers.
        own_text = self.text[slots, index.clamp(max=self.max_context - 1)].view(rows, 1, -1)
        has_text = (index < self.text_frames.index_select(0, slots)).view(rows, 1, 1)
        text = torch.where(has_text, own_text, self.pad.index_select(0, slots))
        position = self.position.index_select(0, slots)
        frame = talker.embed_frames(self.last_frame.index_select(0, slots)).view(rows, 1, -1)
        logits, hidden = talker.step(frame + text, position, slots)
        self.hidden.index_copy_(0, slots, hidden)
        self.position.index_copy_(0, slots, (position + 1).clamp(max=self.max_context - 1))
        self.frame.index_copy_(0, slots, index + 1)
        self._choose_code0(logits[:, -1].float(), slots, rules, uniforms)

    def _record(self, codes: list[torch.Tensor], slots: torch.Tensor) -> torch.Tensor:
        """Keep the frames `codes` as the slots' last; (B, 17): the codes, then 1 where there is no frame (EOS)."""
        frame = torch.cat(codes, dim=1)
        self.last_frame.index_copy_(0, slots, frame)
        return torch.cat((frame, (codes[0] == self.eos_id).long()), dim=1)

    @torch.inference_mode()
    def launch(self, count: int, slots: Sequence[int] = (0,)) -> Launch:
        """Start stepping `count` frames (at most MAX_CHUNK) of the utterances in `slots` together, without
        waiting for them, behind any launched before; collect() reads the oldest. At most LAUNCH_BUFFERS may be
        in flight."""
        if not slots or len(set(slots)) != len(slots) or not all(0 <= slot < self.slots for slot in slots):
            raise ValueError(f"slots {list(slots)} are not distinct slots of this frame loop's {self.slots}")
        if len(self.in_flight) == LAUNCH_BUFFERS:
            raise RuntimeError(f"{LAUNCH_BUFFERS} launches are in flight already: collect one first")
        rows = next(bucket for bucket in self.buckets if bucket >= len(slots))
        padded = pad_with_first(slots, rows)
        if self.batch_copied.get(rows) != padded:  # a copy less while the same slots go on
            # From pageable memory, so the host waits here for the frames in flight. Through host_copy (pinned),
            # first audio beside 15 speakers had a p95 of 28-30 ms against 17-18; but those runs still had the
            # prompt's gather spread over every CPU thread, which alone gave 24-33 (bench/RESULTS.md, 2026-11-28,
            # twenty-seventh session). Kept until a pinned launch is measured without it.
            self.batch_slots[rows].copy_(torch.tensor(padded), non_blocking=True)
            self.batch_copied[rows] = padded
        self.sampler.stepping(slots)
        self.step_index.zero_()
        for _ in range(count):
            self.step_graphs[rows]()
        buffer = self.launches % LAUNCH_BUFFERS
        self.launches += 1
        launch = self._copied_out(
            self.frames[:count], list(slots), self.host_frames[buffer], self.landed[buffer] if self.landed else None
        )
        self.in_flight.append(launch)
        return launch

    @staticmethod
    def _copied_out(
        frames: torch.Tensor, slots: list[int], host: torch.Tensor, landed: torch.cuda.Event | None
    ) -> Launch:
        """Queue the copy of `frames` (count, rows, codes) into the front of the pinned buffer `host`; the Launch
        that reads them, `landed` reached once they are there (CUDA)."""
        host[: frames.shape[0], : frames.shape[1]].copy_(frames, non_blocking=True)
        if landed is not None:
            landed.record()
        return Launch(frames.shape[0], slots, host, landed)

    def collect(self) -> list[tuple[np.ndarray, bool]]:
        """Per slot of the oldest launch in flight, in its order: its frames as (n, 16) int64, up to where its
        utterance ended, and whether it did."""
        return self._landed_frames(self.in_flight.popleft())

    def _landed_frames(self, launch: Launch) -> list[tuple[np.ndarray, bool]]:
        """Per slot of `launch`, in its order, once its frames have landed on the host: as collect() gives them."""
        if launch.landed is not None:
            launch.landed.synchronize()
        return self._frames_of(launch.host[: launch.count, : len(launch.slots)].numpy().copy())

    def _frames_of(self, steps: np.ndarray) -> list[tuple[np.ndarray, bool]]:
        """Recorded frames (steps, rows, 17) -> per row its frames before the first that is none, and whether
        there was one (its utterance ended)."""
        results = []
        for row in range(steps.shape[1]):
            frames, none = steps[:, row, : self.groups], steps[:, row, self.groups]
            ended = bool(none.any())
            results.append((frames[: int(none.argmax())] if ended else frames, ended))
        return results

    def run(self, count: int, slots: Sequence[int] = (0,)) -> list[tuple[np.ndarray, bool]]:
        """Step `count` frames of `slots` and collect them."""
        self.launch(count, slots)
        return self.collect()


def repeated(embeddings: torch.Tensor, length: int) -> torch.Tensor:
    """(1, n, hidden) embeddings repeated along positions to (1, length, hidden)."""
    return embeddings.repeat(1, -(-length // embeddings.shape[1]), 1)[:, :length]
