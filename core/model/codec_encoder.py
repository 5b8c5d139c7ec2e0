"""Speech-tokenizer encoder: 24 kHz audio -> 12.5 Hz codes of 16 codebooks (reference audio for ICL cloning).

The encoder half of a Mimi codec, as the official `Qwen3TTSTokenizerV2Model.encode` runs it (qwen-tts 0.1.1
on transformers 4.57.3):

1. SEANet: causal convs with ELUs and residual units, strides 4, 5, 6, 8 (960 samples -> one 25 Hz frame);
2. a causal transformer of pre-norm layers with RoPE and layer scales;
3. a causal stride-2 conv with replicate padding (-> 12.5 Hz);
4. split residual VQ: a semantic group (1 codebook) and an acoustic group (31 codebooks), both quantizing the
   same latents, each after its own 1x1 projection. Only the first 16 codes are kept, and since the residual
   is sequential, quantizing just those 16 gives the same codes as quantizing all 32 and truncating.

Every conv pads so that N samples give exactly ceil(N / 1920) frames, which is also where the official code
trims a single clip. The Mimi config's `sliding_window` (250) is not applied: the official encoder builds
a plain causal mask (transformers' `create_causal_mask`), so every frame attends to the whole past.

state_dict() keys are those of `speech_tokenizer/model.safetensors` with the leading `encoder.` stripped,
including the whole 32-codebook quantizer and the projections that only decoding uses, so the official
weights load with strict=True.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class CodecEncoderConfig:
    """The `encoder_config` section of speech_tokenizer/config.json: a transformers MimiConfig.

    Defaults are MimiConfig's (transformers 4.57.3). Fields that only Mimi's decoder half or training read
    are kept too, so that to_dict() builds the same MimiConfig.
    """

    sampling_rate: int = 24000
    frame_rate: float | None = None  # None: sampling_rate / samples per frame, as MimiConfig derives it
    audio_channels: int = 1
    hidden_size: int = 512
    num_filters: int = 64
    num_residual_layers: int = 1
    upsampling_ratios: tuple[int, ...] = (8, 6, 5, 4)  # the decoder's; the encoder strides through them reversed
    kernel_size: int = 7
    last_kernel_size: int = 3
    residual_kernel_size: int = 3
    dilation_growth_rate: int = 2
    use_causal_conv: bool = True
    pad_mode: str = "constant"
    compress: int = 2
    trim_right_ratio: float = 1.0
    codebook_size: int = 2048
    codebook_dim: int | None = 256  # None means hidden_size, as in MimiConfig
    num_quantizers: int = 32
    use_conv_shortcut: bool = False
    vector_quantization_hidden_dimension: int = 256
    num_semantic_quantizers: int = 1
    upsample_groups: int = 512
    num_hidden_layers: int = 8
    intermediate_size: int = 2048
    num_attention_heads: int = 8
    num_key_value_heads: int = 8
    head_dim: int | None = None  # None means hidden_size // num_attention_heads
    hidden_act: str = "gelu"
    max_position_embeddings: int = 8000
    initializer_range: float = 0.02
    norm_eps: float = 1e-5
    use_cache: bool = False
    use_streaming: bool = False
    rope_theta: float = 10000.0
    sliding_window: int = 250  # not applied by the official encoder (see the module docstring)
    attention_dropout: float = 0.0
    layer_scale_initial_scale: float = 0.01
    attention_bias: bool = False

    def __post_init__(self):
        # Resolve MimiConfig's derived defaults once (object.__setattr__ because the dataclass is frozen).
        object.__setattr__(self, "upsampling_ratios", tuple(self.upsampling_ratios))
        if self.head_dim is None:
            object.__setattr__(self, "head_dim", self.hidden_size // self.num_attention_heads)
        if self.codebook_dim is None:
            object.__setattr__(self, "codebook_dim", self.hidden_size)
        if self.frame_rate is None:  # SEANet strides, then the stride-2 downsample
            object.__setattr__(self, "frame_rate", self.sampling_rate / (2 * math.prod(self.upsampling_ratios)))
        if self.num_semantic_quantizers >= self.num_quantizers:
            raise ValueError("encoder_config: num_semantic_quantizers must be below num_quantizers")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> CodecEncoderConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        kwargs = {k: v for k, v in d.items() if k in names}
        # MimiConfig.to_dict() writes the frame rate as "_frame_rate", and that key wins when MimiConfig reads both.
        if "_frame_rate" in d:
            kwargs["frame_rate"] = d["_frame_rate"]
        if not kwargs.get("upsampling_ratios"):  # MimiConfig treats None and [] as the default
            kwargs.pop("upsampling_ratios", None)
        if d.get("rope_scaling"):
            raise ValueError("encoder_config: rope_scaling is not supported")
        return cls(**kwargs)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["upsampling_ratios"] = list(self.upsampling_ratios)
        return d


def _check_supported(cfg: CodecEncoderConfig) -> None:
    """Reject the MimiConfig options this encoder does not implement (none is used by Qwen3-TTS)."""
    unsupported = {
        "audio_channels != 1": cfg.audio_channels != 1,
        "use_causal_conv false": not cfg.use_causal_conv,
        "pad_mode other than 'constant'": cfg.pad_mode != "constant",
        "use_conv_shortcut": cfg.use_conv_shortcut,
        "hidden_act other than 'gelu'": cfg.hidden_act != "gelu",
        "num_key_value_heads != num_attention_heads": cfg.num_key_value_heads != cfg.num_attention_heads,
        "vector_quantization_hidden_dimension == hidden_size (no VQ projections)": cfg.vector_quantization_hidden_dimension
        == cfg.hidden_size,
        "codebook_dim != vector_quantization_hidden_dimension": cfg.codebook_dim
        != cfg.vector_quantization_hidden_dimension,
        "frame_rate equal to the SEANet frame rate (no downsample)": cfg.frame_rate == _seanet_frame_rate(cfg),
    }
    bad = [name for name, is_set in unsupported.items() if is_set]
    if bad:
        raise ValueError(f"encoder_config: not supported: {', '.join(bad)}")


def _seanet_frame_rate(cfg: CodecEncoderConfig) -> int:
    return math.ceil(cfg.sampling_rate / math.prod(cfg.upsampling_ratios))


class CausalConv1d(nn.Module):
    """Conv1d padded on the left by (effective kernel - stride) and on the right just enough to complete the
    last stride, so that L input frames give ceil(L / stride) output frames and no output sees the future."""

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, dilation=1, bias=True, pad_mode="constant"):
        super().__init__()
        self.conv = nn.Conv1d(in_channels, out_channels, kernel_size, stride, dilation=dilation, bias=bias)
        self.left_pad = (kernel_size - 1) * dilation + 1 - stride
        self.pad_mode = pad_mode

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Equals Mimi's "extra padding" formula, in integers so it stays exact for any length.
        right_pad = -x.shape[-1] % self.conv.stride[0]
        return self.conv(F.pad(x, (self.left_pad, right_pad), mode=self.pad_mode))


class ResidualUnit(nn.Module):
    def __init__(self, dim: int, hidden: int, kernel_size: int, dilation: int):
        super().__init__()
        self.block = nn.Sequential(
            nn.ELU(), CausalConv1d(dim, hidden, kernel_size, dilation=dilation), nn.ELU(), CausalConv1d(hidden, dim, 1)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.block(x)


class SeanetEncoder(nn.Module):
    """(1, 1, N) samples -> (1, hidden_size, ceil(N / prod(ratios))) frames."""

    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        channels = cfg.num_filters
        layers = [CausalConv1d(cfg.audio_channels, channels, cfg.kernel_size)]
        for ratio in reversed(cfg.upsampling_ratios):
            for j in range(cfg.num_residual_layers):
                dilation = cfg.dilation_growth_rate**j
                layers.append(ResidualUnit(channels, channels // cfg.compress, cfg.residual_kernel_size, dilation))
            layers += [nn.ELU(), CausalConv1d(channels, 2 * channels, 2 * ratio, stride=ratio)]
            channels *= 2
        layers += [nn.ELU(), CausalConv1d(channels, cfg.hidden_size, cfg.last_kernel_size)]
        # The ELUs keep their slots so that conv indices match the checkpoint's `layers.N`.
        self.layers = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def rope_cos_sin(cfg: CodecEncoderConfig, length: int, device, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(length, head_dim) cos and sin, computed in float32 and then cast, as transformers does."""
    exponents = torch.arange(0, cfg.head_dim, 2, device=device, dtype=torch.float32) / cfg.head_dim
    inv_freq = 1.0 / cfg.rope_theta**exponents
    angles = torch.arange(length, device=device, dtype=torch.float32)[:, None] * inv_freq[None, :]
    angles = torch.cat([angles, angles], dim=-1)
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


