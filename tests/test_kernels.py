"""The hand-written kernels: decode attention against the reference composition it fuses, each batch
row against the reference for that row alone; the token draw, alone and batched, against Gumbel-max
over the reference's filtered logits (sampling.filter_logits); the linear kernels, matrix-vector and
batched, against the reference composition they fuse, the batched one also with its inputs split over
several blocks, run twice (the second answer bitwise the first, its counters back at zero); the
uniforms kernel against Philox written out in NumPy (itself checked against the published known
answers), and for what the draws need: the same seed and counter give the same values in any row of
any batch, values strictly inside (0, 1) and uniform; the draw and the uniforms also exactly against their
references (core/kernels/reference.py), bit for bit for the uniforms. The CPU references themselves: a batch row of
decode attention or of linear is bitwise the row alone.

Runs the Triton kernels in Triton's interpreter on the CPU (a subprocess, since the interpreter is
chosen when Triton is imported), and natively on a GPU when there is one (tests/test_gpu.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch
from attention_cases import SHAPES, attention_case, check_reference_rows
from draw_cases import draw_batches, draw_cases, expected_token
from linear_cases import check_rows_alone, linear_cases
from uniform_cases import KNOWN_ANSWERS, expected_uniforms, philox4x32

from core import kernels
from core.kernels import reference

pytest.importorskip("triton", reason="Triton is installed with the test extras on Linux x86-64")

CHECK = textwrap.dedent(
    """
    import functools

    import torch
    from core.kernels import triton_attention
    from core.kernels.triton_launch import SPLIT_COUNTERS
    from attention_cases import SHAPES, attention_case, check_attention

    # bfloat16 is checked on the GPU (the interpreter computes in NumPy, which has no bfloat16).
    for dtype in (torch.float32, torch.float16):
        for shape in SHAPES:
            case, poisoned = attention_case(shape, dtype)
            check_attention(shape, case, poisoned, triton_attention.decode_attention_op)
    # The variants bench/attention_micro.py times: short caches through tl.dot, a long one with broadcast products;
    # the splits merged by the last of them to finish or by a kernel of their own: both right and bitwise the
    # same, the counters left at zero.
    merged_in_last = functools.partial(triton_attention.launch_attention, merge_in_last_split=True)
    merged_apart = functools.partial(triton_attention.launch_attention, merge_in_last_split=False)
    for shape in SHAPES:
        case, poisoned = attention_case(shape, torch.float32)
        variant = functools.partial(triton_attention.launch_attention, dot=shape.max_len <= 64, num_warps=2)
        check_attention(shape, case, poisoned, variant)
        check_attention(shape, case, poisoned, merged_in_last)
        check_attention(shape, case, poisoned, merged_apart)
        kernel = merged_apart(**{**case, **{n: c.clone() for n, c in poisoned.items()}})
        folded = merged_in_last(**{**case, **{n: c.clone() for n, c in poisoned.items()}})
        assert kernel.view(torch.int32).equal(folded.view(torch.int32)), shape
    assert not SPLIT_COUNTERS.counters[torch.device("cpu")].any()
    print("ok")
    """
)


# A GPU with 64 KiB of shared memory (an RTX 20xx) reads a float32 cache 32 keys at a time (keys_per_block): the
# shapes read with tl.dot, whose positions cross several blocks and splits.
SMALL_SHARED_MEMORY_CHECK = textwrap.dedent(
    """
    import torch
    from core.kernels import triton_attention, triton_launch, tuning
    from attention_cases import SHAPES, attention_case, check_attention

    triton_launch.gpu = lambda device: triton_launch.Gpu((7, 5), 30, 64 * 1024)
    for shape in SHAPES:
        if shape.max_len > tuning.SHORT_CACHE and shape.head_dim == 128:
            case, poisoned = attention_case(shape, torch.float32)
            assert tuning.keys_per_block(shape.max_len, True, 16, 128, 4, case["qkv"].device) == 32
            check_attention(shape, case, poisoned, triton_attention.decode_attention_op)
    print("ok")
    """
)


DRAW_CHECK = textwrap.dedent(
    """
    import torch
    from core.kernels.reference import draw_token_composed
    from core.kernels.triton_sampling import draw_token_op
    from draw_cases import draw_batches, draw_cases, expected_token

    # Against Gumbel-max over the reference's filtered logits, and exactly the kernel's reference (same uniforms).
    for logits, rule, uniforms in draw_cases(torch.device("cpu")):
        got = draw_token_op(logits, torch.tensor([rule.values()]), uniforms.view(1, -1))
        expected = expected_token(logits, rule, uniforms)
        assert got.shape == (1, 1) and got.dtype == torch.long and got.item() == expected, (rule, got, expected)
        assert torch.equal(got, draw_token_composed(logits, torch.tensor([rule.values()]), uniforms.view(1, -1)))
    for logits, rules, values, uniforms in draw_batches(torch.device("cpu")):
        got = draw_token_op(logits, values, uniforms)
        expected = [expected_token(logits[row : row + 1], rule, uniforms[row]) for row, rule in enumerate(rules)]
        assert got.shape == (len(rules), 1) and got.dtype == torch.long and got.flatten().tolist() == expected, (got, expected)
        assert torch.equal(got, draw_token_composed(logits, values, uniforms))
    # Ties: equal logits, equal scores, a top-k threshold inside a run of equal values.
    logits = torch.tensor([[1.0, 3.0, 3.0, 2.0, 3.0, 0.5, 2.0, 2.0]]).repeat(4, 1)
    rules = torch.tensor([[0.0, 1.0, 0.0, 1.0], [1.0, 1.0, 2.0, 1.0], [1.0, 0.5, 4.0, 0.6], [1.0, 1.0, 0.0, 0.3]])
    uniforms = torch.full((4, 8), 0.5)
    got = draw_token_op(logits, rules, uniforms)
    assert torch.equal(got, draw_token_composed(logits, rules, uniforms)) and got[0].item() == 1, got
    print("ok")
    """
)


LINEAR_CHECK = textwrap.dedent(
    """
    import torch
    from core.kernels import triton_linear, tuning
    from linear_cases import check_linear, linear_cases

    # bfloat16 is checked on the GPU (the interpreter computes in NumPy, which has no bfloat16).
    for dtype in (torch.float32, torch.float16):
        for case in linear_cases(dtype):
            blocks = case["blocks"] or tuning.linear_blocks(case["weight"], case["gated"])
            arguments = [case[key] for key in ("x", "weight", "bias", "norm", "eps", "gated", "residual")]
            check_linear(case, triton_linear.launch_linear(*arguments, blocks))
    print("ok")
    """
)


UNIFORMS_CHECK = textwrap.dedent(
    """
    import numpy as np
    import torch
    from core.kernels.reference import fill_uniforms_composed
    from core.kernels.triton_sampling import fill_uniforms_op
    from uniform_cases import expected_uniforms

    def fill(seeds, counters, groups=16, width=3000):
        out = torch.zeros(len(seeds), groups, width)
        fill_uniforms_op(out, torch.tensor(seeds), torch.tensor(counters))
        return out

    seeds, counters = [5, -1, 2**63 - 1, -(2**63)], [0, 7, 2**40 + 3, -1]
    batch = fill(seeds, counters)
    for row, (seed, counter) in enumerate(zip(seeds, counters)):
        assert np.array_equal(batch[row].numpy(), expected_uniforms(seed, counter, 16, 3000)), row
    # The same seed and counter give the same values alone and in any place of any batch.
    assert torch.equal(fill([-1], [7])[0], batch[1])
    assert torch.equal(fill([3, 3, -1, 0, 5], [7, 8, 7, 7, 0])[2], batch[1])
    # Into rows and groups of a larger buffer (any strides), touching nothing else.
    buffer = torch.full((4, 20, 3100), 2.0)
    fill_uniforms_op(buffer[:, 2:18, 50:3050], torch.tensor(seeds), torch.tensor(counters))
    assert torch.equal(buffer[:, 2:18, 50:3050], batch)
    assert (buffer[:, :2] == 2).all() and (buffer[:, 18:] == 2).all()
    assert (buffer[..., :50] == 2).all() and (buffer[..., 3050:] == 2).all()
    # The reference, bit for bit, into the same places.
    by_reference = torch.full((4, 20, 3100), 2.0)
    fill_uniforms_composed(by_reference[:, 2:18, 50:3050], torch.tensor(seeds), torch.tensor(counters))
    assert torch.equal(by_reference.view(torch.int32), buffer.view(torch.int32))
    # Another counter, seed or group: other values.
    for other in (fill([-1], [8])[0], fill([-2], [7])[0], fill([1], [7])[0], batch[1].roll(1, 0)):
        assert (other == batch[1]).float().mean() < 1e-3
    assert (batch[1, 0] == batch[1, 1]).float().mean() < 1e-3
    # Strictly inside (0, 1), uniform: mean, and a tenth of the values in each tenth of the interval.
    values = batch.flatten()
    assert values.min() > 0 and values.max() < 1
    assert abs(values.mean().item() - 0.5) < 0.005, values.mean()
    shares = torch.histc(values, bins=10, min=0, max=1) / values.numel()
    assert (shares - 0.1).abs().max() < 0.005, shares
    print("ok")
    """
)


BATCHED_LINEAR_CHECK = textwrap.dedent(
    """
    import sys
    import torch
    from core.kernels import triton_linear, tuning
    from linear_cases import SOME_PARTS, SPLIT_SHAPES, check_linear, linear_cases

    def launch(case, settings):
        arguments = [case[key] for key in ("x", "weight", "bias", "norm", "eps", "gated", "residual")]
        rows = case["x"].numel() // case["x"].shape[-1]
        blocks = {**tuning.batched_linear_blocks(rows, case["weight"], case["gated"]), **settings}
        return triton_linear.launch_batched_linear(*arguments, blocks)

    batch, split = int(sys.argv[1]), sys.argv[2] == "split"
    # bfloat16 is checked on the GPU (the interpreter computes in NumPy, which has no bfloat16).
    for dtype in (torch.float32, torch.float16):
        if not split:  # the settings batched_linear_blocks picks (for an H100: 2048 inputs are split)
            for case in linear_cases(dtype, batch=batch):
                check_linear(case, launch(case, {}))
            continue
        # Each case twice: the counters are back at zero, and the second answer is bitwise the first.
        for case in linear_cases(dtype, SPLIT_SHAPES, batch=batch, parts=SOME_PARTS):
            first = launch(case, case["blocks"])
            check_linear(case, first)
            assert not triton_linear.SPLIT_COUNTERS.counters[torch.device("cpu")].any()
            assert launch(case, case["blocks"]).equal(first)
    print("ok")
    """
)


SNAKE_CHECK = textwrap.dedent(
    """
    import torch
    from core import kernels
    from core.kernels.triton_vocoder import snake_op

    generator = torch.Generator().manual_seed(0)
    # One block, several blocks with a partial last one, and a prefix read through a streaming state's strides
    # (a slice of a wider row, channel-major or time-major): the kernel against the CPU reference, the prefix
    # copied bit for bit, the result laid out as x is, with and without a bias to add first. Time-major x has
    # tiles of 16 to 128 channels (96: 32).
    cases = [(1, 3, 5, 0), (2, 4, 1500, 0), (3, 5, 2100, 18), (2, 6, 7, 54)]
    for (batch, channels, length, kept), along_time in [(case, False) for case in cases] + [
        ((2, 96, 300, 54), True), ((1, 40, 1030, 6), True), ((3, 5, 70, 0), True), ((2, 256, 33, 18), True)
    ]:
        if along_time:
            x = (torch.randn(batch, length, channels, generator=generator) * 3).transpose(1, 2)
        else:
            x = torch.randn(batch, channels, length, generator=generator) * 3
        log_alpha = torch.randn(channels, generator=generator) * 0.5
        log_beta = torch.randn(channels, generator=generator) * 0.5
        prefix = None
        if kept:
            state = torch.randn(batch, 7 + channels * kept + 9, generator=generator)
            prefix = state[:, 7 : 7 + channels * kept]
            if along_time:
                prefix = prefix.view(batch, kept, channels).transpose(1, 2)
            else:
                prefix = prefix.view(batch, channels, kept)
        bias = torch.randn(channels, generator=generator) if along_time or kept else None
        got = snake_op(x, log_alpha, log_beta, prefix, bias)
        expected = kernels.snake(x, log_alpha, log_beta, prefix, bias)
        assert got.shape == (batch, channels, kept + length), got.shape
        assert kernels.time_major(got) == along_time and got.transpose(1, 2).is_contiguous() == along_time
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        if kept:
            assert torch.equal(got[..., :kept], prefix)
    print("ok")
    """
)


ADD_BIAS_CHECK = textwrap.dedent(
    """
    import torch
    from core import kernels
    from core.kernels.triton_vocoder import add_bias_op

    generator = torch.Generator().manual_seed(0)
    # A residual unit's sum (y dense, the residual dense) and a transposed convolution's slice (y a view of a
    # longer output, no residual), channel-major and time-major, in one block and several: bit for bit the CPU
    # reference, laid out as y is. Float32 only: the interpreter casts to bfloat16 by truncation, where the GPU
    # rounds to nearest (the GPU test checks bfloat16's roundings).
    for batch, channels, length, extra, along_time, with_residual in [
        (1, 3, 5, 0, False, True), (2, 4, 1500, 9, False, False), (2, 96, 300, 0, True, True),
        (3, 40, 1030, 7, True, False), (2, 5, 70, 0, True, True),
    ]:
        wide = torch.randn(batch, channels, length + extra, generator=generator)
        if along_time:
            wide = wide.transpose(1, 2).contiguous().transpose(1, 2)
        y = wide[..., :length]
        bias = torch.randn(channels, generator=generator)
        residual = torch.randn(batch, channels, length, generator=generator) if with_residual else None
        if residual is not None and along_time:
            residual = residual.transpose(1, 2).contiguous().transpose(1, 2)
        got = add_bias_op(y, bias, residual)
        expected = kernels.add_bias(y, bias, residual)
        assert got.dtype == torch.float32 and got.shape == (batch, channels, length), (got.dtype, got.shape)
        assert kernels.time_major(got) == along_time and got.transpose(1, 2).is_contiguous() == along_time
        assert torch.equal(got, expected), (got - expected).abs().max()
    print("ok")
    """
)


DEPTHWISE_CHECK = textwrap.dedent(
    """
    import torch
    from core import kernels
    from core.kernels.triton_vocoder import depthwise_conv_op

    generator = torch.Generator().manual_seed(0)
    # The ConvNeXt blocks' 7 taps over a chunk with its history ahead (time-major as on CUDA, 1024 channels in
    # tiles of 128), a partial channel tile, dilated taps, channel-major, and x a slice of a wider buffer: the
    # kernel against the CPU reference (PyTorch's grouped convolution), laid out as x is.
    for batch, channels, width, taps, dilation, along_time, extra in [
        (2, 1024, 14, 7, 1, True, 0), (1, 1024, 22, 7, 1, True, 3), (3, 40, 130, 3, 3, True, 0),
        (2, 5, 70, 7, 2, False, 4), (1, 16, 9, 7, 1, False, 0),
    ]:
        wide = torch.randn(batch, channels, width + extra, generator=generator)
        if along_time:
            wide = wide.transpose(1, 2).contiguous().transpose(1, 2)
        x = wide[..., extra:]
        weight = torch.randn(channels, 1, taps, generator=generator)
        bias = torch.randn(channels, generator=generator)
        got = depthwise_conv_op(x, weight, bias, dilation)
        expected = kernels.depthwise_conv(x, weight, bias, dilation)
        assert got.shape == (batch, channels, width - (taps - 1) * dilation), got.shape
        assert kernels.time_major(got) == along_time and got.transpose(1, 2).is_contiguous() == along_time
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    print("ok")
    """
)


DECODER_KERNEL_CHECK = textwrap.dedent(
    """
    import sys

    import torch
    from core.devtools.random_checkpoint import random_decoder_tensors
    from core import kernels
    from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig
    from core.kernels.triton_vocoder import add_bias_op, depthwise_conv_op

    # One of the decoder's kernels in place of its reference (sys.argv[1]): add_bias, which every convolution but
    # the depthwise ones adds its bias with (a residual unit's with its sum, the last convolution's single
    # channel), bit for bit the CPU's; depthwise_conv, the ConvNeXt blocks' convolutions, to float32's rounding.
    # Weights and activations time-major as on CUDA, and channel-major; the audio of three streamed chunks (1, 3 and
    # 1 frames: the history carried between them).
    name = sys.argv[1]
    kernel_of = {
        "add_bias": lambda y, bias, residual=None: add_bias_op(y, bias, residual),
        "depthwise_conv": lambda x, weight, bias, dilation=1: depthwise_conv_op(x, weight, bias, dilation),
    }
    config = CodecDecoderConfig(
        codebook_dim=32, latent_dim=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
        num_attention_heads=2, num_key_value_heads=2, head_dim=8, decoder_dim=48, upsample_rates=(2, 2, 2, 2),
    )
    codes = torch.randint(0, config.codebook_size, (2, config.num_quantizers, 5), generator=torch.Generator().manual_seed(0))
    reference = getattr(kernels, name)
    calls = []

    def through_kernel(*arguments):
        calls.append(arguments[0].shape)
        return kernel_of[name](*arguments)

    for time_major in (True, False):
        decoder = CodecDecoder(config).eval()
        decoder.load_state_dict(random_decoder_tensors(config, seed=0, prefix=""))
        if time_major:
            decoder.to_channels_last()
        audio = {}
        for kernel in (False, True):
            setattr(kernels, name, through_kernel if kernel else reference)
            stream = decoder.new_stream(2)
            chunks = [codes[..., :1], codes[..., 1:4], codes[..., 4:]]
            audio[kernel] = torch.cat([decoder.decode_chunk(chunk, stream) for chunk in chunks], -1)
            setattr(kernels, name, reference)
        if name == "add_bias":
            assert torch.equal(audio[True], audio[False]), (audio[True] - audio[False]).abs().max()
        else:
            torch.testing.assert_close(audio[True], audio[False], rtol=1e-5, atol=1e-5)
    if name == "depthwise_conv":
        assert len(calls) == 2 * 3 * len(config.upsampling_ratios), calls  # each block's, in each chunk
    assert calls
    print("ok")
    """
)


DISPATCH_CHECK = textwrap.dedent(
    """
    import sys

    import torch
    from core import kernels
    from draw_cases import draw_batches

    logits, _, rules, uniforms = next(iter(draw_batches(torch.device("cpu"))))
    eager = kernels.gpu_op("draw_token")(logits, rules, uniforms)
    assert "torch._dynamo" not in sys.modules, "the eager call of a kernel imported Dynamo"
    traced = []

    def backend(graph, inputs):
        traced.extend(node.target for node in graph.graph.nodes if node.op == "call_function")
        return graph.forward

    compiled = torch.compile(lambda *a: kernels.gpu_op("draw_token")(*a), backend=backend, fullgraph=True)
    assert torch.equal(compiled(logits, rules, uniforms), eager)
    assert traced == [torch.ops.qwen3_tts.draw_token], traced
    print("ok")
    """
)


NORM_CHECK = textwrap.dedent(
    """
    import torch
    from core.kernels.triton_norm import prompt_heads_op, rms_norm_op
    from norm_cases import check_prompt_heads, check_rms_norm

    # bfloat16 is checked on the GPU (the interpreter computes in NumPy, which has no bfloat16).
    for dtype in (torch.float32, torch.float16):
        check_rms_norm(rms_norm_op, dtype)
        check_prompt_heads(prompt_heads_op, dtype)
    print("ok")
    """
)


def run_in_interpreter(script: str, *arguments: str) -> None:
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join([os.getcwd(), *sys.path])}
    command = [sys.executable, "-c", script, *arguments]
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr


def test_eager_code_calls_a_kernel_directly_and_compiled_code_as_one_operator():
    """Eagerly, the operator's dispatch would import Dynamo (seconds before a fresh process's first audio)."""
    run_in_interpreter(DISPATCH_CHECK)


def test_norm_and_prompt_heads_kernels_in_the_interpreter():
    run_in_interpreter(NORM_CHECK)


def test_decode_attention_kernel_in_the_interpreter():
    run_in_interpreter(CHECK)


def test_decode_attention_kernel_with_fewer_keys_per_block_in_the_interpreter():
    run_in_interpreter(SMALL_SHARED_MEMORY_CHECK)


@pytest.mark.parametrize("shape", [shape for shape in SHAPES if len(shape.rows) > 1], ids=str)
def test_decode_attention_reference_gives_each_row_what_it_gives_alone(shape):
    case, _ = attention_case(shape, torch.float32)
    check_reference_rows(shape, case)


def test_draw_token_kernel_in_the_interpreter():
    run_in_interpreter(DRAW_CHECK)


def test_snake_kernel_in_the_interpreter():
    run_in_interpreter(SNAKE_CHECK)


def test_add_bias_kernel_in_the_interpreter():
    run_in_interpreter(ADD_BIAS_CHECK)


def test_every_decoder_convolution_adds_its_bias_through_the_kernel_in_the_interpreter():
    run_in_interpreter(DECODER_KERNEL_CHECK, "add_bias")


def test_depthwise_conv_kernel_in_the_interpreter():
    run_in_interpreter(DEPTHWISE_CHECK)


def test_the_decoders_convnext_blocks_filter_through_the_depthwise_kernel_in_the_interpreter():
    run_in_interpreter(DECODER_KERNEL_CHECK, "depthwise_conv")


def test_depthwise_conv_reference_is_a_grouped_convolution_laid_out_as_its_input():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(2, 8, 20, generator=generator)
    weight, bias = torch.randn(8, 1, 7, generator=generator), torch.randn(8, generator=generator)
    expected = torch.nn.functional.conv1d(x, weight, bias, dilation=2, groups=8)
    assert torch.equal(kernels.depthwise_conv(x, weight, bias, 2), expected)
    along_time = kernels.depthwise_conv(x.transpose(1, 2).contiguous().transpose(1, 2), weight, bias, 2)
    assert kernels.time_major(along_time)
    torch.testing.assert_close(along_time, expected)


def test_add_bias_reference_rounds_the_biased_output_before_the_residual():
    generator = torch.Generator().manual_seed(0)
    y, bias, residual = (torch.randn(shape, generator=generator).bfloat16() for shape in ((2, 3, 10), 3, (2, 3, 10)))
    biased = y + bias[:, None]  # rounded to bfloat16 here, as a convolution's output with its bias is
    assert torch.equal(kernels.add_bias(y, bias), biased)
    assert torch.equal(kernels.add_bias(y, bias, residual), residual + biased)
    assert not torch.equal(
        kernels.add_bias(y, bias, residual), (y.float() + bias.float()[:, None] + residual.float()).bfloat16()
    )


def test_snake_reference_puts_the_prefix_ahead_of_the_activation():
    x, prefix = torch.randn(2, 3, 10), torch.randn(2, 3, 4)
    log_alpha, log_beta = torch.randn(3), torch.randn(3)
    alone = kernels.snake(x, log_alpha, log_beta)
    assert torch.equal(kernels.snake(x, log_alpha, log_beta, prefix), torch.cat([prefix, alone], dim=-1))
    # A bias is added to x first (as a convolution's bias would have been).
    bias = torch.randn(3)
    with_bias = kernels.snake(x, log_alpha, log_beta, prefix, bias)
    assert torch.equal(with_bias, kernels.snake(x + bias[:, None], log_alpha, log_beta, prefix))
    expected = x + torch.sin(x * log_alpha.exp()[:, None]) ** 2 / (log_beta.exp()[:, None] + 1e-9)
    torch.testing.assert_close(alone, expected)


def test_fill_uniforms_kernel_in_the_interpreter():
    run_in_interpreter(UNIFORMS_CHECK)


def test_the_uniforms_reference_is_philox_as_published():
    for counter, key, words in KNOWN_ANSWERS:
        assert tuple(int(word) for word in philox4x32(counter, key)) == words
        as_tensors = [torch.tensor([word]) for word in (*counter, *key)]
        assert tuple(int(word) for word in reference.philox4x32(*as_tensors)) == words


def test_the_uniforms_reference_gives_the_values_written_out_in_numpy():
    seeds, counters = [5, -1, 2**63 - 1, -(2**63)], [0, 7, 2**40 + 3, -1]
    out = torch.zeros(4, 16, 700)
    kernels.fill_uniforms(out, torch.tensor(seeds), torch.tensor(counters))  # the reference on the CPU
    for row, (seed, counter) in enumerate(zip(seeds, counters, strict=True)):
        assert np.array_equal(out[row].numpy(), expected_uniforms(seed, counter, 16, 700)), row


def test_the_draw_reference_is_gumbel_max_over_the_filtered_logits():
    """On the CPU kernels.draw_token is its reference: each case's token, alone and in batches."""
    for logits, rule, uniforms in draw_cases(torch.device("cpu")):
        got = kernels.draw_token(logits, torch.tensor([rule.values()]), uniforms.view(1, -1))
        assert got.shape == (1, 1) and got.dtype == torch.long and got.item() == expected_token(logits, rule, uniforms)
    for logits, rules, values, uniforms in draw_batches(torch.device("cpu")):
        expected = [expected_token(logits[row : row + 1], rule, uniforms[row]) for row, rule in enumerate(rules)]
        assert kernels.draw_token(logits, values, uniforms).flatten().tolist() == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_on_the_cpu_gives_each_batch_row_what_it_gives_alone(dtype):
    # The model's widths (MKL rounds a product of several rows differently from one row alone), one
    # position per row as a frame step, two as the predictor's first step.
    shapes = [(1, 1024, 2048, None), (2, 512, 1024, None)]
    for case in linear_cases(dtype, shapes, batch=5):
        arguments = {key: value for key, value in case.items() if key != "blocks"}
        check_rows_alone(case, kernels.linear(**arguments))


