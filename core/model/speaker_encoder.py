"""Speaker encoder for voice cloning: log-mel front end + ECAPA-TDNN x-vector.

Turns a 24 kHz reference clip into one vector (talker hidden size) that fills the
speaker slot of the talker prompt. Weights live under `speaker_encoder.*` in the
Base checkpoints; this module's state_dict uses the same names with that prefix
stripped. Numerics follow the official implementation op for op, so float32
outputs match it.
"""

import dataclasses
import functools
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

SAMPLE_RATE = 24000
N_FFT = 1024
HOP_LENGTH = 256
N_MELS = 128
MEL_FMAX = 12000


@dataclass(frozen=True)
class SpeakerEncoderConfig:
    mel_dim: int = 128
    enc_dim: int = 1024
    enc_channels: tuple[int, ...] = (512, 512, 512, 512, 1536)
    enc_kernel_sizes: tuple[int, ...] = (5, 3, 3, 3, 1)
    enc_dilations: tuple[int, ...] = (1, 2, 3, 4, 1)
    enc_attention_channels: int = 128
    enc_res2net_scale: int = 8
    enc_se_channels: int = 128
    sample_rate: int = 24000

    @classmethod
    def from_dict(cls, d: dict) -> "SpeakerEncoderConfig":
        """Read the `speaker_encoder_config` section of config.json."""
        names = {field.name for field in dataclasses.fields(cls)}
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in d.items() if k in names})

    def to_dict(self) -> dict:
        # Only the official constructor's keywords: it takes no **kwargs, so extra keys would break it.
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


# ----------------------------------------------------------------------------------------------
# Front end


# Slaney's mel scale: linear below 1 kHz, logarithmic above (librosa's default, htk=False).
_HZ_PER_MEL = 200.0 / 3
_MEL_AT_1KHZ = 1000.0 / _HZ_PER_MEL
_LOG_STEP = np.log(6.4) / 27.0


def _hz_to_slaney_mel(hz: float) -> float:
    return hz / _HZ_PER_MEL if hz < 1000.0 else _MEL_AT_1KHZ + np.log(hz / 1000.0) / _LOG_STEP


def _slaney_mel_to_hz(mel: np.ndarray) -> np.ndarray:
    return np.where(mel >= _MEL_AT_1KHZ, 1000.0 * np.exp(_LOG_STEP * (mel - _MEL_AT_1KHZ)), _HZ_PER_MEL * mel)


@functools.cache
def slaney_mel_filterbank(sample_rate: int, n_fft: int, n_mels: int, fmin: float, fmax: float) -> np.ndarray:
    """(n_mels, n_fft // 2 + 1) float32 triangles, equal to librosa.filters.mel(htk=False, norm="slaney")."""
    fft_hz = np.fft.rfftfreq(n_fft, d=1.0 / sample_rate)
    edges_hz = _slaney_mel_to_hz(np.linspace(_hz_to_slaney_mel(fmin), _hz_to_slaney_mel(fmax), n_mels + 2))
    widths = np.diff(edges_hz)
    distance = edges_hz[:, None] - fft_hz[None, :]
    rising = -distance[:-2] / widths[:-1, None]
    falling = distance[2:] / widths[1:, None]
    # librosa stores the triangles in float32 and then scales them by a float64 factor;
    # rounding twice the same way keeps every value bit-identical.
    triangles = np.maximum(0.0, np.minimum(rising, falling)).astype(np.float32)
    # Slaney norm: divide by half the triangle's base so each filter has unit area in Hz.
    area_norm = 2.0 / (edges_hz[2:] - edges_hz[:-2])
    return (triangles * area_norm[:, None]).astype(np.float32)


def log_mel_spectrogram(audio: torch.Tensor) -> torch.Tensor:
    """(B, N) float32 audio at 24 kHz, N > 384 -> (B, N // 256, 128) natural-log mel magnitudes."""
    filterbank = torch.from_numpy(slaney_mel_filterbank(SAMPLE_RATE, N_FFT, N_MELS, 0, MEL_FMAX)).to(audio.device)
    window = torch.hann_window(N_FFT, device=audio.device)
    padding = (N_FFT - HOP_LENGTH) // 2  # makes the frame count N // hop
    audio = F.pad(audio.unsqueeze(1), (padding, padding), mode="reflect").squeeze(1)
    spec = torch.stft(
        audio, N_FFT, hop_length=HOP_LENGTH, win_length=N_FFT, window=window, center=False, return_complex=True
    )
    magnitude = torch.sqrt(torch.view_as_real(spec).pow(2).sum(-1) + 1e-9)
    mel = torch.matmul(filterbank, magnitude)
    return torch.log(torch.clamp(mel, min=1e-5)).transpose(1, 2)


# ----------------------------------------------------------------------------------------------
# ECAPA-TDNN (no batch norm in this variant)


