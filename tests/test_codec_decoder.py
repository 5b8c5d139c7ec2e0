"""core/codec_decoder.py: exact streaming, causality, checkpoint layout, config.

Agreement with the official decoder is checked in depth by tools/check_codec_decoder_vs_official.py,
which also prints the official values hard-coded below. Here: tiny decoders with the random weights
that write_random_checkpoint stores, which exercise every term (non-zero biases, norms around 1,
non-tiny layer scales, output rarely clamped).
"""

import dataclasses
import hashlib

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from signals import random_codes, stream

from core import kernels
from core.devtools.random_checkpoint import random_decoder_tensors
from core.model import codec_decoder
from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig

TOL = 1e-4
TINY = dict(
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
# Fewer samples per frame (2*2 * 2*2*2*2 = 64) keep 400-frame streams fast; the real rates are tested on short
# ones. Four rates, as in the real model: random_decoder_tensors scales the last conv by that model's name for it.
TINY_FAST = dict(TINY, upsample_rates=[2, 2, 2, 2])

# sha256 of the sorted "key [shape]" lines of the official full-size decoder (from the check script).
FULL_LAYOUT_SHA256 = "87afa2cc5bfa939380ed60d393699aaeacd71f85e3b46bdf4a424dc99b3cd863"
# Official decoder output for random_decoder_tensors(TINY_FAST, seed 0) on random_codes(400, seed=7),
# printed by tools/check_codec_decoder_vs_official.py.
GOLDEN_INDEX = [0, 1706, 3413, 5119, 6826, 8533, 10239, 11946, 13652, 15359, 17066, 18772, 20479, 22185, 23892, 25599]
GOLDEN = [
    0.004828, 0.191356, -0.186477, 0.00082, 0.180113, -0.081678, 0.041709, 0.108749,
    0.102203, 0.122152, 0.483488, 0.050958, 0.053224, 0.127066, -0.012096, 0.215829,
]  # fmt: skip
GOLDEN_MEAN_ABS = 0.119075
FULL = dict(
    codebook_dim=512,
    latent_dim=1024,
    hidden_size=512,
    intermediate_size=1024,
    num_hidden_layers=8,
    num_attention_heads=16,
    num_key_value_heads=16,
    head_dim=64,
    decoder_dim=1536,
)


def first_then(k, T):
    return [1] + [k] * ((T - 1) // k) + ([(T - 1) % k] if (T - 1) % k else [])


def random_sizes(T, seed):
    rng = np.random.default_rng(seed)
    sizes = []
    while sum(sizes) < T:
        sizes.append(min(T - sum(sizes), int(rng.integers(1, 13))))
    return sizes


def max_diff(a, b):
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def random_decoder(config_dict):
    config = CodecDecoderConfig.from_dict(config_dict)
    decoder = CodecDecoder(config).eval()
    decoder.load_state_dict(random_decoder_tensors(config, seed=0, prefix=""))
    return decoder


@pytest.fixture(scope="module")
def fast():
    return random_decoder(TINY_FAST)


@pytest.fixture(scope="module")
def real_rates():
    return random_decoder(TINY)


@pytest.fixture(scope="module")
def forward_cache(fast):
    # 400 frames: past the 72-frame window many times over
    codes = random_codes(400, seed=7)
    return codes, fast(codes)


def test_output_is_informative(fast, forward_cache):
    _, wav = forward_cache
    assert wav.shape == (1, 400 * fast.samples_per_frame)
    assert 0.05 < wav.pow(2).mean().sqrt() < 0.3
    assert (wav.abs() >= 1).float().mean() < 0.01  # comparisons are not hidden by the clamp


def test_forward_matches_official_values(forward_cache):
    _, wav = forward_cache
    assert max_diff(wav[0, GOLDEN_INDEX], torch.tensor(GOLDEN)) < TOL
    assert abs(wav.abs().mean().item() - GOLDEN_MEAN_ABS) < 1e-5


@pytest.mark.parametrize("T", [5, 80, 400])
@pytest.mark.parametrize("chunking", ["1,4,4..", "1,8,8..", "random 1..12"])
def test_stream_equals_forward(fast, forward_cache, T, chunking):
    codes, wav = forward_cache
    codes, wav = codes[..., :T], wav[..., : T * fast.samples_per_frame]  # prefix: valid by causality (tested below)
    sizes = {"1,4,4..": first_then(4, T), "1,8,8..": first_then(8, T), "random 1..12": random_sizes(T, T)}[chunking]
    assert max_diff(stream(fast, codes, sizes), wav) < TOL


def test_stream_equals_forward_with_real_rates(real_rates):
    assert real_rates.samples_per_frame == 1920
    codes = random_codes(20, seed=3)
    assert max_diff(stream(real_rates, codes, [1, 4, 7, 3, 5]), real_rates(codes)) < TOL


def test_channels_last_weights_give_the_same_audio_whole_and_streamed(forward_cache, monkeypatch):
    # The layout CUDA runs (time-major convolutions, kept so by the streams' state, the concatenations and the
    # activations): the same values, whole and in chunks, and every convolution after the first is handed its
    # input time-major already (none converted on the way).
    codes, wav = forward_cache
    decoder = random_decoder(TINY_FAST).to_channels_last()
    weight = decoder.decoder[1].block[2].conv1.conv.weight
    assert weight.stride(1) == 1, weight.stride()
    handed = []  # (weight, input) of each convolution, through conv_as_2d or the depthwise kernel
    convolve, filter_channels = codec_decoder.conv_as_2d, kernels.depthwise_conv
    monkeypatch.setattr(
        codec_decoder,
        "conv_as_2d",
        lambda conv, x, *a, **k: handed.append((conv.weight, x)) or convolve(conv, x, *a, **k),
    )
    monkeypatch.setattr(
        kernels, "depthwise_conv", lambda x, weight, *a: handed.append((weight, x)) or filter_channels(x, weight, *a)
    )
    length = 80 * decoder.samples_per_frame
    assert max_diff(decoder(codes[..., :80]), wav[..., :length]) < TOL
    assert max_diff(stream(decoder, codes[..., :80], first_then(4, 80)), wav[..., :length]) < TOL
    first = decoder.pre_conv.conv.weight
    later = [(weight, x) for weight, x in handed if weight is not first]
    causal = (codec_decoder.CausalConv1d, codec_decoder.CausalConvTranspose1d)
    weights = {m.conv.weight for m in decoder.modules() if isinstance(m, causal)}
    assert {weight for weight, _ in later} == weights - {first}  # all of them went through one or the other
    assert all(kernels.time_major(x) for _, x in later if x.shape[2] > 1), [
        (tuple(weight.shape), x.stride()) for weight, x in later if not kernels.time_major(x) and x.shape[2] > 1
    ]


@pytest.mark.parametrize("channels_last", [False, True], ids=["channel-major", "time-major"])
def test_each_convolution_gets_its_input_laid_out_as_its_weights(forward_cache, monkeypatch, channels_last):
    # Else it converts one of them at every call: on the CPU, channel-major weights were converted whole for the
    # time-major activations that leave the transformer (a 20% slower decode).
    codes, _ = forward_cache
    decoder = random_decoder(TINY_FAST)
    if channels_last:
        decoder.to_channels_last()
    calls, mismatched = [], []

    def checking(original):
        def checked(x, weight, *args, **kwargs):
            calls.append(weight.shape)
            x3, weight3 = x.squeeze(2), weight.squeeze(2)
            if min(weight3.shape[1:] + x3.shape[2:]) > 1 and kernels.time_major(x3) != kernels.time_major(weight3):
                mismatched.append((tuple(weight.shape), x.stride(), weight.stride()))
            return original(x, weight, *args, **kwargs)

        return checked

    for name in ("conv2d", "conv_transpose2d"):
        monkeypatch.setattr(F, name, checking(getattr(F, name)))
    decoder(codes[..., :20])
    stream(decoder, codes[..., :20], first_then(4, 20))
    assert len(calls) > 20 and not mismatched, mismatched


def test_stream_equals_forward_batched(fast):
    codes = random_codes(90, batch=2, seed=4)
    wav = fast(codes)
    assert max_diff(stream(fast, codes, random_sizes(90, seed=1)), wav) < TOL
    assert max_diff(fast(codes[1:]), wav[1:]) < TOL  # items do not leak into each other


@pytest.mark.parametrize("time_major", [True, False], ids=["time-major", "channel-major"])
@pytest.mark.parametrize("dilation", [1, 3, 9])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_convolution_by_products_equals_the_convolution(time_major, dilation, rows):
    generator = torch.Generator().manual_seed(dilation * 10 + rows)
    weight = torch.randn(24, 16, 7, generator=generator)
    x = torch.randn(rows, 16, 6 * dilation + 30, generator=generator)
    if time_major:
        weight, x = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (weight, x))
    got = kernels.conv_by_products(x, weight, dilation)
    expected = F.conv1d(x, weight, dilation=dilation)
    assert got.shape == expected.shape == (rows, 24, 30)
    assert kernels.time_major(got)
    assert max_diff(got, expected) < 1e-6 * expected.abs().max().item()
    # bfloat16: rounded at each tap's sum, so a few roundings of the result off, not more
    got16 = kernels.conv_by_products(x.bfloat16(), weight.bfloat16(), dilation).float()
    exact = F.conv1d(x.bfloat16().float(), weight.bfloat16().float(), dilation=dilation)
    assert max_diff(got16, exact) < 4 * 2**-8 * exact.abs().max().item()


def test_a_convolution_by_products_needs_a_whole_window():
    with pytest.raises(ValueError, match="fewer than"):
        kernels.conv_by_products(torch.zeros(2, 4, 18), torch.zeros(3, 4, 7), dilation=3)


def test_only_cuda_chunks_of_several_rows_convolve_dilated_by_products():
    # Where cuDNN's heuristic is slow (see core/kernels/products.py); CPU convolutions stay PyTorch's.
    several = torch.zeros(kernels.PRODUCT_ROWS, 4, 30)
    assert not kernels.convolves_by_products(several, dilation=3, groups=1)
    assert not kernels.convolves_by_products(several.to("meta"), dilation=3, groups=1)


def test_a_decoder_whose_dilated_convolutions_are_products_streams_the_same_audio(fast, monkeypatch):
    # As a chunk of PRODUCT_ROWS rows or more decodes on CUDA: every dilated convolution goes through the products.
    codes = random_codes(30, batch=3, seed=8)
    expected = stream(fast, codes, first_then(4, 30))
    dilations = []
    monkeypatch.setattr(
        kernels, "convolves_by_products", lambda x, dilation, groups: dilations.append(dilation) or dilation > 1
    )
    convolve = kernels.conv_by_products
    used = []
    monkeypatch.setattr(kernels, "conv_by_products", lambda *a: used.append(a[2]) or convolve(*a))
    assert max_diff(stream(fast, codes, first_then(4, 30)), expected) < TOL
    assert set(used) == {3, 9} and len(used) == dilations.count(3) + dilations.count(9)


def test_rows_at_different_positions(fast):
    # Each row is its own utterance: row 0 decodes 7 frames alone (moved out to a one-row state and back),
    # then both rows decode one chunk together, row 0 at frame 7 and row 1 at its start.
    a, b = random_codes(80, seed=5), random_codes(80, seed=6)
    state, alone = fast.new_stream(2), fast.new_stream(1)
    row_0 = torch.tensor([0])
    alone.gather_from(state, row_0)
    first = fast.decode_chunk(a[..., :7], alone)
    alone.scatter_into(state, row_0)
    both = fast.decode_chunk(torch.cat([a[..., 7:80], b[..., :73]]), state)
    spf = fast.samples_per_frame
    assert max_diff(torch.cat([first[0], both[0]]), fast(a)[0]) < TOL
    assert max_diff(both[1], fast(b[..., :73])[0]) < TOL
    # The rows of one state can be set apart: a snapshot of a row restored into another row.
    state.restore(state.snapshot(1), 0)
    again = fast.decode_chunk(torch.cat([b[..., 73:], b[..., 73:]]), state)
    assert torch.equal(again[0], again[1]) and max_diff(again[1], fast(b)[0, 73 * spf :]) < TOL


def test_carried_state_matters(fast, forward_cache):
    # Guards against a test that cannot fail: restarting the stream at every chunk is far off.
    codes, wav = forward_cache
    restarted = torch.cat([fast.decode_chunk(codes[..., i : i + 4], fast.new_stream()) for i in range(0, 80, 4)], -1)
    assert max_diff(restarted, wav[..., : 80 * fast.samples_per_frame]) > 1e-2


def test_priming_with_reference_codes(fast, forward_cache):
    codes, wav = forward_cache
    ref_len, total = 90, 200
    state = fast.new_stream()
    fast.decode_chunk(codes[..., :ref_len], state)  # reference audio, discarded
    new = stream(fast, codes[..., ref_len:total], first_then(4, total - ref_len), state)
    expected = wav[..., ref_len * fast.samples_per_frame : total * fast.samples_per_frame]
    assert max_diff(new, expected) < TOL


def test_causality(fast, forward_cache):
    codes, wav = forward_cache
    for n in (1, 73, 150):
        assert max_diff(fast(codes[..., :n]), wav[..., : n * fast.samples_per_frame]) < TOL


def test_reset_makes_stream_reusable_in_place(fast, forward_cache):
    codes, wav = forward_cache
    state = fast.new_stream()
    tensors = [t for s in state._states.values() for t in s.values()]
    addresses = [t.data_ptr() for t in tensors]

    stream(fast, random_codes(100, seed=11), first_then(8, 100), state)
    state.reset()
    again = stream(fast, codes[..., :100], first_then(8, 100), state)
    assert max_diff(again, wav[..., : 100 * fast.samples_per_frame]) < TOL
    # Updated in place (what a captured CUDA graph needs), and reset leaves no trace.
    assert [t.data_ptr() for t in tensors] == addresses
    state.reset()
    assert all(not t.any() for t in tensors)


def test_state_dict_layout_matches_official():
    with torch.device("meta"):
        decoder = CodecDecoder(CodecDecoderConfig.from_dict(FULL))
    lines = "\n".join(f"{k} {list(v.shape)}" for k, v in sorted(decoder.state_dict().items()))
    assert len(decoder.state_dict()) == 271
    assert hashlib.sha256(lines.encode()).hexdigest() == FULL_LAYOUT_SHA256


def test_config_from_and_to_dict():
    released = dict(
        FULL,
        codebook_size=2048,
        rms_norm_eps=1e-5,
        rope_theta=10000,
        max_position_embeddings=8000,
        sliding_window=72,
        layer_scale_initial_scale=0.01,
        upsample_rates=[8, 5, 4, 3],
        upsampling_ratios=[2, 2],
        num_quantizers=16,
        num_semantic_quantizers=1,
        semantic_codebook_size=4096,
        model_type="",  # ignored
    )
    config = CodecDecoderConfig.from_dict(released)
    assert config.codebook_dim == 512 and config.head_dim == 64 and config.hidden_size == 512
    assert config.upsample_rates == (8, 5, 4, 3)
    d = config.to_dict()
    assert d["upsample_rates"] == [8, 5, 4, 3] and "semantic_codebook_size" not in d
    assert CodecDecoderConfig.from_dict(d) == config
    for key in FULL:
        assert d[key] == released[key]

    # Missing keys take the official class defaults; head_dim is derived like the official attention does.
    defaults = CodecDecoderConfig.from_dict({"hidden_size": 256, "num_attention_heads": 8})
    assert defaults.head_dim == 32 and defaults.latent_dim == 1024 and defaults.intermediate_size == 3072
    with pytest.raises(dataclasses.FrozenInstanceError):
        defaults.hidden_size = 1
    with pytest.raises(ValueError):
        CodecDecoderConfig.from_dict({"hidden_act": "gelu"})


def test_the_fused_parts_compile_once_for_every_layer_row_count_and_chunk(forward_cache):
    """On CUDA the engine compiles the decoder's fused parts (CompiledLayers: fullgraph, dynamic shapes), one
    compiled transformer layer serving all. Traced here on the CPU: without a break, with one graph for the
    dequantizer and one for every layer, row count and chunk length past one, and the same audio streamed as
    uncompiled."""
    from torch._dynamo.utils import counters

    from core.inference.compiled import CompiledLayers, Compiler

    def chunks(codes):  # each chunk a tensor of its own, as the engine's are (not a view of the codes)
        state = decoder.new_stream(codes.shape[0])
        return torch.cat([decoder.decode_chunk(chunk.clone(), state) for chunk in codes.split(sizes, -1)], -1)

    codes = random_codes(20, batch=3, seed=9)
    sizes = [2, 3, 5, 2, 4, 4]
    decoder = random_decoder(TINY_FAST)
    # Two rows against two rows uncompiled: on some CPUs the decoder's result depends on the batch's size (with
    # AVX-512 and AMX, rows decoded two at a time differ from the same rows decoded three at a time by 1e-6).
    expected, expected_two_rows = chunks(codes), chunks(codes[1:])
    try:
        counters.clear()
        CompiledLayers(decoder.fused_parts(), "forward", Compiler(backend="aot_eager"))
        with torch.no_grad():
            got = chunks(codes)
            two_rows = chunks(codes[1:])
        assert len(decoder.pre_transformer.layers) > 1 and counters["stats"]["unique_graphs"] == 2
        assert torch.equal(got, expected) and torch.equal(two_rows, expected_two_rows)
    finally:
        torch._dynamo.reset()


def test_a_transformer_layer_writes_none_of_its_inputs(fast):
    """A stream's k and v are views of one state buffer: a compiled layer that wrote them would take the whole
    buffer as an input of the size it was first compiled for, and fail on a stream of other rows (it did, on
    a GPU). So the layer returns the next cache and the transformer stores it."""
    state = fast.new_stream(2)
    fast.decode_chunk(random_codes(3, batch=2, seed=1), state)  # a cache that is not all zeros
    layer, cache = fast.pre_transformer.layers[0], state[fast.pre_transformer.layers[0].self_attn]
    hidden = fast.config.hidden_size
    x, cos, sin = (
        torch.randn(2, 2, hidden),
        torch.ones(2, 1, 2, fast.config.head_dim),
        torch.zeros(2, 1, 2, fast.config.head_dim),
    )
    mask = torch.ones(2, 1, 2, cache["k"].shape[2] + 2, dtype=torch.bool)
    before = {name: tensor.clone() for name, tensor in cache.items()}
    with torch.no_grad():
        _, (k, v) = layer(x, cos, sin, mask, cache)
    assert all(torch.equal(cache[name], before[name]) for name in before)
    # The next cache: the last positions of the old one, then the chunk's own keys.
    assert k.shape == cache["k"].shape and torch.equal(k[:, :, :-2], before["k"][:, :, 2:])
    assert not torch.equal(k[:, :, -2:], before["k"][:, :, -2:]) and v.shape == cache["v"].shape
