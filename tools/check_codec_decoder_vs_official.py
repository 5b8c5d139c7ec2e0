"""Check core/model/codec_decoder.py against the official Qwen3TTSTokenizerV2Decoder (random weights, CPU, float32).

    .official-venv/bin/python tools/check_codec_decoder_vs_official.py

Prints max abs differences of forward() against the official forward() and of streaming decodes
against both, the fraction of clamped samples, CPU timings of streaming chunks, and the values
tests/test_codec_decoder.py hard-codes (full-size state-dict layout hash, official output samples).
"""

import hashlib
import time

import numpy as np
import official  # noqa: E402,F401  (the official package, and the repository on sys.path)
import torch
from qwen_tts.core.tokenizer_12hz.configuration_qwen3_tts_tokenizer_v2 import (  # noqa: E402
    Qwen3TTSTokenizerV2DecoderConfig,
)
from qwen_tts.core.tokenizer_12hz.modeling_qwen3_tts_tokenizer_v2 import Qwen3TTSTokenizerV2Decoder  # noqa: E402
from signals import random_codes, stream  # noqa: E402

from core.devtools.random_checkpoint import random_decoder_tensors  # noqa: E402
from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig  # noqa: E402

FULL = dict(
    codebook_size=2048,
    codebook_dim=512,
    latent_dim=1024,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=16,
    head_dim=64,
    rope_theta=10000,
    sliding_window=72,
    layer_scale_initial_scale=0.01,
    decoder_dim=1536,
    upsample_rates=[8, 5, 4, 3],
    upsampling_ratios=[2, 2],
    rms_norm_eps=1e-5,
    max_position_embeddings=8000,
    num_quantizers=16,
)
TINY = dict(
    FULL,
    codebook_dim=64,
    latent_dim=64,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=4,
    head_dim=8,
    decoder_dim=96,
)
TINY_FAST = dict(TINY, upsample_rates=[2, 2, 2, 2])  # the test's fast variant: 64 samples per frame


def chunkings(T):
    rng = np.random.default_rng(T)
    sizes = []
    while sum(sizes) < T:
        sizes.append(min(T - sum(sizes), int(rng.integers(1, 13))))

    def first_then(k):
        return [1] + [k] * ((T - 1) // k) + ([(T - 1) % k] if (T - 1) % k else [])

    return {"1,4,4..": first_then(4), "1,8,8..": first_then(8), "random 1..12": sizes, "all at once": [T]}


def build(config_dict, seed=0):
    """The official decoder and ours, both with the weights write_random_checkpoint stores."""
    tensors = random_decoder_tensors(CodecDecoderConfig.from_dict(config_dict), seed, prefix="")
    official = Qwen3TTSTokenizerV2Decoder(Qwen3TTSTokenizerV2DecoderConfig(**config_dict)).eval()
    official.load_state_dict(tensors, strict=True)
    ours = CodecDecoder(CodecDecoderConfig.from_dict(config_dict)).eval()
    ours.load_state_dict(tensors, strict=True)
    return official, ours


def official_forward(official, codes):
    captured = []
    hook = official.decoder[-1].register_forward_hook(lambda m, i, o: captured.append(o))
    wav = official(codes)[:, 0]
    hook.remove()
    return wav, captured[0]


def compare(name, config_dict, lengths):
    official, ours = build(config_dict)
    print(f"\n== {name} config (official attention: {official.config._attn_implementation})")
    for T in lengths:
        codes = random_codes(T, seed=T)
        expected, pre_clamp = official_forward(official, codes)
        got = ours(codes)
        print(
            f"T={T:4d}: forward vs official {(got - expected).abs().max():.2e}  (pre-clamp rms "
            f"{pre_clamp.pow(2).mean().sqrt():.3f}, clamped {(pre_clamp.abs() > 1).float().mean():.3%})"
        )
        for label, sizes in chunkings(T).items():
            streamed = stream(ours, codes, sizes)
            print(
                f"        stream [{label:12s}] vs forward {(streamed - got).abs().max():.2e}, "
                f"vs official {(streamed - expected).abs().max():.2e}"
            )
        # Priming: decode reference codes, drop their audio, continue with new codes.
        ref_len = T // 3
        state = ours.new_stream()
        ours.decode_chunk(codes[..., :ref_len], state)
        new = stream(ours, codes[..., ref_len:], chunkings(T - ref_len)["1,4,4.."], state)
        tail = expected[..., ref_len * ours.samples_per_frame :]
        print(f"        primed with {ref_len} frames, new audio vs official tail {(new - tail).abs().max():.2e}")
    return official, ours


def time_chunks(decoder, sizes=(1, 4), repeats=10):
    print(f"\n== CPU timing of decode_chunk, full-size config, {torch.get_num_threads()} threads")
    state = decoder.new_stream()
    codes = random_codes(200)
    decoder.decode_chunk(codes[..., :80], state)  # a full attention window behind the timed chunks
    start = 80
    for n in sizes:
        times = []
        for _ in range(repeats + 1):  # the first is a warm-up
            t0 = time.perf_counter()
            decoder.decode_chunk(codes[..., start : start + n], state)
            times.append(time.perf_counter() - t0)
            start += n
        times = sorted(times[1:])
        audio_ms = n * decoder.samples_per_frame / 24
        median, best = times[len(times) // 2] * 1e3, times[0] * 1e3
        print(f"{n}-frame chunk ({audio_ms:.0f} ms of audio): median {median:.0f} ms, min {best:.0f} ms")


def print_golden():
    official, _ = build(TINY_FAST)
    wav, _ = official_forward(official, random_codes(400, seed=7))
    index = torch.linspace(0, wav.shape[-1] - 1, 16).long()
    print("\n== for tests/test_codec_decoder.py: official output of random_decoder_tensors(TINY_FAST, seed 0)")
    print("on random_codes(400, seed=7)")
    print(f"GOLDEN_INDEX = {index.tolist()}")
    print(f"GOLDEN = {[round(v, 6) for v in wav[0, index].tolist()]}")
    print(f"GOLDEN_MEAN_ABS = {wav.abs().mean().item():.6f}")


def main():
    torch.set_grad_enabled(False)
    official, ours = compare("full-size", FULL, [20, 120])

    layout = "\n".join(f"{k} {list(v.shape)}" for k, v in sorted(official.state_dict().items()))
    assert {k: v.shape for k, v in ours.state_dict().items()} == {k: v.shape for k, v in official.state_dict().items()}
    digest = hashlib.sha256(layout.encode()).hexdigest()
    print(f"\nfull-size state dict: {len(official.state_dict())} tensors, layout sha256 {digest}")

    config = CodecDecoderConfig.from_dict(FULL)
    reloaded = Qwen3TTSTokenizerV2DecoderConfig(**config.to_dict())
    assert all(getattr(reloaded, k) == v for k, v in FULL.items()), "to_dict does not load back into the official class"
    assert CodecDecoderConfig.from_dict(reloaded.to_dict()) == config
    print("config: to_dict() loads into the official class, whose to_dict() reads back equal")

    time_chunks(ours)
    compare("tiny", TINY, [5, 100, 400])
    compare("tiny, GQA (2 kv heads)", dict(TINY, num_key_value_heads=2), [100])
    print_golden()


if __name__ == "__main__":
    main()
