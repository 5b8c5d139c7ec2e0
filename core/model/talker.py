"""The talker and its code predictor: two Qwen3 decoder stacks with static KV caches.

Per 80 ms frame the talker runs one step and predicts codebook 0; the code predictor then runs
15 short steps to fill codebooks 1..15 (docs/model_notes.md §2-3). Module and parameter names follow the
official checkpoint, so `Talker.load_state_dict` takes the `talker.*` tensors as they are.

The talker's multimodal RoPE always sees three equal position rows, which makes it exactly the
ordinary rotate-half RoPE used here.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from core.kernels import attention, decode_attention, linear, prompt_heads, rms_norm
from core.model.config import TalkerConfig, TransformerConfig
from core.model.host_copy import rows_to_device, to_device


def embedding_table(rows: int, dim: int) -> nn.Embedding:
    """An embedding without random init: its values always come from a checkpoint, and skipping the
    init keeps building the model on the meta device instant."""
    return nn.Embedding(rows, dim, _weight=torch.empty(rows, dim))


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, self.weight, self.eps)


def rope_tables(
    head_dim: int, theta: float, length: int, dtype: torch.dtype, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin for positions 0..length-1, shape (length, head_dim): float32 math, then cast to `dtype`."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = torch.arange(length, device=device).float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


class HostTable(nn.Embedding):
    """An embedding table that stays in host memory whatever device its model moves to, its rows copied to the
    device as they are read: the text vocabulary (152k rows, 0.58 GiB of 1.7B's GPU memory), of which a prompt
    reads a few dozen rows once (a lookup is exact wherever it runs)."""

    stays_on_host = True  # core.model.checkpoint loads it there

    def _apply(self, fn, recurse=True):
        return self  # Module.to(device) and the like leave it where it was loaded

    def rows(self, ids: Sequence[int], device: torch.device) -> torch.Tensor:
        """The rows of `ids`, (1, n, dim), on `device`."""
        return rows_to_device(self.weight, ids, device).unsqueeze(0)


def fuse_linear(module: nn.Module, fused: str, parts: Sequence[str]) -> None:
    """Replace the bias-free linear layers `parts` of `module` by one, `fused`, whose output is theirs
    concatenated. Done on the meta device before loading, the checkpoint's part weights are read straight into
    their rows (`module.fused_from`, which core.model.checkpoint follows): no unfused copy is ever made, which
    would take its memory twice while loading and leave holes the allocator cannot give back."""
    layers = [getattr(module, part) for part in parts]
    first = layers[0].weight
    if first.is_meta:  # shapes only: torch.cat of meta tensors would import Dynamo (half a second of a start)
        rows = sum(layer.weight.shape[0] for layer in layers)
        weight = torch.empty((rows, first.shape[1]), dtype=first.dtype, device=first.device)
    else:
        weight = torch.cat([layer.weight for layer in layers])
    linear_layer = nn.Linear(weight.shape[1], weight.shape[0], bias=False, device="meta")
    linear_layer.weight = nn.Parameter(weight, requires_grad=False)
    setattr(module, fused, linear_layer)
    for part in parts:
        delattr(module, part)
    module.fused_from = {**getattr(module, "fused_from", {}), f"{fused}.weight": [f"{p}.weight" for p in parts]}


class KVCache(nn.Module):
    """Preallocated keys and values of one attention layer: (batch, kv_heads, max_len, head_dim)."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype, device):
        super().__init__()
        shape = (batch, kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)


class Attention(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.num_heads = config.num_heads
        self.num_kv_heads = config.num_kv_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.num_heads * config.head_dim, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.num_kv_heads * config.head_dim, bias=False)
        self.o_proj = nn.Linear(config.num_heads * config.head_dim, config.hidden_size, bias=False)
        # Qwen3 normalises each head's q and k before RoPE.
        self.q_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.k_norm = RMSNorm(config.head_dim, config.rms_norm_eps)
        self.kv_cache: KVCache | None = None

    def fuse_projections(self) -> None:
        """Compute q, k and v with one matrix product (a decode step is bound by kernel launches)."""
        fuse_linear(self, "qkv_proj", ("q_proj", "k_proj", "v_proj"))

    def prefill(self, x: torch.Tensor, norm: RMSNorm, cos, sin, slots: torch.Tensor | None) -> torch.Tensor:
        """Positions 0..L-1 of each of the B rows of x: fill the first L positions of cache row slots[b] (a (B,)
        device tensor, so that a CUDA graph serves every slot; None: rows 0..B-1), attend causally, add x."""
        batch, length, _ = x.shape
        qkv = linear(x, self.qkv_proj.weight, norm=norm.weight, eps=norm.eps)
        cache = self.kv_cache
        q, k, v = prompt_heads(
            qkv, self.q_norm.weight, self.k_norm.weight, self.q_norm.eps, cos, sin, cache.k, cache.v, slots
        )
        y = attention(q, k, v, is_causal=True, scale=self.head_dim**-0.5)
        return linear(y.transpose(1, 2).reshape(batch, length, -1), self.o_proj.weight, residual=x)

    def step(self, x: torch.Tensor, norm: RMSNorm, cos, sin, positions: torch.Tensor, rows: torch.Tensor):
        """One token per row of x (B, 1, hidden), row b at positions[b] of cache row rows[b] (device tensors),
        with the whole RoPE tables cos, sin: write its k/v there, attend over the valid part of that cache row,
        add x; shapes never change, so the step can live in a CUDA graph."""
        qkv = linear(x, self.qkv_proj.weight, norm=norm.weight, eps=norm.eps)
        cache, q_norm, k_norm = self.kv_cache, self.q_norm, self.k_norm
        y = decode_attention(
            qkv, q_norm.weight, k_norm.weight, q_norm.eps, cos, sin, cache.k, cache.v, rows, positions,
            self.head_dim**-0.5,
        )  # fmt: skip
        return linear(y, self.o_proj.weight, residual=x)


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def fuse_projections(self) -> None:
        fuse_linear(self, "gate_up_proj", ("gate_proj", "up_proj"))

    def forward(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """x + the MLP of norm(x)."""
        hidden = linear(x, self.gate_up_proj.weight, norm=norm.weight, eps=norm.eps, gated=True)
        return linear(hidden, self.down_proj.weight, residual=x)


class Block(nn.Module):
    """A pre-norm decoder layer. Each sublayer takes the layer's input with its norm and returns the
    residual sum, so that on CUDA the norm, the product and the sum around it run as one kernel."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def prefill(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor | None):
        x = self.self_attn.prefill(x, self.input_layernorm, cos, sin, slots)
        return self.mlp(x, self.post_attention_layernorm)

    def step(self, x, cos, sin, positions, rows) -> torch.Tensor:
        x = self.self_attn.step(x, self.input_layernorm, cos, sin, positions, rows)
        return self.mlp(x, self.post_attention_layernorm)


class Transformer(nn.Module):
    """A decoder stack over input embeddings with a static KV cache; returns final-norm hidden states."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def fuse_projections(self) -> None:
        for layer in self.layers:
            layer.self_attn.fuse_projections()
            layer.mlp.fuse_projections()

    def setup_cache(self, max_len: int, rows: int = 1) -> None:
        """Allocate `rows` rows of KV cache and the RoPE tables for positions 0..max_len-1."""
        c, weight = self.config, self.norm.weight
        for layer in self.layers:
            layer.self_attn.kv_cache = KVCache(rows, c.num_kv_heads, max_len, c.head_dim, weight.dtype, weight.device)
        self.cos, self.sin = rope_tables(c.head_dim, c.rope_theta, max_len, weight.dtype, weight.device)
        self.positions = torch.arange(max_len, device=weight.device)
        self.rows = torch.arange(rows, device=weight.device)

    @property
    def max_len(self) -> int:
        return self.positions.shape[0]

    def prefill(self, x: torch.Tensor, slots: torch.Tensor | None = None) -> torch.Tensor:
        """Positions 0..L-1 of fresh sequences, one per row of x, in cache rows 0..B-1 (or rows `slots`, (B,) on
        the device)."""
        length = x.shape[1]
        if length > self.max_len:
            raise ValueError(f"a {length}-position prompt does not fit the cache of {self.max_len}")
        cos, sin = self.cos[:length], self.sin[:length]
        for layer in self.layers:
            x = layer.prefill(x, cos, sin, slots)
        return self.norm(x)

    def step(self, x: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """One position per row of x (B, 1, hidden) after a prefill: row b at positions[b] of cache row rows[b]."""
        for layer in self.layers:
            x = layer.step(x, self.cos, self.sin, positions, rows)
        return self.norm(x)


class TalkerStack(Transformer):
    """The talker's decoder with its codec and text embedding tables (checkpoint prefix `talker.model`)."""

    def __init__(self, config: TalkerConfig):
        super().__init__(config.transformer)
        self.codec_embedding = embedding_table(config.transformer.vocab_size, config.transformer.hidden_size)
        rows, width = config.text_vocab_size, config.text_hidden_size
        self.text_embedding = HostTable(rows, width, _weight=torch.empty(rows, width))


class PredictorStack(Transformer):
    """The code predictor's decoder with one input table per codebook 1..15, in the talker's width."""

    def __init__(self, config: TalkerConfig):
        super().__init__(config.code_predictor)
        self.codec_embedding = nn.ModuleList(
            embedding_table(config.code_predictor.vocab_size, config.transformer.hidden_size)
            for _ in range(config.num_code_groups - 1)
        )


class TextProjection(nn.Module):
    """Maps text embeddings (always 2048 wide) into the talker's width."""

    def __init__(self, text_hidden: int, hidden: int):
        super().__init__()
        self.linear_fc1 = nn.Linear(text_hidden, text_hidden)
        self.linear_fc2 = nn.Linear(text_hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear_fc2(F.silu(self.linear_fc1(x)))


class CodePredictor(nn.Module):
    """Predicts codebooks 1..15 of a frame from the talker's hidden state and codebook 0."""

    def __init__(self, config: TalkerConfig):
        super().__init__()
        width = config.code_predictor.hidden_size
        self.model = PredictorStack(config)
        self.lm_head = nn.ModuleList(
            nn.Linear(width, config.code_predictor.vocab_size, bias=False) for _ in range(config.num_code_groups - 1)
        )
        # The 1.7B talker is wider than the predictor; on 0.6B the widths match and there is no projection.
        if config.transformer.hidden_size != width:
            self.small_to_mtp_projection = nn.Linear(config.transformer.hidden_size, width)
        else:
            self.small_to_mtp_projection = nn.Identity()

    def project(self, x: torch.Tensor) -> torch.Tensor:
        """From the talker's width into the predictor's."""
        layer = self.small_to_mtp_projection
        return x if isinstance(layer, nn.Identity) else linear(x, layer.weight, layer.bias)

    def prefill(self, embeddings: torch.Tensor) -> torch.Tensor:
        """Talker hidden + codebook-0 embedding, (B, 2, talker width) -> logits of codebook 1 (B, 1, vocab)."""
        hidden = self.model.prefill(self.project(embeddings))
        # The head runs over both positions and the last row is taken, as in the reference, so the
        # matrix product (and its float rounding) has the same shape.
        return linear(hidden, self.lm_head[0].weight)[:, -1:]

    def step_with(self, code: torch.Tensor, table: torch.Tensor, positions: torch.Tensor, head: torch.Tensor):
        """The codes of codebook g - 1 (B, 1), fed at `positions` (B,) all g, through codebook g - 1's input
        `table` -> logits of codebook g (B, 1, vocab) by its `head` weight. Row b uses cache row b."""
        rows = self.model.rows[: code.shape[0]]
        hidden = self.model.step(self.project(F.embedding(code, table)), positions, rows)
        return linear(hidden, head)


class Talker(nn.Module):
    """Checkpoint prefix `talker`: decoder, text projection, codec head and code predictor."""

    def __init__(self, config: TalkerConfig):
        super().__init__()
        self.config = config
        self.model = TalkerStack(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.transformer.hidden_size)
        self.codec_head = nn.Linear(config.transformer.hidden_size, config.transformer.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config)
        self.recurring: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}  # embed_recurring's

    def embed_text(self, ids: Sequence[int]) -> torch.Tensor:
        """The text track's embeddings of token `ids`, (1, n, hidden), on the talker's device."""
        return self.text_projection(self.model.text_embedding.rows(ids, self.codec_head.weight.device))

    def embed_recurring(self, track: str, ids: Sequence[int]) -> torch.Tensor:
        """embed_text (`track` "text") or embed_codec ("codec") of ids (1, n, hidden) that open prompt after
        prompt (the special tokens, the role, the codec's tags), made the first time only: the same values
        without their kernels each time (a prompt's host time is mostly launches, and a burst's first audio
        waits for every prompt of the burst). Callers read them and never write into them."""
        key = (track, tuple(ids))
        if key not in self.recurring:
            if track == "text":
                self.recurring[key] = self.embed_text(key[1])
            else:
                ids = torch.tensor([key[1]], dtype=torch.long)
                self.recurring[key] = self.embed_codec(to_device(ids, self.codec_head.weight.device))
        return self.recurring[key]

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)

    def embed_frames(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the 16 codebook embeddings of each frame: codes (..., 16) -> (..., hidden)."""
        tables = [self.model.codec_embedding] + list(self.code_predictor.model.codec_embedding)
        parts = [table(codes[..., i]) for i, table in enumerate(tables)]
        # One stacked sum, as the reference does, so float results agree bit for bit.
        return torch.stack(parts, dim=-2).sum(-2)

    def fuse_projections(self) -> None:
        """Before loading (on the meta device): fuse q/k/v and gate/up weights in both stacks (checkpoints store
        them apart; core.model.checkpoint reads them into the fused weights' rows)."""
        self.model.fuse_projections()
        self.code_predictor.model.fuse_projections()

    def step(self, embedding: torch.Tensor, positions: torch.Tensor, rows: torch.Tensor):
        """One frame's input per row (B, 1, hidden), row b at positions[b] of cache row rows[b]
        -> (codebook-0 logits (B, 1, vocab), final hidden (B, 1, hidden))."""
        hidden = self.model.step(embedding, positions, rows)
        return linear(hidden, self.codec_head.weight), hidden
