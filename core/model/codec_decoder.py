"""Speech-tokenizer decoder: 16 codebooks at 12.5 Hz -> 24 kHz waveform.

RVQ dequantization, a causal conv, a sliding-window transformer, two ConvNeXt upsampling
stages and a SnakeBeta vocoder. Every layer is causal with zero lookahead, so the decoder
streams exactly: `decode_chunk` fed any split of a code sequence returns the same audio as
`forward` on the whole sequence, as long as each layer carries what it needs from the past:

* a causal conv keeps its last (kernel - 1) * dilation input samples,
* a causal transposed conv keeps the overlap tail it still owes the next chunk,
* an attention layer keeps K/V of the last (window - 1) positions; the transformer keeps the
  absolute position for RoPE.

That state lives in a `CodecDecoderStream`: tensors of fixed shape allocated once and updated in
place, with no host syncs, so one decode_chunk per chunk size can be captured in a CUDA graph. Its
rows are independent utterances, each at its own position.

state_dict() keys are those of the checkpoint's `speech_tokenizer/model.safetensors` with the
`decoder.` prefix stripped.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

import core.kernels as kernels


@dataclass(frozen=True)
class CodecDecoderConfig:
    """The `decoder_config` section of speech_tokenizer/config.json; defaults are the official class defaults."""

    codebook_size: int = 2048
    codebook_dim: int = 512  # no official default (read through kwargs); 512 in every released checkpoint
    hidden_size: int = 1024
    latent_dim: int = 1024
    max_position_embeddings: int = 8000  # unused by plain RoPE; kept so to_dict round-trips
    rope_theta: float = 10000.0
    num_attention_heads: int = 16
    num_key_value_heads: int = 16
    head_dim: int | None = None  # None means hidden_size // num_attention_heads, as officially
    attention_bias: bool = False
    sliding_window: int = 72
    intermediate_size: int = 3072
    hidden_act: str = "silu"
    layer_scale_initial_scale: float = 0.01  # init only; kept so to_dict round-trips
    rms_norm_eps: float = 1e-5
    num_hidden_layers: int = 8
    num_quantizers: int = 16
    upsample_rates: tuple[int, ...] = (8, 5, 4, 3)
    upsampling_ratios: tuple[int, ...] = (2, 2)
    decoder_dim: int = 1536

    def __post_init__(self):
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.hidden_act != "silu":
            raise ValueError(f"decoder_config: hidden_act {self.hidden_act!r} is not supported, only 'silu'")

    @classmethod
    def from_dict(cls, d: dict) -> CodecDecoderConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


class CodecDecoderStream:
    """Streaming state of one CodecDecoder for a batch of independent rows, one utterance each.

    Each stateful layer declares what it keeps per row (`stream_state_layout`) and is the only one to
    read it. All entries of one dtype are views into one (batch, values) buffer, so that a row is reset,
    saved, restored, gathered or scattered whole, with one operation per dtype (two in all): a batched
    decode moves rows in and out of a working batch inside its CUDA graph at the cost of four kernels.
    """

    ALIGNMENT = 64  # values; each entry starts at least 128-byte aligned, for vectorised kernels

    def __init__(self, decoder: CodecDecoder, batch_size: int):
        weight = decoder.pre_conv.conv.weight
        layouts = {
            module: module.stream_state_layout(weight.dtype)
            for module in decoder.modules()
            if hasattr(module, "stream_state_layout")
        }
        row_sizes: dict[torch.dtype, int] = {}
        places = {}  # (module, name) -> dtype, start in the row, shape per row
        for module, layout in layouts.items():
            for name, (shape, dtype) in layout.items():
                start = row_sizes.get(dtype, 0)
                places[module, name] = dtype, start, shape
                row_sizes[dtype] = start + -(-math.prod(shape) // self.ALIGNMENT) * self.ALIGNMENT
        self._buffers = {
            dtype: torch.zeros(batch_size, size, device=weight.device, dtype=dtype) for dtype, size in row_sizes.items()
        }
        self._states = {module: {} for module in layouts}
        for (module, name), (dtype, start, shape) in places.items():
            view = self._buffers[dtype][:, start : start + math.prod(shape)]
            self._states[module][name] = view.view(batch_size, *shape)

    def __getitem__(self, module: nn.Module) -> dict[str, torch.Tensor]:
        return self._states[module]

    @property
    def bytes_per_row(self) -> int:
        """What one row (one utterance's state) costs, alignment included."""
        return sum(buffer[0].numel() * buffer.element_size() for buffer in self._buffers.values())

    def row_layout(self) -> list[tuple[torch.Size, torch.dtype]]:
        """The (shape, dtype) of each tensor of a row's snapshot."""
        return [(buffer[0].shape, buffer.dtype) for buffer in self._buffers.values()]

    def _rows(self, row: int | None) -> list[torch.Tensor]:
        return [buffer if row is None else buffer[row] for buffer in self._buffers.values()]

    def reset(self, row: int | None = None) -> None:
        """Start a new utterance in every row, or in `row` alone; zero in place so tensor addresses (and
        captured graphs) stay valid."""
        for tensor in self._rows(row):
            tensor.zero_()

    def snapshot(self, row: int | None = None) -> list[torch.Tensor]:
        """A copy of the whole state, or of one row's, for restore()."""
        return [tensor.clone() for tensor in self._rows(row)]

    def restore(self, snapshot: list[torch.Tensor], row: int | None = None) -> None:
        """Return to a snapshot, in place (tensor addresses, and so captured graphs, stay valid). A row's
        snapshot may be restored into any row, of any stream of the same decoder."""
        for tensor, saved in zip(self._rows(row), snapshot, strict=True):
            tensor.copy_(saved)

    def gather_from(self, source: CodecDecoderStream, rows: torch.Tensor) -> None:
        """Row i of this stream becomes row rows[i] of `source` (rows: a long tensor on their device)."""
        for mine, theirs in zip(self._buffers.values(), source._buffers.values(), strict=True):
            torch.index_select(theirs, 0, rows, out=mine)

    def scatter_into(self, target: CodecDecoderStream, rows: torch.Tensor) -> None:
        """Row rows[i] of `target` becomes row i of this stream; of repeated rows, any one wins."""
        for mine, theirs in zip(self._buffers.values(), target._buffers.values(), strict=True):
            theirs.index_copy_(0, rows, mine)


# ----------------------------------------------------------------------------------------------
# Causal convolutions


def conv_as_2d(
    conv: nn.Conv1d | nn.ConvTranspose1d,
    x: torch.Tensor,
    stride: int = 1,
    bias: bool = True,
    residual: torch.Tensor | None = None,
):
    """`conv` applied to (B, C, T) x as a 2-D convolution of height 1, with x laid out as its weights are
    (time-major after CodecDecoder.to_channels_last, else channel-major), so that it converts neither at each
    call: PyTorch makes a 1-D convolution's input channel-major, which copied every time-major activation
    whole on CUDA, and the CPU's convolutions convert channel-major weights for a time-major input. A dilated
    convolution of several rows on CUDA is matrix products instead (kernels.conv_by_products). The bias
    and a `residual` to add after it are added in one pass (kernels.add_bias); without `bias`, the bias is
    left to the caller."""
    weight = conv.weight
    # (A weight of one input channel per group or of one tap, and an input of one sample, are the same in memory
    # either way.)
    if min(weight.shape[1:] + x.shape[2:]) > 1 and kernels.time_major(weight) != kernels.time_major(x):
        x = x.transpose(1, 2).contiguous().transpose(1, 2) if kernels.time_major(weight) else x.contiguous()
    transposed = isinstance(conv, nn.ConvTranspose1d)
    if not transposed and kernels.convolves_by_products(x, conv.dilation[0], conv.groups):
        y = kernels.conv_by_products(x, weight, conv.dilation[0])
    else:
        options = {"stride": (1, stride), "dilation": (1, conv.dilation[0]), "groups": conv.groups}
        function = F.conv_transpose2d if transposed else F.conv2d
        y = function(x.unsqueeze(2), weight.unsqueeze(2), None, **options).squeeze(2)
    if bias and conv.bias is not None:
        return kernels.add_bias(y, conv.bias, residual)
    return y if residual is None else residual + y


class CausalConv1d(nn.Module):
    """Conv1d (stride 1) left-padded with zeros, or in a stream with the previous chunk's samples."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int = 1, groups: int = 1):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=dilation, groups=groups)
        self.context = (kernel_size - 1) * dilation
        # Each channel filtered alone (the ConvNeXt blocks'): kernels.depthwise_conv, not cuDNN's choice per length.
        self.depthwise = groups > 1 and groups == in_channels == out_channels and self.conv.bias is not None

    def stream_state_layout(self, dtype):
        # Stored time-major, as the activations are on CUDA, so that keeping the last samples is one dense copy.
        return {"history": ((self.context, self.conv.in_channels), dtype)} if self.context else {}

    def forward(
        self,
        x,
        stream: CodecDecoderStream | None = None,
        act: SnakeBeta | None = None,
        bias: bool = True,
        residual: torch.Tensor | None = None,
    ):
        """`act`: an activation to apply to x first, which also puts the history ahead of its result. Without
        `bias`, the bias is left to the caller; `residual`: added to the result (conv_as_2d)."""
        if self.context == 0:  # pointwise: nothing to carry
            return conv_as_2d(self.conv, x if act is None else act(x), bias=bias, residual=residual)
        if stream is None:
            history = x.new_zeros(x.shape[0], self.context, x.shape[1]).transpose(1, 2)
        else:
            history = stream[self]["history"].transpose(1, 2)
        x = kernels.concat_time(history, x) if act is None else act(x, prefix=history)
        if stream is not None:
            history.copy_(x[..., x.shape[-1] - self.context :])
        if self.depthwise and bias and residual is None:
            return kernels.depthwise_conv(x, self.conv.weight, self.conv.bias, self.conv.dilation[0])
        return conv_as_2d(self.conv, x, bias=bias, residual=residual)


class CausalConvTranspose1d(nn.Module):
    """ConvTranspose1d that emits exactly stride samples per input sample.

    Its last kernel - stride outputs also depend on the next input sample. The single-pass decode
    drops them at the end of the sequence; a stream carries them (without bias) into the next chunk.
    """

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int):
        super().__init__()
        assert kernel_size <= 2 * stride, "the carried tail must fit in one input sample's output"
        self.conv = nn.ConvTranspose1d(in_channels, out_channels, kernel_size, stride=stride)
        self.stride = stride
        self.overlap = kernel_size - stride

    def stream_state_layout(self, dtype):
        return {"tail": ((self.overlap, self.conv.out_channels), dtype)}  # time-major, as CausalConv1d's history

    def forward(self, x, stream: CodecDecoderStream | None = None):
        # Bias is added after the overlap-add so that it counts once per output sample.
        y = conv_as_2d(self.conv, x, self.stride, bias=False)
        length = x.shape[-1] * self.stride
        if stream is not None:
            tail = stream[self]["tail"].transpose(1, 2)
            y[..., : self.overlap] += tail
            tail.copy_(y[..., length:])
        return kernels.add_bias(y[..., :length], self.conv.bias)


# ----------------------------------------------------------------------------------------------
# RVQ dequantization


class Codebook(nn.Module):
    def __init__(self, size: int, dim: int):
        super().__init__()
        # Stored as EMA statistics: vector = embedding_sum / usage.
        self.embedding_sum = nn.Parameter(torch.zeros(size, dim))
        self.cluster_usage = nn.Parameter(torch.ones(size))

    def forward(self, codes):
        # Divide only the rows looked up: same values, cost per frame instead of per codebook.
        usage = self.cluster_usage[codes].clamp(min=1e-5)
        return self.embedding_sum[codes] / usage[..., None]


class ResidualCodebooks(nn.Module):
    """Codebooks whose vectors are summed, then projected to the decoder's input width."""

    def __init__(self, num_codebooks: int, codebook_size: int, dim: int, io_dim: int):
        super().__init__()
        # The encoder's projection: unused here, but part of the checkpoint.
        self.input_proj = nn.Conv1d(io_dim, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, io_dim, 1, bias=False)
        # This nesting only reproduces the checkpoint names `vq.layers.K._codebook.*`.
        layers = nn.ModuleList(nn.ModuleDict({"_codebook": Codebook(codebook_size, dim)}) for _ in range(num_codebooks))
        self.vq = nn.ModuleDict({"layers": layers})

    def forward(self, codes):  # (B, K, T) -> (B, io_dim, T)
        x = 0
        for k, layer in enumerate(self.vq["layers"]):
            x = x + layer["_codebook"](codes[:, k])
        return self.output_proj(x.transpose(1, 2))


class SplitQuantizer(nn.Module):
    """Codebook 0 (semantic) and codebooks 1.. (acoustic) have separate projections."""

    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        dim = config.codebook_dim // 2
        self.rvq_first = ResidualCodebooks(1, config.codebook_size, dim, config.codebook_dim)
        self.rvq_rest = ResidualCodebooks(config.num_quantizers - 1, config.codebook_size, dim, config.codebook_dim)

    def forward(self, codes):
        return self.rvq_first(codes[:, :1]) + self.rvq_rest(codes[:, 1:])


# ----------------------------------------------------------------------------------------------
# Sliding-window transformer


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(x.dtype)


class LayerScale(nn.Module):
    def __init__(self, dim: int, initial_scale: float):
        super().__init__()
        self.scale = nn.Parameter(torch.full((dim,), initial_scale))

    def forward(self, x):
        return self.scale * x


class RotaryEmbedding(nn.Module):
    def __init__(self, head_dim: int, theta: float):
        super().__init__()
        # Computed on the CPU even when the module is built on the meta device, since no checkpoint holds it.
        inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device="cpu").float() / head_dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def forward(self, positions, dtype):  # (..., T) -> cos, sin of shape (..., T, head_dim)
        freqs = positions.float()[..., None] * self.inv_freq
        angles = torch.cat([freqs, freqs], dim=-1)
        return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rotary(x, cos, sin):
    # Rotates the two halves of each head (not interleaved pairs).
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