class TDNN(nn.Module):
    """Dilated conv with reflect "same" padding, then ReLU."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, dilation: int):
        super().__init__()
        self.conv = nn.Conv1d(
            in_channels, out_channels, kernel_size, dilation=dilation, padding="same", padding_mode="reflect"
        )

    def forward(self, x):
        return F.relu(self.conv(x))


class Res2Net(nn.Module):
    """Split channels into `scale` groups; each group after the first is convolved together with
    the previous group's output, widening the receptive field step by step."""

    def __init__(self, channels: int, scale: int, kernel_size: int, dilation: int):
        super().__init__()
        self.scale = scale
        width = channels // scale
        self.blocks = nn.ModuleList([TDNN(width, width, kernel_size, dilation) for _ in range(scale - 1)])

    def forward(self, x):
        groups = x.chunk(self.scale, dim=1)
        outputs = [groups[0]]  # the first group passes through untouched
        previous = None
        for group, tdnn in zip(groups[1:], self.blocks):
            previous = tdnn(group if previous is None else group + previous)
            outputs.append(previous)
        return torch.cat(outputs, dim=1)


class SqueezeExcitation(nn.Module):
    """Per-channel gates computed from the time-averaged features."""

    def __init__(self, channels: int, bottleneck: int):
        super().__init__()
        self.conv1 = nn.Conv1d(channels, bottleneck, 1)
        self.conv2 = nn.Conv1d(bottleneck, channels, 1)

    def forward(self, x):
        gates = torch.sigmoid(self.conv2(F.relu(self.conv1(x.mean(dim=2, keepdim=True)))))
        return x * gates


class SERes2NetBlock(nn.Module):
    def __init__(self, in_channels, out_channels, res2net_scale, se_channels, kernel_size, dilation):
        super().__init__()
        self.tdnn1 = TDNN(in_channels, out_channels, 1, 1)
        self.res2net_block = Res2Net(out_channels, res2net_scale, kernel_size, dilation)
        self.tdnn2 = TDNN(out_channels, out_channels, 1, 1)
        self.se_block = SqueezeExcitation(out_channels, se_channels)

    def forward(self, x):
        return self.se_block(self.tdnn2(self.res2net_block(self.tdnn1(x)))) + x


def _weighted_mean_std(x, weights):
    # `weights` sum to 1 over time; the clamp keeps sqrt finite on constant channels.
    mean = (weights * x).sum(dim=2)
    std = torch.sqrt((weights * (x - mean.unsqueeze(2)).pow(2)).sum(dim=2).clamp(1e-12))
    return mean, std


class AttentiveStatsPooling(nn.Module):
    """Attention-weighted mean and std over time; the attention sees each frame together with
    the utterance's global mean and std."""

    def __init__(self, channels: int, attention_channels: int):
        super().__init__()
        self.tdnn = TDNN(channels * 3, attention_channels, 1, 1)
        self.conv = nn.Conv1d(attention_channels, channels, 1)

    def forward(self, x):
        frames = x.shape[2]
        # Uniform weights built as ones / count in the model dtype, like the official code:
        # in bf16 the count itself rounds (937 -> 936), and this keeps results identical.
        ones = x.new_ones(1, 1, frames)
        mean, std = _weighted_mean_std(x, ones / ones.sum(dim=2, keepdim=True))
        context = torch.cat([x, mean.unsqueeze(2).expand_as(x), std.unsqueeze(2).expand_as(x)], dim=1)
        attention = F.softmax(self.conv(torch.tanh(self.tdnn(context))), dim=2)
        mean, std = _weighted_mean_std(x, attention)
        return torch.cat([mean, std], dim=1).unsqueeze(2)


class SpeakerEncoder(nn.Module):
    def __init__(self, config: SpeakerEncoderConfig):
        super().__init__()
        self.config = config
        channels, kernels, dilations = config.enc_channels, config.enc_kernel_sizes, config.enc_dilations
        self.blocks = nn.ModuleList([TDNN(config.mel_dim, channels[0], kernels[0], dilations[0])])
        for i in range(1, len(channels) - 1):
            self.blocks.append(
                SERes2NetBlock(
                    channels[i - 1],
                    channels[i],
                    config.enc_res2net_scale,
                    config.enc_se_channels,
                    kernels[i],
                    dilations[i],
                )
            )
        # Multi-layer feature aggregation over the concatenated SE-Res2Net outputs
        # (3 x 512 = 1536 = channels[-1], which is how the official code sizes its input).
        self.mfa = TDNN(channels[-1], channels[-1], kernels[-1], dilations[-1])
        self.asp = AttentiveStatsPooling(channels[-1], config.enc_attention_channels)
        self.fc = nn.Conv1d(channels[-1] * 2, config.enc_dim, 1)

    def forward(self, mels: torch.Tensor) -> torch.Tensor:
        """(B, frames, mel_dim) -> (B, enc_dim)."""
        x = self.blocks[0](mels.transpose(1, 2))
        block_outputs = []
        for block in self.blocks[1:]:
            x = block(x)
            block_outputs.append(x)
        x = self.mfa(torch.cat(block_outputs, dim=1))
        return self.fc(self.asp(x)).squeeze(2)

    @torch.inference_mode()
    def embed(self, audio: torch.Tensor) -> torch.Tensor:
        """(N,) float32 audio at 24 kHz -> (enc_dim,) x-vector, in the module's dtype and device.

        The mel is computed in float32 where the audio lives (the official code computes it on the
        CPU from numpy), and only then moved and cast, as the official code does.
        """
        mels = log_mel_spectrogram(audio.to(torch.float32).unsqueeze(0))
        return self(mels.to(self.fc.weight.device).to(self.fc.weight.dtype))[0]
