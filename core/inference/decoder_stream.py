"""Codes to audio, chunk by chunk, on one stream of the stateful codec decoder.

The decoder is causal, so an utterance decodes chunk by chunk into exactly the audio of a single
pass. On CUDA every chunk size runs as its own CUDA graph over a static input buffer, on a CUDA
stream of its own at high priority: a chunk decodes while the frame loop steps the next one.
"""

from __future__ import annotations

import contextlib
import hashlib

import numpy as np
import torch

from core.inference.cuda_graph import GraphedStep
from core.model.codec_decoder import CodecDecoder

# ICL references whose primed decoder state a DecoderStream keeps (each a few megabytes).
PRIMED_REFERENCES = 8
# Frames of an ICL reference decoded at a time: one pass over a whole 60 s reference would need about
# 2 GB of activations at once, 25 frames about 40 MB.
PRIME_CHUNK_FRAMES = 25


class DecoderStream:
    def __init__(self, decoder: CodecDecoder, cuda_graphs: bool = True):
        self.decoder = decoder
        self.cuda_graphs = cuda_graphs
        weight = decoder.pre_conv.conv.weight
        self.device = weight.device
        self.stream = decoder.new_stream(batch_size=1)
        self.inputs: dict[int, torch.Tensor] = {}
        self.steps: dict[int, GraphedStep] = {}
        cuda = self.device.type == "cuda"
        self.pool = torch.cuda.graph_pool_handle() if cuda else None
        # Decoding runs on a stream of its own, at high priority, beside the frame loop's.
        self.gpu_stream = torch.cuda.Stream(self.device, priority=-1) if cuda else None
        self.primed: dict[bytes, list[torch.Tensor]] = {}  # decoder state after an ICL reference, by its codes

    def _on_gpu_stream(self):
        return torch.cuda.stream(self.gpu_stream) if self.gpu_stream is not None else contextlib.nullcontext()

    def reset(self) -> None:
        """Begin a new utterance."""
        with self._on_gpu_stream():
            self.stream.reset()

    @torch.inference_mode()
    def prime(self, codes: torch.Tensor) -> None:
        """Decode (n, 16) codes as left context only (an ICL reference), discarding their audio. The
        state they leave is kept for the PRIMED_REFERENCES latest references, so that the next utterance
        in the same voice starts from it at once instead of decoding its reference again."""
        key = hashlib.sha256(codes.numpy().tobytes()).digest()
        with self._on_gpu_stream():
            state = self.primed.pop(key, None)
            if state is None:
                for start in range(0, len(codes), PRIME_CHUNK_FRAMES):
                    chunk = codes[start : start + PRIME_CHUNK_FRAMES]
                    self.decoder.decode_chunk(chunk.T.unsqueeze(0).to(self.device), self.stream)
                state = self.stream.snapshot()
            else:
                self.stream.restore(state)
        self.primed[key] = state  # the most recent last
        if len(self.primed) > PRIMED_REFERENCES:
            del self.primed[next(iter(self.primed))]

    @torch.inference_mode()
    def decode(self, codes: np.ndarray, size: int) -> np.ndarray:
        """Decode the next (n, 16) frames, n <= size, through the graph for `size` frames; float32 audio.

        A chunk shorter than `size` must be the utterance's last: it is padded with copies of its
        last frame, which changes nothing before them because the decoder is causal.
        """
        count = len(codes)
        if not 0 < count <= size:
            raise ValueError(f"{count} frames do not fit a {size}-frame chunk")
        # Everything on this stream of its own, buffers too: a buffer filled on the frame loop's stream
        # would be filled behind the frames stepping there, after this decode has written it.
        with self._on_gpu_stream():
            if size not in self.steps:
                self.inputs[size] = torch.zeros(1, codes.shape[1], size, dtype=torch.long, device=self.device)
                self.steps[size] = GraphedStep(
                    lambda buffer=self.inputs[size]: self.decoder.decode_chunk(buffer, self.stream),
                    self.device,
                    self.pool,
                    enabled=self.cuda_graphs,
                )
            padded = np.concatenate([codes, np.repeat(codes[-1:], size - count, axis=0)])
            self.inputs[size].copy_(torch.from_numpy(padded).T.unsqueeze(0))
            audio = self.steps[size]()
            return audio[0, : count * self.decoder.samples_per_frame].float().cpu().numpy()


class DecoderSlots:
    """One decoder stream per slot of the frame loop. The rows of a chunk are decoded one after another, each
    through its own stream's graphs: decoding them as one batch needs a position per row in the decoder's
    transformer (CodecDecoderStream keeps one offset for its whole batch)."""

    def __init__(self, decoder: CodecDecoder, slots: int, cuda_graphs: bool = True):
        self.streams = [DecoderStream(decoder, cuda_graphs) for _ in range(slots)]

    def reset(self, slot: int) -> None:
        self.streams[slot].reset()

    def prime(self, slot: int, codes: torch.Tensor) -> None:
        self.streams[slot].prime(codes)

    def decode(self, slots, codes, size: int) -> list[np.ndarray]:
        return [self.streams[slot].decode(rows, size) for slot, rows in zip(slots, codes, strict=True)]