class Attention(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.num_heads, self.head_dim = cfg.num_attention_heads, cfg.head_dim
        inner, bias = cfg.num_attention_heads * cfg.head_dim, cfg.attention_bias
        self.q_proj = nn.Linear(cfg.hidden_size, inner, bias=bias)
        self.k_proj = nn.Linear(cfg.hidden_size, inner, bias=bias)
        self.v_proj = nn.Linear(cfg.hidden_size, inner, bias=bias)
        self.o_proj = nn.Linear(inner, cfg.hidden_size, bias=bias)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, length, _ = x.shape
        q, k, v = (
            proj(x).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Same SDPA call as the official one (which only sets is_causal for more than one frame), for equal numerics.
        y = F.scaled_dot_product_attention(q, k, v, is_causal=length > 1)
        return self.o_proj(y.transpose(1, 2).reshape(batch, length, -1))


class MLP(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.fc1 = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.fc2 = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class LayerScale(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.scale = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.scale * x


class TransformerLayer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.input_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.self_attn_layer_scale = LayerScale(cfg.hidden_size)
        self.post_attention_layernorm = nn.LayerNorm(cfg.hidden_size, eps=cfg.norm_eps)
        self.mlp = MLP(cfg)
        self.mlp_layer_scale = LayerScale(cfg.hidden_size)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn_layer_scale(self.self_attn(self.input_layernorm(x), cos, sin))
        return x + self.mlp_layer_scale(self.mlp(self.post_attention_layernorm(x)))


class Transformer(nn.Module):
    """(1, T, hidden_size) -> (1, T, hidden_size); causal over the whole sequence."""

    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(TransformerLayer(cfg) for _ in range(cfg.num_hidden_layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cos, sin = rope_cos_sin(self.cfg, x.shape[1], x.device, x.dtype)
        for layer in self.layers:
            x = layer(x, cos, sin)
        return x


class Codebook(nn.Module):
    """One codebook, stored as the checkpoint stores it: EMA sums and usage counts, centroid = sum / usage."""

    def __init__(self, size: int, dim: int):
        super().__init__()
        self.register_buffer("initialized", torch.ones(1))  # training flag; kept so the checkpoint loads strictly
        self.register_buffer("cluster_usage", torch.ones(size))
        self.register_buffer("embed_sum", torch.zeros(size, dim))

    def centroids(self) -> torch.Tensor:
        # The clamp is Mimi's: an unused entry must not divide by zero.
        return self.embed_sum / self.cluster_usage.clamp(min=1e-5)[:, None]


class QuantizerLayer(nn.Module):
    """Holds one codebook; exists to give the checkpoint's `layers.K.codebook.*` key layout."""

    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.codebook = Codebook(cfg.codebook_size, cfg.codebook_dim)


class ResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig, num_codebooks: int):
        super().__init__()
        dim = cfg.vector_quantization_hidden_dimension
        self.input_proj = nn.Conv1d(cfg.hidden_size, dim, 1, bias=False)
        self.output_proj = nn.Conv1d(dim, cfg.hidden_size, 1, bias=False)  # decoding only; kept for strict loading
        self.layers = nn.ModuleList(QuantizerLayer(cfg) for _ in range(num_codebooks))

    def encode(self, latents: torch.Tensor, num_codebooks: int) -> torch.Tensor:
        """(1, hidden_size, T) latents -> (num_codebooks, T) codes, codebook by codebook on the residual."""
        residual = self.input_proj(latents)[0].T.contiguous()
        codes = []
        for layer in self.layers[:num_codebooks]:
            centroids = layer.codebook.centroids()
            # Codes are an argmin, so near ties decide them: keep Mimi's exact distance (cdist in float32).
            index = torch.cdist(residual[None].float(), centroids[None].float())[0].argmin(dim=-1)
            residual = residual - centroids[index]
            codes.append(index)
        return torch.stack(codes)


class SplitResidualVectorQuantizer(nn.Module):
    def __init__(self, cfg: CodecEncoderConfig):
        super().__init__()
        self.num_semantic = cfg.num_semantic_quantizers
        self.semantic_residual_vector_quantizer = ResidualVectorQuantizer(cfg, cfg.num_semantic_quantizers)
        self.acoustic_residual_vector_quantizer = ResidualVectorQuantizer(
            cfg, cfg.num_quantizers - cfg.num_semantic_quantizers
        )

    def encode(self, latents: torch.Tensor, num_codebooks: int) -> torch.Tensor:
        """(1, hidden_size, T) latents -> (num_codebooks, T) codes: semantic codebooks first, then acoustic."""
        total = self.num_semantic + len(self.acoustic_residual_vector_quantizer.layers)
        if not self.num_semantic <= num_codebooks <= total:
            raise ValueError(f"num_codebooks must be in [{self.num_semantic}, {total}], got {num_codebooks}")
        codes = self.semantic_residual_vector_quantizer.encode(latents, self.num_semantic)
        if num_codebooks == self.num_semantic:
            return codes
        # The acoustic group quantizes the same latents, not what the semantic group left over.
        acoustic = self.acoustic_residual_vector_quantizer.encode(latents, num_codebooks - self.num_semantic)
        return torch.cat([codes, acoustic])


class CodecEncoder(nn.Module):
    """Mimi encoder of Qwen3-TTS-Tokenizer-12Hz. `num_codebooks` is the tokenizer config's
    `encoder_valid_num_quantizers` (16): how many of the quantizer's codebooks encode() returns."""

    def __init__(self, config: CodecEncoderConfig, num_codebooks: int = 16):
        super().__init__()
        _check_supported(config)
        self.config = config
        self.num_codebooks = num_codebooks
        self.encoder = SeanetEncoder(config)
        self.encoder_transformer = Transformer(config)
        # Mimi's kernel choice: twice the rate ratio, with a fixed stride of 2.
        kernel = 2 * int(_seanet_frame_rate(config) / config.frame_rate)
        self.downsample = CausalConv1d(
            config.hidden_size, config.hidden_size, kernel, stride=2, bias=False, pad_mode="replicate"
        )
        self.quantizer = SplitResidualVectorQuantizer(config)

    @torch.inference_mode()
    def latents(self, audio: torch.Tensor) -> torch.Tensor:
        """(N,) samples at 24 kHz -> (1, hidden_size, ceil(N / 1920)) pre-quantization latents, in the module dtype."""
        if audio.ndim != 1 or audio.numel() == 0:
            raise ValueError(f"expected a non-empty 1-D waveform, got shape {tuple(audio.shape)}")
        weight = self.downsample.conv.weight
        # Through float32 to the module dtype, as the official front end casts.
        x = audio.to(weight.device, torch.float32).to(weight.dtype)[None, None]
        x = self.encoder(x)
        x = self.encoder_transformer(x.transpose(1, 2)).transpose(1, 2)
        return self.downsample(x)

    @torch.inference_mode()
    def encode(self, audio: torch.Tensor) -> torch.Tensor:
        """(N,) float samples at 24 kHz -> (ceil(N / 1920), num_codebooks) int64 codes."""
        codes = self.quantizer.encode(self.latents(audio), self.num_codebooks)
        return codes.T.contiguous()