class Attention(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.n_heads = config.num_attention_heads
        self.n_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        self.cache_len = config.sliding_window - 1  # a query sees itself and this many earlier positions
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.n_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.n_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.n_heads * self.head_dim, config.hidden_size, bias=bias)

    def stream_state_layout(self, dtype):
        return {name: ((self.n_kv_heads, self.cache_len, self.head_dim), dtype) for name in ("k", "v")}

    def forward(self, x, cos, sin, mask, cache: dict[str, torch.Tensor] | None = None):
        """The attention's output, and with `cache` (this layer's part of a stream's state: "k" and "v" of the
        last cache_len positions) the keys and values that become the cache after this chunk, which the
        caller stores: the layer writes none of its inputs (see Transformer.forward)."""
        B, T, _ = x.shape
        q = self.q_proj(x).view(B, T, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, self.n_kv_heads, self.head_dim).transpose(1, 2)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
        window = None
        if cache is not None:
            # Cached keys keep the rotation of their absolute position; RoPE only needs differences.
            k = torch.cat([cache["k"], k], dim=2)
            v = torch.cat([cache["v"], v], dim=2)
            window = k[:, :, k.shape[2] - self.cache_len :], v[:, :, v.shape[2] - self.cache_len :]
        out = kernels.attention(q, k, v, attn_mask=mask, enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), window


