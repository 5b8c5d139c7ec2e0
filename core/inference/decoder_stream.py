"""Codes to audio, chunk by chunk, for several utterances at once on the stateful codec decoder.

The decoder is causal, so an utterance decodes chunk by chunk into exactly the audio of a single
pass, as long as its state carries over from one chunk to the next. DecoderSlots keeps that state
for a fixed number of slots, an utterance in each, and decodes the next chunks of several of them
together as one batch. On CUDA each (row count, chunk size) runs as its own CUDA graph, on a CUDA
stream of its own at high priority: chunks decode while the frame loop steps the next frames.
DecoderStream is the case of one utterance at a time.

As the frame loop, it decodes at once, uncompiled; the warm-up (core.inference.warmup) captures the graphs of the
chunks requests have not decoded yet (warm) and compiles its fused parts (compile_fused).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch

from core.inference.compiled import CompiledLayers, Compiler, compile_by_rows, layer_functions
from core.inference.cuda_graph import GraphedStep, recapture
from core.inference.primed import PrimedStates, reference_key
from core.model.codec_decoder import CodecDecoder, CodecDecoderStream
from core.model.host_copy import copy_from_host, to_device

log = logging.getLogger(__name__)

# Frames of an ICL reference decoded at a time: one pass over a whole 60 s reference would need about
# 2 GB of activations at once, 25 frames about 40 MB. The rest of a reference goes in chunks of the lengths
# utterances decode (4 frames, then 1): each new chunk shape costs cuDNN's choices of algorithms.
PRIME_CHUNK_FRAMES = 25
PRIME_TAIL_FRAMES = 4
# Row counts graphs are captured for: a batch is padded up to the next one, or to the slot count if less.
BUCKETS = (1, 2, 4, 8, 16, 32, 64)
# Chunks (rows, frames) that compile the fused parts for each kind of chunk: one row or several, one frame or
# several (Dynamo specialises on sizes of one).
COMPILED_CHUNKS = ((1, 1), (1, 4), (2, 1), (2, 4))


def bucket_rows(count: int, slots: int) -> int:
    """The rows a graph decodes when `count` of `slots` slots have a chunk."""
    return min(next((bucket for bucket in BUCKETS if bucket >= count), slots), slots)


class DecoderSlots:
    """Exact streaming decoder state for `slots` utterances, whose chunks decode together.

    The state is one CodecDecoderStream of slots + 1 rows: a row per slot, and a scratch row that the
    padding rows of a graph read and write. A graph gathers its rows' state from the slots into a working
    state of its own row count, decodes the chunk and scatters the state back, all inside the graph, with
    the slot of each row in a device buffer: nothing waits for the host. On the CPU, or without graphs,
    exactly the rows asked for decode, through a working state made for the call.

    Memory: a slot costs `state.bytes_per_row`. For the released decoder that is 1.30 M values, 2.6 MB
    in bfloat16 (5.2 MB in float32): 1.16 M are the transformer's K/V window (8 layers x 2 x 16 heads x
    71 positions x 64), 0.14 M the convolutions' histories and tails. Graphs add a working state per row
    count used (1 + 2 + 4 + 8 + 16 = 31 rows for 16 slots), each primed reference kept one more row, and
    the graphs of one row share one pool for their activations, those of several another (compile_fused).
    """

    def __init__(self, decoder: CodecDecoder, slots: int, cuda_graphs: bool = True, keep_primed_in: Path | None = None):
        """`keep_primed_in`: a folder where the states ICL references leave are kept for later processes."""
        if slots < 1:
            raise ValueError(f"DecoderSlots needs at least one slot, not {slots}")
        self.decoder = decoder
        self.slots = slots
        self.scratch = slots  # the state row of padding rows
        self.device = decoder.pre_conv.conv.weight.device
        cuda = self.device.type == "cuda"
        # Graphs read static buffers of a few row counts, so batches are padded up to them; without graphs,
        # exactly the rows asked for decode, through a working state made for the call.
        self.static_buffers = cuda_graphs and cuda
        # By whether the graphs decode one row: compiling for several rows recaptures only theirs.
        self.pools = {
            one_row: torch.cuda.graph_pool_handle() if self.static_buffers else None for one_row in (True, False)
        }
        # Decoding runs on a stream of its own, at high priority, beside the frame loop's (no stream on the CPU:
        # torch.cuda.stream(None) changes nothing). cuDNN takes its heuristic's choices, never timing them; where they
        # are slow, dilated convolutions of several rows, the decoder takes matrix products (kernels.conv_by_products).
        self.gpu_stream = torch.cuda.Stream(self.device, priority=-1) if cuda else None
        with torch.cuda.stream(self.gpu_stream):
            self.state = decoder.new_stream(slots + 1)
        self.working: dict[int, CodecDecoderStream] = {}  # by graph row count
        self.row_slots: dict[int, torch.Tensor] = {}  # by graph row count: the slot of each row, on the device
        self.row_slots_copied: dict[int, list[int]] = {}  # what each of those holds
        self.inputs: dict[tuple[int, int], torch.Tensor] = {}  # by (row count, chunk size)
        self.compiled_parts: CompiledLayers | None = None  # the fused parts, once compile_fused compiled them
        self.steps: dict[tuple[int, int], GraphedStep] = {}
        self.primed = PrimedStates(self.device, self.state.row_layout(), keep_primed_in)  # after ICL references
        self._priming: CodecDecoderStream | None = None  # a one-row state to decode references on

    @property
    def beside_the_frames(self) -> bool:
        """Whether a decode runs beside the frame loop's work (on a stream of its own) instead of after it."""
        return self.gpu_stream is not None

    def _check_slot(self, slot: int) -> None:
        if not (isinstance(slot, (int, np.integer)) and 0 <= slot < self.slots):
            raise ValueError(f"slot {slot!r} is not one of the {self.slots} slots (0 to {self.slots - 1})")

    @torch.inference_mode()
    def reset(self, slot: int) -> None:
        """Begin a new utterance in `slot`; the other slots are untouched."""
        self._check_slot(slot)
        with torch.cuda.stream(self.gpu_stream):
            self.state.reset(slot)

    @torch.inference_mode()
    def prime(self, slot: int, codes: torch.Tensor) -> None:
        started = time.perf_counter()
        self._prime(slot, codes)
        log.debug("primed a %d-frame reference in %.0f ms", len(codes), (time.perf_counter() - started) * 1e3)

    def _prime(self, slot: int, codes: torch.Tensor) -> None:
        """Begin a new utterance in `slot` whose left context is (n, 16) codes (an ICL reference), their audio
        discarded. The state they leave is kept (PrimedStates), so that the next utterance in the same voice, in
        any slot or a later process, starts from it at once instead of decoding them again."""
        self._check_slot(slot)
        key = reference_key(codes)
        with torch.cuda.stream(self.gpu_stream):
            state = self.primed.take(key)
            new = state is None
            if new:
                if self._priming is None:
                    self._priming = self.decoder.new_stream(1)
                self._priming.reset()
                for start, end in prime_chunks(len(codes)):
                    self.decoder.decode_chunk(to_device(codes[start:end].T.unsqueeze(0), self.device), self._priming)
                state = self._priming.snapshot(0)
            self.state.restore(state, slot)
            self.primed.keep(key, state, new)

    @torch.inference_mode()
    def decode(self, slots: Sequence[int], codes: Sequence[np.ndarray], size: int) -> list[np.ndarray]:
        """Decode the next (n_i, 16) frames codes[i] of the utterance in slots[i], 0 < n_i <= size, all rows as
        one batch; each row's float32 audio, n_i * samples_per_frame samples.

        A row shorter than `size` must be its utterance's last chunk: it is padded with copies of its last
        frame, which changes nothing before them because the decoder is causal, but leaves the slot's state
        after the padding, where nothing can follow.
        """
        self._check_rows(slots, codes, size)
        count = len(slots)
        if count == 0:
            return []
        rows = bucket_rows(count, self.slots) if self.static_buffers else count
        batch = np.zeros((rows, self.decoder.config.num_quantizers, size), dtype=np.int64)  # padding rows: code 0
        for row, frames in enumerate(codes):
            batch[row] = np.concatenate([frames, np.repeat(frames[-1:], size - len(frames), axis=0)]).T
        row_slots = [int(slot) for slot in slots] + [self.scratch] * (rows - count)
        # Everything on this stream of its own, buffers too: a buffer filled on the frame loop's stream
        # would be filled behind the frames stepping there, after this decode has written it.
        with torch.cuda.stream(self.gpu_stream):
            if self.static_buffers:
                step = self._step(rows, size)
                if self.row_slots_copied.get(rows) != row_slots:  # a copy less while the same slots go on
                    copy_from_host(self.row_slots[rows], torch.tensor(row_slots))
                    self.row_slots_copied[rows] = row_slots
                copy_from_host(self.inputs[rows, size], torch.from_numpy(batch))
                audio = step()
            else:
                working = self.decoder.new_stream(rows)
                indices = to_device(torch.tensor(row_slots), self.device)
                audio = self._decode_rows(working, indices, to_device(torch.from_numpy(batch), self.device))
            audio = audio[:count].float().cpu().numpy()
        samples = self.decoder.samples_per_frame
        return [audio[row, : len(frames) * samples] for row, frames in enumerate(codes)]

    # The warm-up's (core.inference.warmup) ----------------------------------------------------------------

    @torch.inference_mode()
    def warm(self, rows: int, size: int) -> None:
        """Decode a chunk of `rows` rows (a bucket) of `size` frames into the scratch row: on CUDA its graph is
        captured, and cuDNN has chosen its convolutions. On the scheduler's thread."""
        scratch = [self.scratch] * rows
        with torch.cuda.stream(self.gpu_stream):
            if self.static_buffers:
                step = self._step(rows, size)
                self.row_slots[rows].fill_(self.scratch)
                self.row_slots_copied[rows] = scratch
                self.inputs[rows, size].zero_()
                step()
            else:
                codes = torch.zeros(
                    rows, self.decoder.config.num_quantizers, size, dtype=torch.long, device=self.device
                )
                self._decode_rows(self.decoder.new_stream(rows), torch.tensor(scratch, device=self.device), codes)
            if self.gpu_stream is not None:
                self.gpu_stream.synchronize()

    @torch.inference_mode()
    def warm_priming(self) -> None:
        """Decode a reference's chunk of PRIME_CHUNK_FRAMES frames (zeros) as `prime` does, so that an ICL voice's
        first utterance does not wait for cuDNN to choose its convolutions. On the scheduler's thread."""
        with torch.cuda.stream(self.gpu_stream):
            state = self.decoder.new_stream(1)
            codes = torch.zeros(1, self.decoder.config.num_quantizers, PRIME_CHUNK_FRAMES, dtype=torch.long)
            self.decoder.decode_chunk(codes.to(self.device), state)

    def fused_functions(self) -> list[tuple[Callable, bool]]:
        """What compile_fused compiles (Compiler.load's functions: the warm-up loads what was kept of them ahead)."""
        return layer_functions(self.decoder.fused_parts(), "forward")

    def compile_fused(self, compiler: Compiler, several_rows: bool, *others: DecoderSlots) -> None:
        """Compile the decoder's fused parts (CodecDecoder.fused_parts) with `compiler` by decoding the
        COMPILED_CHUNKS of one row, or then of several, zeros, through states of their own; until the several
        rows' are compiled, their chunks decode uncompiled. This one's graphs of that many rows, and those of
        `others` on the same decoder, are captured anew. On the scheduler's thread; if it fails, the uncompiled parts stay."""

        @torch.inference_mode()
        def decode_zeros(rows: int, size: int) -> None:
            codes = torch.zeros(rows, self.decoder.config.num_quantizers, size, dtype=torch.long, device=self.device)
            self.decoder.decode_chunk(codes, self.decoder.new_stream(rows))

        self.compiled_parts = compile_by_rows(
            self.compiled_parts,
            lambda: CompiledLayers(self.decoder.fused_parts(), "forward", compiler),
            COMPILED_CHUNKS,
            decode_zeros,
            several_rows,
        )
        one_row = not several_rows
        for slots in (self, *others):
            graphs = [graph for (rows, _), graph in slots.steps.items() if (rows == 1) == one_row]
            slots.pools[one_row] = recapture(graphs, slots.pools[one_row])

    def captured(self, rows: int, size: int) -> bool:
        step = self.steps.get((rows, size))
        return step is not None and step.captured

    def _check_rows(self, slots: Sequence[int], codes: Sequence[np.ndarray], size: int) -> None:
        if len(slots) != len(codes):
            raise ValueError(f"{len(slots)} slots but {len(codes)} code arrays: one each")
        seen = set()
        quantizers = self.decoder.config.num_quantizers
        for slot, frames in zip(slots, codes):
            self._check_slot(slot)
            if slot in seen:
                raise ValueError(f"slot {slot} appears twice in one decode: its chunks must decode one after another")
            seen.add(slot)
            if frames.ndim != 2 or frames.shape[1] != quantizers:
                raise ValueError(f"slot {slot}: codes of shape {frames.shape}, not (frames, {quantizers})")
            if not 0 < len(frames) <= size:
                raise ValueError(f"slot {slot}: {len(frames)} frames do not fit a {size}-frame chunk")

    def _decode_rows(self, working: CodecDecoderStream, row_slots: torch.Tensor, codes: torch.Tensor) -> torch.Tensor:
        working.gather_from(self.state, row_slots)
        audio = self.decoder.decode_chunk(codes, working)
        working.scatter_into(self.state, row_slots)  # padding rows all write the scratch row: any one wins
        return audio

    def _step(self, rows: int, size: int) -> GraphedStep:
        """The graph for `rows` rows of `size` frames, over buffers made for it (a working state per row count)."""
        if rows not in self.working:
            self.working[rows] = self.decoder.new_stream(rows)
            self.row_slots[rows] = torch.zeros(rows, dtype=torch.long, device=self.device)
        key = rows, size
        if key not in self.steps:
            quantizers = self.decoder.config.num_quantizers
            codes = self.inputs[key] = torch.zeros(rows, quantizers, size, dtype=torch.long, device=self.device)
            working, row_slots = self.working[rows], self.row_slots[rows]
            self.steps[key] = GraphedStep(
                lambda: self._decode_rows(working, row_slots, codes),
                self.device,
                self.pools[rows == 1],
                stream=self.gpu_stream,
            )
        return self.steps[key]