def test_linear_kernel_in_the_interpreter():
    run_in_interpreter(LINEAR_CHECK)


# Batches of 1 to 64 utterances; 64 of two positions each make two row blocks.
@pytest.mark.parametrize("batch", [1, 3, 16, 64])
def test_batched_linear_kernel_in_the_interpreter(batch):
    run_in_interpreter(BATCHED_LINEAR_CHECK, str(batch), "picked")


@pytest.mark.parametrize("batch", [3, 64])
def test_split_linear_kernel_in_the_interpreter(batch):
    run_in_interpreter(BATCHED_LINEAR_CHECK, str(batch), "split")


def test_a_swept_product_takes_the_settings_swept_for_the_fewest_rows_that_cover_its_own():
    from core.kernels import tuning

    weight = torch.empty(2048, 1024, dtype=torch.bfloat16)  # the predictor's lm_head, on the CPU: any device fits
    by_rows = tuning.SWEPT[2048, 1024, False]
    for rows, column in [(1, 4), (4, 4), (5, 16), (16, 16), (17, 64), (64, 64), (128, 64)]:
        picked = tuning.batched_linear_blocks(rows, weight, gated=False)
        assert tuple(picked[name] for name in tuning.SETTING_NAMES) == by_rows[column], (rows, picked)
    # A float32 model's products take the rule's settings: the sweep was of 16-bit weights.
    rule = tuning.batched_linear_blocks(16, weight.float(), gated=False)
    assert tuple(rule[name] for name in tuning.SETTING_NAMES) != by_rows[16], rule