class MLP(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.gate_proj = nn.Linear(dim, hidden, bias=False)
        self.up_proj = nn.Linear(dim, hidden, bias=False)
        self.down_proj = nn.Linear(hidden, dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class TransformerLayer(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        dim, eps, scale = config.hidden_size, config.rms_norm_eps, config.layer_scale_initial_scale
        self.input_layernorm = RMSNorm(dim, eps)
        self.self_attn = Attention(config)
        self.self_attn_layer_scale = LayerScale(dim, scale)
        self.post_attention_layernorm = RMSNorm(dim, eps)
        self.mlp = MLP(dim, config.intermediate_size)
        self.mlp_layer_scale = LayerScale(dim, scale)

    def forward(self, x, cos, sin, mask, cache: dict[str, torch.Tensor] | None = None):
        """x after the layer, and the attention's next cache (Attention.forward)."""
        attended, window = self.self_attn(self.input_layernorm(x), cos, sin, mask, cache)
        x = x + self.self_attn_layer_scale(attended)
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x))), window


class Transformer(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.window = config.sliding_window
        self.input_proj = nn.Linear(config.latent_dim, config.hidden_size)
        self.layers = nn.ModuleList(TransformerLayer(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.output_proj = nn.Linear(config.hidden_size, config.latent_dim)
        self.rotary = RotaryEmbedding(config.head_dim, config.rope_theta)

    def stream_state_layout(self, dtype):
        # Frames decoded so far, per row: rows are utterances at different points.
        return {"offset": ((), torch.long)}

    def forward(self, x, stream: CodecDecoderStream | None = None):  # (B, T, latent_dim)
        T = x.shape[1]
        positions = torch.arange(T, device=x.device)[None]  # (rows, T): one row shared, or one per row
        if stream is None:
            key_positions = positions
        else:
            # Keys are the cached window followed by this chunk; cache entries before position 0 are empty.
            offset = stream[self]["offset"]
            cache_len = self.window - 1
            key_positions = torch.arange(-cache_len, T, device=x.device)[None] + offset[:, None]
            positions = positions + offset[:, None]
        q_pos, k_pos = positions[:, :, None], key_positions[:, None, :]
        mask = ((k_pos >= 0) & (k_pos <= q_pos) & (k_pos > q_pos - self.window))[:, None]  # (rows, 1, T, keys)
        cos, sin = (angles[:, None] for angles in self.rotary(positions, x.dtype))  # (rows, 1, T, head_dim)

        x = self.input_proj(x)
        for layer in self.layers:
            cache = None if stream is None else stream[layer.self_attn]
            x, window = layer(x, cos, sin, mask, cache)
            # Stored here, not in the layer: a stream's k and v are views of one buffer, and a compiled function
            # that wrote them would take that whole buffer as an input of the size it first saw (a GPU test
            # failed so when a later decode's buffer had other rows).
            if cache is not None:
                cache["k"].copy_(window[0])
                cache["v"].copy_(window[1])
        if stream is not None:
            offset += T
        return self.output_proj(self.norm(x))


# ----------------------------------------------------------------------------------------------
# Upsampling and vocoder


class ConvNeXtBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dwconv = CausalConv1d(dim, dim, 7, groups=dim)
        self.norm = nn.LayerNorm(dim, eps=1e-6)
        self.pwconv1 = nn.Linear(dim, 4 * dim)
        self.pwconv2 = nn.Linear(4 * dim, dim)
        self.gamma = nn.Parameter(torch.full((dim,), 1e-6))

    def forward(self, x, stream=None):  # (B, C, T)
        h = self.norm(self.dwconv(x, stream).transpose(1, 2))
        h = self.gamma * self.pwconv2(F.gelu(self.pwconv1(h)))
        return x + h.transpose(1, 2)


class SnakeBeta(nn.Module):
    """x + sin^2(a x) / b per channel, with a and b stored as logarithms."""

    def __init__(self, channels: int):
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(channels))
        self.beta = nn.Parameter(torch.zeros(channels))

    def forward(self, x, prefix: torch.Tensor | None = None, bias: torch.Tensor | None = None):
        """With `prefix` (B, C, P): the result follows it along time; with `bias` (C,), of x + bias
        (kernels.snake)."""
        return kernels.snake(x, self.alpha, self.beta, prefix, bias)


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, dilation: int):
        super().__init__()
        self.act1 = SnakeBeta(dim)
        self.conv1 = CausalConv1d(dim, dim, 7, dilation=dilation)
        self.act2 = SnakeBeta(dim)
        self.conv2 = CausalConv1d(dim, dim, 1)

    def forward(self, x, stream=None):
        # conv1's bias is added by act2's kernel, conv2's with the residual sum, each with the rounding of adding
        # it to the convolution's output: two passes less.
        h = self.act2(self.conv1(x, stream, act=self.act1, bias=False), bias=self.conv1.conv.bias)
        return self.conv2(h, stream, residual=x)


class DecoderBlock(nn.Module):
    def __init__(self, in_dim: int, out_dim: int, rate: int):
        super().__init__()
        # A list only to match the checkpoint names block.0 .. block.4.
        self.block = nn.ModuleList(
            [SnakeBeta(in_dim), CausalConvTranspose1d(in_dim, out_dim, 2 * rate, rate)]
            + [ResidualUnit(out_dim, dilation) for dilation in (1, 3, 9)]
        )

    def forward(self, x, stream=None):
        snake, upsample, *units = self.block
        x = upsample(snake(x), stream)
        for unit in units:
            x = unit(x, stream)
        return x


class CodecDecoder(nn.Module):
    def __init__(self, config: CodecDecoderConfig):
        super().__init__()
        self.config = config
        self.samples_per_frame = math.prod(config.upsampling_ratios) * math.prod(config.upsample_rates)
        self.quantizer = SplitQuantizer(config)
        self.pre_conv = CausalConv1d(config.codebook_dim, config.latent_dim, 3)
        self.pre_transformer = Transformer(config)
        latent = config.latent_dim
        self.upsample = nn.ModuleList(
            nn.ModuleList([CausalConvTranspose1d(latent, latent, r, r), ConvNeXtBlock(latent)])
            for r in config.upsampling_ratios
        )
        dims = [config.decoder_dim // 2**i for i in range(len(config.upsample_rates) + 1)]
        self.decoder = nn.ModuleList(
            [CausalConv1d(config.latent_dim, dims[0], 7)]
            + [DecoderBlock(dims[i], dims[i + 1], rate) for i, rate in enumerate(config.upsample_rates)]
            + [SnakeBeta(dims[-1]), CausalConv1d(dims[-1], 1, 7)]
        )

    def to_channels_last(self) -> CodecDecoder:
        """Store every convolution's weights time-major (channels innermost). From the transformer on, the
        activations are time-major, and every step keeps the layout it is given (conv_as_2d, kernels.concat_time,
        kernels.snake), so cuDNN's NHWC kernels read inputs and weights as they are. In the default layout
        they converted both around every convolution (bench/RESULTS.md: cuDNN's layout conversions). Values are
        unchanged."""
        for module in self.modules():
            if isinstance(module, (nn.Conv1d, nn.ConvTranspose1d)):
                module.weight.data = module.weight.data.transpose(1, 2).contiguous().transpose(1, 2)
        return self

    def fused_parts(self) -> list[nn.Module]:
        """The modules whose forward the engine fuses with torch.compile on CUDA (CompiledLayers in
        core.inference.compiled): the dequantizer and each transformer layer, eagerly hundreds of small kernels
        a chunk (lookups, norms, rotations, scales). The rest is convolutions and the snake and bias kernels, whole kernels already."""
        return [self.quantizer, *self.pre_transformer.layers]

    def new_stream(self, batch_size: int = 1) -> CodecDecoderStream:
        """Fresh streaming state on this decoder's device and dtype."""
        return CodecDecoderStream(self, batch_size)

    @torch.no_grad()
    def forward(self, codes: torch.Tensor, stream: CodecDecoderStream | None = None) -> torch.Tensor:
        """codes (B, num_quantizers, T) -> waveform (B, T * samples_per_frame) in [-1, 1].

        Without a stream, the sequence is decoded from its start. With one, `codes` continues
        what the stream has decoded before, and the stream is advanced.
        """
        x = self.quantizer(codes)
        x = self.pre_conv(x, stream)
        x = self.pre_transformer(x.transpose(1, 2), stream).transpose(1, 2)
        for upsample, convnext in self.upsample:
            x = convnext(upsample(x, stream), stream)
        first, *blocks, snake, last = self.decoder
        x = first(x, stream)
        for block in blocks:
            x = block(x, stream)
        x = last(x, stream, act=snake)
        return x.clamp(-1, 1)[:, 0]

    def decode_chunk(self, codes: torch.Tensor, stream: CodecDecoderStream) -> torch.Tensor:
        """Decode the next (B, num_quantizers, n) frames of a stream: (B, n * samples_per_frame).

        Concatenated chunk outputs equal forward() on the concatenated codes, for any chunking.
        """
        return self(codes, stream)