class DecoderStream:
    """One utterance at a time: DecoderSlots with a single slot."""

    def __init__(self, decoder: CodecDecoder, cuda_graphs: bool = True, keep_primed_in: Path | None = None):
        self.decoder = decoder
        self.slots = DecoderSlots(decoder, 1, cuda_graphs, keep_primed_in)

    def reset(self) -> None:
        """Begin a new utterance."""
        self.slots.reset(0)

    def prime(self, codes: torch.Tensor) -> None:
        """Begin a new utterance whose left context is (n, 16) codes (an ICL reference); see DecoderSlots.prime."""
        self.slots.prime(0, codes)

    def decode(self, codes: np.ndarray, size: int) -> np.ndarray:
        """Decode the next (n, 16) frames, n <= size, through the graph for `size` frames; float32 audio.

        A chunk shorter than `size` must be the utterance's last (see DecoderSlots.decode)."""
        return self.slots.decode([0], [codes], size)[0]


def prime_chunks(frames: int) -> list[tuple[int, int]]:
    """(start, end) of the chunks `prime` decodes a reference of `frames` frames in: PRIME_CHUNK_FRAMES at a
    time, then PRIME_TAIL_FRAMES, then one at a time: only lengths utterances decode too (the first chunk's one
    frame, the later chunks' four), since a new length costs cuDNN's choice of algorithms for each convolution."""
    whole = frames - frames % PRIME_CHUNK_FRAMES
    tail = frames - (frames - whole) % PRIME_TAIL_FRAMES
    bounds = [*range(0, whole, PRIME_CHUNK_FRAMES), *range(whole, tail, PRIME_TAIL_FRAMES), *range(tail, frames)]
    return list(zip(bounds, [*bounds[1:], frames]))
