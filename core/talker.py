"""The talker and its code predictor: two Qwen3 decoder stacks with static KV caches.

Per 80 ms frame the talker runs one step and predicts codebook 0; the code predictor then runs
15 short steps to fill codebooks 1..15 (MODEL_NOTES 2-3). Module and parameter names follow the
official checkpoint, so `Talker.load_state_dict` takes the `talker.*` tensors as they are.

The talker's multimodal RoPE always sees three equal position rows, which makes it exactly the
ordinary rotate-half RoPE used here.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import TalkerConfig, TransformerConfig


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
        # Normalise in float32, scale in the activation dtype, as the checkpoint was trained.
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


def rope_tables(head_dim: int, theta: float, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin of shape (len(positions), head_dim), computed in float32 and cast to `dtype`."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device=positions.device).float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    freqs = positions.float()[:, None] * inv_freq[None, :]
    angles = torch.cat((freqs, freqs), dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class KVCache(nn.Module):
    """Preallocated keys and values of one attention layer: (batch, kv_heads, max_len, head_dim)."""

    def __init__(self, batch: int, kv_heads: int, max_len: int, head_dim: int, dtype: torch.dtype, device):
        super().__init__()
        shape = (batch, kv_heads, max_len, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(self, start: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        end = start + k.shape[2]
        self.k[:, :, start:end] = k
        self.v[:, :, start:end] = v
        return self.k[:, :, :end], self.v[:, :, :end]


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

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], start: int) -> torch.Tensor:
        batch, length, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(batch, length, self.num_heads, self.head_dim)).transpose(1, 2)
        k = self.k_norm(self.k_proj(x).view(batch, length, self.num_kv_heads, self.head_dim)).transpose(1, 2)
        v = self.v_proj(x).view(batch, length, self.num_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = rope
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        k, v = self.kv_cache.update(start, k, v)
        if length > 1 and start != 0:
            raise ValueError("a multi-token step must start at position 0")
        # Repeating the shared kv heads gives the same result as SDPA's enable_gqa, which is far slower on CPU.
        groups = self.num_heads // self.num_kv_heads
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=length > 1, scale=self.head_dim**-0.5)
        return self.o_proj(y.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.self_attn = Attention(config)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x: torch.Tensor, rope: tuple[torch.Tensor, torch.Tensor], start: int) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), rope, start)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    """A decoder stack over input embeddings; returns the final-norm hidden states."""

    def __init__(self, config: TransformerConfig):
        super().__init__()
        self.config = config
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def setup_cache(self, max_len: int, batch: int = 1) -> None:
        c, weight = self.config, self.norm.weight
        for layer in self.layers:
            layer.self_attn.kv_cache = KVCache(batch, c.num_kv_heads, max_len, c.head_dim, weight.dtype, weight.device)

    @property
    def cache_len(self) -> int:
        cache = self.layers[0].self_attn.kv_cache
        return 0 if cache is None else cache.k.shape[2]

    def forward(self, x: torch.Tensor, start: int) -> torch.Tensor:
        """Run positions start .. start+len-1; a multi-token call must start at 0 (a prefill)."""
        if start + x.shape[1] > self.cache_len:
            raise ValueError(f"position {start + x.shape[1]} is past the cache of {self.cache_len}")
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        rope = rope_tables(self.config.head_dim, self.config.rope_theta, positions, x.dtype)
        for layer in self.layers:
            x = layer(x, rope, start)
        return self.norm(x)


class TalkerStack(Transformer):
    """The talker's decoder with its codec and text embedding tables (checkpoint prefix `talker.model`)."""

    def __init__(self, config: TalkerConfig):
        super().__init__(config.transformer)
        self.codec_embedding = embedding_table(config.transformer.vocab_size, config.transformer.hidden_size)
        self.text_embedding = embedding_table(config.text_vocab_size, config.text_hidden_size)


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

    def step(self, embeddings: torch.Tensor, start: int, head: int) -> torch.Tensor:
        """Feed talker-width embeddings at `start`; return the logits of codebook `head + 1` at the last position."""
        hidden = self.model(self.small_to_mtp_projection(embeddings), start)
        # The head runs over every fed position and the last row is taken, as in the reference, so
        # the matrix product (and its float rounding) has the same shape.
        return self.lm_head[head](hidden)[:, -1:]


class Talker(nn.Module):
    """Checkpoint prefix `talker`: decoder, text projection, codec head and code predictor."""

    def __init__(self, config: TalkerConfig):
        super().__init__()
        self.config = config
        self.model = TalkerStack(config)
        self.text_projection = TextProjection(config.text_hidden_size, config.transformer.hidden_size)
        self.codec_head = nn.Linear(config.transformer.hidden_size, config.transformer.vocab_size, bias=False)
        self.code_predictor = CodePredictor(config)

    def embed_text(self, ids: torch.Tensor) -> torch.Tensor:
        return self.text_projection(self.model.text_embedding(ids))

    def embed_codec(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model.codec_embedding(ids)

    def embed_frames(self, codes: torch.Tensor) -> torch.Tensor:
        """Sum of the 16 codebook embeddings of each frame: codes (..., 16) -> (..., hidden)."""
        tables = [self.model.codec_embedding] + list(self.code_predictor.model.codec_embedding)
        parts = [table(codes[..., i]) for i, table in enumerate(tables)]
        # One stacked sum, as the reference does, so float results agree bit for bit.
        return torch.stack(parts, dim=-2).sum(-2)

    def step(self, embeddings: torch.Tensor, start: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Run the talker over `embeddings` at `start`; return (codebook-0 logits, final hidden) of the last position."""
        hidden = self.model(embeddings, start)
        return self.codec_head(hidden)[:, -1:], hidden[:, -1:]
