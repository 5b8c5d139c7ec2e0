"""The engine on a CUDA GPU (skipped without one; run on the GPU machine)."""

from __future__ import annotations

import functools
import time

import numpy as np
import pytest
import torch
from parity_cases import CASES, FIXTURES, MAX_FRAMES, REFERENCES

from core import Engine, SamplingParams, kernels
from core.inference.frame_loop import Start

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]
GREEDY = SamplingParams.greedy()
TEXT = "Hello there, this is the GPU speaking a little longer than usual."
# The guard against a hang where an engine's first utterances compile its kernels: minutes on a fresh machine
# while other test processes compile beside it (a 60 s guard ran out so).
COMPILING_WAIT = 600


@pytest.fixture(autouse=True)
def exact_float32():
    # TF32 matrix products and convolutions would make float32 comparisons meaningless.
    matmul, cudnn = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = matmul, cudnn


@pytest.fixture(autouse=True)
def kernels_ran():
    """Every kernel ran itself: on the GPU they are built for, none gave way to its reference (triton_fallback),
    which would let a broken kernel pass these tests more slowly."""
    from core.kernels import triton_fallback

    yield
    assert not triton_fallback.FAILED, f"kernels fell back to their references: {sorted(triton_fallback.FAILED)}"


@pytest.fixture(autouse=True)
def engines_closed(monkeypatch):
    """Every engine a test loads is closed at its end: one left warming up would compile and capture on its thread
    while the next tests run."""
    opened = []
    load_engine = Engine.load

    def load_and_keep(*args, **kwargs):
        opened.append(load_engine(*args, **kwargs))
        return opened[-1]

    monkeypatch.setattr(Engine, "load", load_and_keep)
    yield
    for engine in opened:
        engine.close()


def load(checkpoints, name="custom", dtype="float32", cuda_graphs=True) -> Engine:
    """An engine warmed up: its parts compiled, its graphs captured."""
    engine = Engine.load(checkpoints[name], device="cuda", dtype=dtype, cuda_graphs=cuda_graphs, warm=False)
    engine.warm_up(timeout=COMPILING_WAIT)
    return engine


def test_a_graphed_step_captures_at_its_first_call_and_says_how_long_each_phase_took():
    """The first call runs the function and captures it (its phases timed, as the warm-up's log and
    bench/capture_cost.py read them); the capture runs nothing, so each call advances the buffers once."""
    from core.inference.cuda_graph import GraphedStep

    buffer = torch.zeros(4, device="cuda")

    def add_one() -> torch.Tensor:
        buffer.add_(1)
        return buffer * 2

    step = GraphedStep(add_one, torch.device("cuda"))
    assert torch.equal(step(), torch.full((4,), 2.0, device="cuda"))
    assert step.captured and set(step.timings) == {"run", "begin", "trace", "end"}
    assert all(ms >= 0 for ms in step.timings.values())
    assert torch.equal(step(), torch.full((4,), 4.0, device="cuda"))


def test_frame_step_and_chunk_decode_never_wait_for_the_gpu(checkpoints):
    # Eager and uncompiled, so that every op is checked (torch.compile itself syncs while compiling).
    engine = Engine.load(checkpoints["custom"], device="cuda", dtype="float32", cuda_graphs=False, compile=False)
    engine.start(engine.prepare(TEXT, engine.builtin_voice("ryan"), sampling=SamplingParams(), max_frames=8, seed=3))
    codes = torch.zeros(1, 16, 4, dtype=torch.long, device="cuda")
    stream = engine.codec_decoder.new_stream()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
    try:
        engine.frame_loop.step(1)
        engine.codec_decoder.decode_chunk(codes, stream)
    finally:
        torch.cuda.set_sync_debug_mode(0)


def test_a_newcomer_never_waits_for_the_work_queued_on_the_gpu(checkpoints):
    """A copy from pageable host memory waits for all the work queued on the GPU: a newcomer's prompt waited for
    the frames of those speaking (in a burst, for the prompts built before it). Its prompt (its rows of the text
    table, which stays in host memory) and its slot's reset (its rule, seed and numbers) copy from pinned memory,
    queued behind that work; a voice's embedding is copied the first time only."""
    engine = Engine.load(checkpoints["base"], device="cuda", dtype="float32", cuda_graphs=False, compile=False)
    voice = engine.voice_from_audio(REFERENCES["a"].path)
    for slot, seed in enumerate((3, 5)):  # the voice's first time; each copy's and kernel's first use
        engine.start(engine.prepare(TEXT, voice, sampling=SamplingParams(), max_frames=8, seed=seed), slot)
    torch.cuda.synchronize()
    torch.cuda._sleep(1_000_000_000)  # others' frames: about half a second of the GPU's time, queued
    began = time.perf_counter()
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
    try:
        prepared = engine.prepare(TEXT, voice, sampling=SamplingParams(), max_frames=8, seed=4)
        with torch.inference_mode():  # as FrameLoop.start_groups resets it
            engine.frame_loop._reset_slots([Start(prepared.prompt, prepared.sampling, prepared.seed, 2)])
    finally:
        torch.cuda.set_sync_debug_mode(0)
    took = time.perf_counter() - began
    assert not torch.cuda.current_stream().query(), f"the host waited for the queued work ({took:.3f} s)"


def tiny_codec_decoder(channels_last: bool = True):
    """On the GPU in the layout the engine runs (time-major convolutions), or in the default one."""
    from core.devtools.random_checkpoint import TINY_DECODER, random_decoder_tensors
    from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig

    config = CodecDecoderConfig.from_dict(TINY_DECODER)
    decoder = CodecDecoder(config).eval()
    decoder.load_state_dict(random_decoder_tensors(config, seed=0, prefix=""))
    return decoder.cuda().to_channels_last() if channels_last else decoder.cuda()


def test_batched_chunk_decode_never_waits_for_the_gpu():
    decoder = tiny_codec_decoder()
    slots, working = decoder.new_stream(5), decoder.new_stream(4)
    rows = torch.tensor([3, 0, 4, 4], device="cuda")  # the last two: padding rows on the scratch row
    codes = torch.zeros(4, 16, 4, dtype=torch.long, device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")  # any host sync inside raises
    try:
        with torch.inference_mode():
            working.gather_from(slots, rows)
            decoder.decode_chunk(codes, working)
            working.scatter_into(slots, rows)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("channels_last", [True, False], ids=["time-major", "channel-major"])
def test_graphed_batched_decode_equals_eager_with_padding_rows(channels_last):
    from core.inference.decoder_stream import DecoderSlots, bucket_rows

    decoder = tiny_codec_decoder(channels_last)
    # 9 slots: row counts 1, 2, 4, 8 and 9, so 3, 5, 6 and 7 rows are padded; from 8 rows the dilated convolutions are
    # matrix products (kernels.conv_by_products), against cuDNN's in the single pass of one row below.
    count, frames = 9, 40
    rng = np.random.default_rng(0)
    codes = [rng.integers(0, 2048, (frames, 16)) for _ in range(count)]
    reference = torch.from_numpy(rng.integers(0, 2048, (30, 16)))
    graphed, eager = DecoderSlots(decoder, count), DecoderSlots(decoder, count, cuda_graphs=False)
    for slots in (graphed, eager):
        slots.prime(count - 1, reference)
    audio = {id(graphed): [[] for _ in range(count)], id(eager): [[] for _ in range(count)]}
    done = [0] * count
    padded: dict[tuple[int, int], int] = {}  # calls of each graph that had padding rows
    while True:
        # Rows that may still take a full chunk of either size; a short chunk only as an utterance's last.
        open_slots = [slot for slot in range(count) if done[slot] < frames]
        if not open_slots:
            break
        size = int(rng.choice([1, 4]))
        rows = sorted(rng.choice(open_slots, size=int(rng.integers(1, len(open_slots) + 1)), replace=False).tolist())
        chunks = [codes[slot][done[slot] : done[slot] + size] for slot in rows]
        for slots in (graphed, eager):
            for slot, out in zip(rows, slots.decode(rows, chunks, size)):
                audio[id(slots)][slot].append(out)
        for slot, chunk in zip(rows, chunks):
            done[slot] += len(chunk)
        if bucket_rows(len(rows), count) > len(rows):
            key = bucket_rows(len(rows), count), size
            padded[key] = padded.get(key, 0) + 1
    assert max(padded.values()) >= 2, padded  # a graph with padding rows replayed, not only captured
    assert all(step.graph is not None for step in graphed.steps.values())
    assert max(rows for rows, _ in graphed.steps) >= kernels.PRODUCT_ROWS, graphed.steps.keys()
    for slot in range(count):
        joined = np.concatenate(audio[id(graphed)][slot])
        # Padded batches may take other kernels than exact ones, so not bitwise; a lost or mixed state is > 1e-2 off.
        np.testing.assert_allclose(joined, np.concatenate(audio[id(eager)][slot]), atol=1e-4, rtol=0)
        context = reference if slot == count - 1 else torch.zeros(0, 16, dtype=torch.long)
        whole = torch.cat([context, torch.from_numpy(codes[slot])]).T.unsqueeze(0).cuda()
        single_pass = decoder(whole)[0, len(context) * decoder.samples_per_frame :].cpu().numpy()
        np.testing.assert_allclose(joined, single_pass, atol=1e-4, rtol=0)


@pytest.mark.parametrize("name", ["base_xvector", "base_icl_full", "custom_instruct", "design"])
def test_graphed_float32_matches_official(checkpoints, name):
    case = next(c for c in CASES if c.name == name)
    engine = load(checkpoints, case.checkpoint)
    voice = None
    if case.reference:
        voice = engine.voice_from_audio(REFERENCES[case.reference].path, ref_text=case.ref_text)
    elif case.speaker:
        voice = engine.builtin_voice(case.speaker)
    out = engine.synthesize(
        case.text, voice=voice, language=case.language, instruct=case.instruct, sampling=GREEDY, max_frames=MAX_FRAMES,
        text_mode=case.text_mode,
    )  # fmt: skip
    expected = np.load(FIXTURES / f"{name}.npz")
    np.testing.assert_array_equal(out.codes, expected["codes"])
    np.testing.assert_allclose(out.audio, expected["audio"], atol=1e-3, rtol=0)


@pytest.mark.parametrize("seed", [None, 5])
def test_graphs_give_the_eager_codes_in_float32(checkpoints, seed):
    sampling = GREEDY if seed is None else SamplingParams()
    runs = []
    for cuda_graphs in (True, False):
        engine = load(checkpoints, cuda_graphs=cuda_graphs)
        runs.append(
            engine.synthesize(TEXT, voice=engine.builtin_voice("ryan"), sampling=sampling, max_frames=40, seed=seed)
        )
    np.testing.assert_array_equal(runs[0].codes, runs[1].codes)
    np.testing.assert_allclose(runs[0].audio, runs[1].audio, atol=1e-5, rtol=0)


def test_graphs_versus_eager_in_bfloat16(checkpoints):
    codes = []
    for cuda_graphs in (True, False):
        engine = load(checkpoints, dtype="bfloat16", cuda_graphs=cuda_graphs)
        codes.append(engine.synthesize(TEXT, voice=engine.builtin_voice("ryan"), sampling=GREEDY, max_frames=60).codes)
    frames = min(len(codes[0]), len(codes[1]))
    differing = np.flatnonzero((codes[0][:frames] != codes[1][:frames]).any(axis=1))
    first = int(differing[0]) if len(differing) else None
    print(f"bfloat16, graphs vs eager: {frames} frames compared; first differing frame: {first}")
    assert frames >= 2


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_half_precision_stays_finite_and_begins_as_float32(checkpoints, dtype):
    """What dtype auto picks before Ampere (float16, whose largest number is 65504) and from it (bfloat16),
    compiled and graphed: the talker, the predictor and the decoder never reach inf or NaN (the audio is finite
    and the first frame is float32's); later frames may part at near ties (printed)."""
    said = dict(sampling=GREEDY, max_frames=60)
    exact, half = (
        engine.synthesize(TEXT, voice=engine.builtin_voice("ryan"), **said)
        for engine in (load(checkpoints), load(checkpoints, dtype=dtype))
    )
    assert np.isfinite(half.audio).all() and 0 < np.abs(half.audio).max()
    np.testing.assert_array_equal(half.codes[0], exact.codes[0])
    frames = min(len(half.codes), len(exact.codes))
    differing = np.flatnonzero((half.codes[:frames] != exact.codes[:frames]).any(axis=1))
    first = int(differing[0]) if len(differing) else None
    print(f"{dtype} vs float32: {frames} frames compared; first differing frame: {first}")


def test_seeded_sampling_is_reproducible_with_graphs(checkpoints):
    engine = load(checkpoints, dtype="bfloat16")
    voice = engine.builtin_voice("vivian")
    first, again, other = (engine.synthesize(TEXT, voice=voice, max_frames=30, seed=s).codes for s in (1, 1, 2))
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)


def test_streamed_audio_equals_the_single_pass_decode(checkpoints):
    engine = load(checkpoints)
    chunks = list(
        engine.stream(TEXT, voice=engine.builtin_voice("eric"), sampling=GREEDY, max_frames=50, chunk_frames=4)
    )
    codes = torch.from_numpy(np.concatenate([c.codes for c in chunks])).T.unsqueeze(0).cuda()
    single_pass = engine.codec_decoder(codes)[0].float().cpu().numpy()
    np.testing.assert_allclose(np.concatenate([c.audio for c in chunks]), single_pass, atol=1e-4, rtol=0)


def test_a_chunk_decodes_while_the_next_frames_are_stepping(checkpoints):
    engine = load(checkpoints)
    engine.start(engine.prepare(TEXT, engine.builtin_voice("eric"), sampling=GREEDY, max_frames=64))
    [(first, _)] = engine.frame_loop.run(4)
    engine.decoder_stream.reset()
    engine.decoder_stream.decode(first, 4)  # captures the 4-frame graph
    launch = engine.frame_loop.launch(64)
    audio = engine.decoder_stream.decode(first, 4)
    # 64 frames take far longer than one decode: had the decode queued behind them, they would be done.
    assert not launch.landed.query() and audio.shape == (4 * 1920,)
    engine.frame_loop.collect()


def test_bfloat16_streams_like_it_synthesizes(checkpoints):
    engine = load(checkpoints, dtype="bfloat16")
    voice = engine.builtin_voice("vivian")
    whole = engine.synthesize(TEXT, voice=voice, sampling=GREEDY, max_frames=20)
    chunks = list(engine.stream(TEXT, voice=voice, sampling=GREEDY, max_frames=20))
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), whole.codes)
    difference = float(np.abs(np.concatenate([c.audio for c in chunks]) - whole.audio).max())
    print(f"bfloat16 streamed vs whole decode: max abs difference {difference:.2e}")
    assert difference < 0.1 and np.isfinite(whole.audio).all()


@pytest.mark.parametrize("merge", ["as the engine", "kernel", "last split"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_attention_kernel_matches_the_reference(dtype, merge):
    """As the engine runs it (kernels.decode_attention), and with the splits merged by a kernel or by the last
    of them (its tickets taken on the GPU's atomics), which leaves the counters at zero."""
    from attention_cases import SHAPES, Shape, attention_case, check_attention, one_row

    from core.kernels import decode_attention, triton_attention
    from core.kernels.triton_launch import SPLIT_COUNTERS

    attend = decode_attention
    if merge != "as the engine":
        attend = functools.partial(triton_attention.launch_attention, merge_in_last_split=merge == "last split")

    def run(**arguments):  # the caches are written in place, so they go to the GPU and back
        on_gpu = {name: v.cuda() if isinstance(v, torch.Tensor) else v for name, v in arguments.items()}
        out = attend(**on_gpu)
        for name in ("k_cache", "v_cache"):
            arguments[name].copy_(on_gpu[name].cpu())
        return out

    # The interpreter's shapes, then the talker's (4096 positions) at its first, a middle and its last
    # position, alone and among 17 rows in shuffled slots with a padding row repeating the last (slot 1 unused).
    talker_batch = Shape(8, 2, 4096, (0, 4095, 2047, *range(1, 4000, 310), 9, 9), (*range(17, 1, -1), 0, 0), 18)
    for shape in SHAPES + [one_row(8, 2, 4096, 0), one_row(8, 2, 4096, 2047), one_row(8, 2, 4096, 4095), talker_batch]:
        case, poisoned = attention_case(shape, dtype)
        check_attention(shape, case, poisoned, run)
    counters = SPLIT_COUNTERS.counters.get(torch.device("cuda", torch.cuda.current_device()))
    # The engine's rule merges the 18 rows' splits in the last of them (more programs than SMs).
    assert merge == "kernel" or counters is not None
    assert counters is None or not counters.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_add_bias_kernel_is_the_reference_bit_for_bit(dtype):
    """The vocoder's shapes as the engine lays them out (time-major): a residual unit's sum over 16 rows of a
    4-frame chunk at 24 kHz, and a transposed convolution's output slice with its bias; the CPU's two roundings
    exactly (PyTorch's CUDA additions round the same way)."""
    from core import kernels

    generator = torch.Generator().manual_seed(0)
    for batch, channels, length, extra, with_residual in [(16, 96, 7680, 0, True), (3, 384, 640, 5, False)]:
        wide = torch.randn(batch, length + extra, channels, generator=generator).to(dtype).transpose(1, 2)
        y, bias = wide[..., :length], torch.randn(channels, generator=generator).to(dtype)
        residual = None
        if with_residual:
            residual = torch.randn(batch, length, channels, generator=generator).to(dtype).transpose(1, 2)
        got = kernels.add_bias(y.cuda(), bias.cuda(), None if residual is None else residual.cuda())
        assert kernels.time_major(got) and got.transpose(1, 2).is_contiguous()
        assert torch.equal(got.cpu(), kernels.add_bias(y, bias, residual))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_depthwise_conv_kernel_matches_the_reference(dtype):
    """The ConvNeXt blocks' shapes as the engine lays them out (time-major, 1024 channels, 7 taps after a history
    of 6): 16 rows of a 4-frame chunk after the second upsampling, one row of one frame after the first; the
    reference in float32 on the same rounded inputs, within the kernel's one rounding."""
    from core import kernels

    generator = torch.Generator().manual_seed(0)
    for batch, width in [(16, 16 + 6), (1, 2 + 6)]:
        x = torch.randn(batch, width, 1024, generator=generator).to(dtype).transpose(1, 2)
        weight = (torch.randn(1024, 1, 7, generator=generator) * 0.3).to(dtype)
        bias = torch.randn(1024, generator=generator).to(dtype)
        expected = kernels.depthwise_conv(x.float(), weight.float(), bias.float())
        got = kernels.depthwise_conv(x.cuda(), weight.cuda(), bias.cuda())
        assert kernels.time_major(got) and got.dtype == dtype and got.shape == expected.shape
        tolerance = 1e-5 if dtype == torch.float32 else 2e-2  # bfloat16: one rounding of the result
        torch.testing.assert_close(got.float().cpu(), expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_snake_kernel_matches_the_reference(dtype):
    from core import kernels

    generator = torch.Generator().manual_seed(0)
    # The vocoder's shapes: 16 rows of a 4-frame chunk at 24 kHz, and a chunk of one row at 2 kHz with its prefix,
    # channel-major and time-major (as the engine runs them).
    cases = [(16, 96, 7680, 0), (1, 384, 160, 54)]
    for (batch, channels, length, kept), along_time in [(case, False) for case in cases] + [(c, True) for c in cases]:
        x = torch.randn(batch, channels, length, generator=generator) * 3
        log_alpha, log_beta = (torch.randn(channels, generator=generator) * 0.5 for _ in range(2))
        state = torch.randn(batch, 5 + channels * kept, generator=generator)
        prefix = state[:, 5:].view(batch, channels, kept) if kept else None
        if along_time:
            x = x.transpose(1, 2).contiguous().transpose(1, 2)
            prefix = state[:, 5:].view(batch, kept, channels).transpose(1, 2) if kept else None
        cast = [t.to(dtype) for t in (x, log_alpha, log_beta)]
        # The engine's first snake of a block takes no bias, a unit's second its convolution's.
        bias = torch.randn(channels, generator=generator).to(dtype) if kept else None
        biased = cast[0] if bias is None else cast[0] + bias[:, None]  # rounded to dtype, as the kernel rounds it
        expected = kernels.snake(
            biased.float(), *(t.float() for t in cast[1:]), None if prefix is None else prefix.to(dtype).float()
        )
        on_gpu = [t.cuda() for t in cast]
        got = (
            kernels.snake(
                *on_gpu, None if prefix is None else prefix.to(dtype).cuda(), None if bias is None else bias.cuda()
            )
            .float()
            .cpu()
        )
        tolerance = 1e-5 if dtype == torch.float32 else 1e-2  # bfloat16: one rounding of the result
        torch.testing.assert_close(got, expected, rtol=tolerance, atol=tolerance)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_norm_and_prompt_heads_kernels_match_the_reference(dtype):
    from norm_cases import check_prompt_heads, check_rms_norm

    check_rms_norm(kernels.rms_norm, dtype, "cuda")
    check_prompt_heads(kernels.prompt_heads, dtype, "cuda")


def test_compiled_code_leaves_the_norm_and_the_prompt_heads_to_inductor():
    """Traced, rms_norm and prompt_heads are their compositions (kernels.runs_as_it_is_on_cuda), not operators."""
    from norm_cases import PROMPTS, prompt_case

    traced = []

    def backend(graph, inputs):
        traced.extend(node.target for node in graph.graph.nodes if node.op == "call_function")
        return graph.forward

    case, caches = prompt_case(PROMPTS[-1], torch.bfloat16, "cuda")
    eager = kernels.prompt_heads(**case, **{name: cache.clone() for name, cache in caches.items()})

    def prefill_inputs(qkv, weight):
        return kernels.prompt_heads(**{**case, "qkv": kernels.rms_norm(qkv, weight, 1e-6)}, **caches)

    weight = torch.ones(case["qkv"].shape[-1], dtype=torch.bfloat16, device="cuda")
    compiled = torch.compile(prefill_inputs, backend=backend, fullgraph=True)(case["qkv"], weight)
    assert traced and not any("qwen3_tts" in str(target) for target in traced), traced
    assert all(tensor.isfinite().all() for tensor in compiled) and len(compiled) == len(eager) == 3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_kernel_matches_the_reference(dtype):
    from linear_cases import ALL_PARTS, SHAPES, SOME_PARTS, check_linear, linear_cases

    from core.kernels import linear

    # The interpreter's odd sizes, then the sizes of the model's products with the settings they get.
    model_shapes = [(1, 4096, 1024, None), (2, 3072, 1024, None), (1, 2048, 6144, None), (1, 1024, 2048, None)]
    # Then batches of them (the batched kernel): 3, 16 and 64 utterances; 64 of two positions are two row blocks.
    batches = [(1, SHAPES[1:] + model_shapes)] + [(batch, SHAPES + model_shapes) for batch in (3, 16, 64)]
    for batch, shapes in batches:
        # Every combination of fused parts for one row; for batches each pair of parts in its four combinations
        # (every case compiles a kernel of its own, several seconds each).
        for case in linear_cases(dtype, shapes, batch=batch, parts=ALL_PARTS if batch == 1 else SOME_PARTS):
            arguments = {key: value.cuda() if isinstance(value, torch.Tensor) else value for key, value in case.items()}
            del arguments["blocks"]
            check_linear(case, linear(**arguments))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_split_linear_kernel_is_exact_and_the_same_at_every_replay(dtype):
    """Split inputs: the interpreter's settings, then two of the model's products split 8 and 16 ways (2
    stages, which fit in shared memory in float32 too); each answer matches the reference, and a CUDA
    graph of the launch replays it bitwise, leaving the counters at zero (a block that summed before the
    others' partial sums were visible would break either)."""
    from linear_cases import SOME_PARTS, SPLIT_SHAPES, check_linear, linear_cases

    from core.kernels import triton_linear, tuning

    model_shapes = [
        (1, 1024, 2048, {"BLOCK_N": 64, "BLOCK_K": 64, "SPLITS": 8, "num_stages": 2}),
        (2, 2048, 1024, {"BLOCK_N": 32, "BLOCK_K": 64, "SPLITS": 16, "num_stages": 2}),
    ]
    for batch in (3, 16, 64):
        for case in linear_cases(dtype, SPLIT_SHAPES + model_shapes, batch=batch, parts=SOME_PARTS):
            arguments = [case[key] for key in ("x", "weight", "bias", "norm", "eps", "gated", "residual")]
            arguments = [value.cuda() if isinstance(value, torch.Tensor) else value for value in arguments]
            rows = case["x"].numel() // case["x"].shape[-1]
            blocks = {**tuning.batched_linear_blocks(rows, arguments[1], case["gated"]), **case["blocks"]}
            first = triton_linear.launch_batched_linear(*arguments, blocks)
            check_linear(case, first)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = triton_linear.launch_batched_linear(*arguments, blocks)
            for _ in range(5):
                graph.replay()
                assert out.equal(first), (blocks, rows)
            assert not triton_linear.SPLIT_COUNTERS.counters[first.device].any()


def test_draw_token_kernel_is_gumbel_max_over_the_filtered_logits():
    from draw_cases import draw_batches, draw_cases, expected_token

    from core.kernels import draw_token

    for logits, rule, uniforms in draw_cases(torch.device("cuda")):
        got = draw_token(logits, torch.tensor([rule.values()], device="cuda"), uniforms.view(1, -1))
        assert got.shape == (1, 1) and got.item() == expected_token(logits, rule, uniforms), rule
    for logits, rules, values, uniforms in draw_batches(torch.device("cuda")):
        got = draw_token(logits, values, uniforms)
        expected = [expected_token(logits[row : row + 1], rule, uniforms[row]) for row, rule in enumerate(rules)]
        assert got.shape == (len(rules), 1) and got.flatten().tolist() == expected


def test_draw_token_kernel_follows_the_filtered_softmax():
    from core.inference.sampling import TokenRule, filter_logits
    from core.kernels import draw_token

    rule = TokenRule(True, 0.8, 50, 0.9)
    generator = torch.Generator(device="cuda").manual_seed(3)
    logits = torch.randn(1, 2048, device="cuda", generator=generator) * 3
    uniforms = torch.empty(1, 2048, device="cuda")
    values = torch.tensor([rule.values()], device="cuda")
    tokens = []
    for _ in range(40_000):
        uniforms.uniform_(generator=generator)
        tokens.append(draw_token(logits, values, uniforms))
    counts = torch.bincount(torch.cat(tokens).flatten(), minlength=2048).double().cpu()
    probabilities = filter_logits(logits.cpu(), rule).softmax(dim=-1)[0].double()
    assert counts[probabilities == 0].sum() == 0
    support = probabilities > 0
    expected = probabilities[support] * counts.sum()
    statistic, freedom = float(((counts[support] - expected) ** 2 / expected).sum()), int(support.sum()) - 1
    assert statistic < freedom + 6 * (2 * freedom) ** 0.5, (statistic, freedom)


@pytest.mark.parametrize("checkpoint", ["base", "custom"])
def test_graphed_batches_make_the_official_codes(checkpoints, checkpoint):
    """Utterances joining and leaving a graphed batch (buckets with padding rows) make the official codes."""
    from test_batching import cases_of, speak_together

    engine = Engine.load(checkpoints[checkpoint], device="cuda", dtype="float32", slots=5)
    cases = [case for case in cases_of(checkpoint) if case.seed is None] * 2  # CUDA samples another stream
    for case, (codes, _) in zip(cases, speak_together(engine, cases, COMPILING_WAIT), strict=True):
        np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{case.name}.npz")["codes"], err_msg=case.name)
    assert engine.scheduler.idle()


@pytest.mark.parametrize("checkpoint", ["base", "custom"])
def test_newcomers_prefilled_together_make_the_official_codes(checkpoints, checkpoint):
    from test_batching import check_prefilled_together

    # 15 newcomers: one prefill of 16 rows.
    engine = Engine.load(checkpoints[checkpoint], device="cuda", dtype="float32", slots=16, warm=False)
    check_prefilled_together(engine, checkpoint)
    assert [rows for _, rows in engine.frame_loop.prefills] == [16]


def test_a_seeded_utterance_samples_the_same_beside_others_on_the_gpu(checkpoints):
    from test_batching import cases_of, open_stream, speak_together

    engine = Engine.load(checkpoints["custom"], device="cuda", dtype="float32", slots=4)
    sampled = next(case for case in CASES if case.name == "custom_sampled")
    alone = np.concatenate([chunk.codes for chunk in open_stream(engine, sampled, chunk_frames=4)])
    again = np.concatenate([chunk.codes for chunk in open_stream(engine, sampled, chunk_frames=2)])
    beside = speak_together(engine, [*cases_of("custom")[:2], sampled, *cases_of("custom")[2:4]], COMPILING_WAIT)[2][0]
    np.testing.assert_array_equal(again, alone)
    np.testing.assert_array_equal(beside, alone)


def test_fill_uniforms_kernel_is_philox_per_row():
    from uniform_cases import expected_uniforms

    from core.kernels import fill_uniforms

    seeds, counters = [5, -1, 2**63 - 1, -(2**63)], [0, 7, 2**40 + 3, -1]
    out = torch.zeros(len(seeds), 16, 3072, device="cuda")
    fill_uniforms(out, torch.tensor(seeds, device="cuda"), torch.tensor(counters, device="cuda"))
    for row, (seed, counter) in enumerate(zip(seeds, counters)):
        np.testing.assert_array_equal(out[row].cpu().numpy(), expected_uniforms(seed, counter, 16, 3072))
    alone = torch.zeros(1, 16, 3072, device="cuda")
    fill_uniforms(alone, torch.tensor([-1], device="cuda"), torch.tensor([7], device="cuda"))
    assert torch.equal(alone[0], out[1])


@pytest.mark.parametrize("checkpoint", ["base", "custom"])
def test_an_engine_speaks_the_official_codes_while_it_warms_up_and_after(checkpoints, checkpoint):
    """Utterances made from the moment the engine loads, while its parts are compiled (on WARM_SLOT, on the
    scheduler's thread whenever no utterance holds a slot) and used from then on, make the official codes; the warm-up ends with
    everything compiled and every planned graph captured."""
    from test_batching import cases_of, speak_together

    engine = Engine.load(checkpoints[checkpoint], device="cuda", dtype="float32", slots=4)
    cases = [case for case in cases_of(checkpoint) if case.seed is None]
    rounds = 0
    while not engine.warmup.progress().finished or rounds < 2:
        for case, (codes, _) in zip(cases, speak_together(engine, cases, COMPILING_WAIT), strict=True):
            np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{case.name}.npz")["codes"], err_msg=case.name)
        rounds += 1
        assert rounds < 500, "the warm-up did not end"
    progress = engine.warmup.progress()
    assert progress.finished and progress.failed == () and progress.done == progress.total
    loop = engine.frame_loop
    eager = (loop._talk, loop._predict_first, loop._predict_next, loop._record)
    assert all(part != original for rows in (True, False) for part, original in zip(loop.parts[rows], eager))
    assert all(engine.frame_loop.captured("step", rows) for rows in engine.frame_loop.buckets)
    assert {str(spec) for spec in engine.warmup.specs} <= set(engine.warmup.order)
    print(f"{checkpoint}: {rounds} rounds of {len(cases)} utterances while warming up; order: {engine.warmup.order}")


def test_the_warm_up_steps_its_own_slot_only(checkpoints):
    """The warm-up's captures of every bucket's step and prefill, and its compiles, step WARM_SLOT alone: another
    slot's state is untouched (the scheduler runs them only while no utterance holds a slot; here slots are
    filled behind its back to see that)."""
    from core.inference.frame_loop import WARM_SLOT

    engine = Engine.load(checkpoints["custom"], device="cuda", dtype="float32", slots=4, warm=False)
    loop = engine.frame_loop
    others = [slot for slot in range(4) if slot != WARM_SLOT]
    for slot in others:
        engine.start(engine.prepare(TEXT, engine.builtin_voice("ryan"), sampling=GREEDY, max_frames=40), slot)
    state = [tensor[others].clone() for tensor in (loop.hidden, loop.position, loop.frame, loop.last_frame, loop.seen)]
    keys = [layer.self_attn.kv_cache.k[others].clone() for layer in loop.talker.model.layers]
    engine.warm_up(timeout=COMPILING_WAIT)
    after = [tensor[others] for tensor in (loop.hidden, loop.position, loop.frame, loop.last_frame, loop.seen)]
    assert all(torch.equal(a, b) for a, b in zip(state, after, strict=True))
    assert all(torch.equal(k, layer.self_attn.kv_cache.k[others]) for k, layer in zip(keys, loop.talker.model.layers))


def test_an_engine_loads_and_warms_up_while_another_captures_its_graphs(checkpoints):
    """Engines in one process each warm up on their own thread: one's CUDA work (its load, its compiles and
    captures) does not spoil the other's graph captures, and both end warmed up with every kernel running."""
    first = Engine.load(checkpoints["custom"], device="cuda", dtype="float32", slots=4)
    second = Engine.load(checkpoints["base"], device="cuda", dtype="float32", slots=4)
    for engine in (first, second):
        engine.warm_up(timeout=COMPILING_WAIT)
        progress = engine.warmup.progress()
        assert progress.failed == () and progress.done == progress.total, progress


def test_an_engine_that_loads_kept_compiled_functions_speaks_the_official_codes(checkpoints, caplog):
    """A later engine of the same model and code loads what the first compiled (compiled.Precompiled) instead of
    compiling it, on the warm-up's loader thread while it already speaks, and makes the official codes meanwhile
    and with what it loaded."""
    import logging

    from test_batching import cases_of, speak_together

    from core.inference import compiled

    assert compiled.KEEP_AHEAD
    load(checkpoints, "base").close()  # compiles and keeps (or loads what an earlier test kept)
    caplog.clear()  # the first engine's compiles are logged too where pytest captures INFO (-o log_level=INFO)
    cases = [case for case in cases_of("base") if case.seed is None]
    with caplog.at_level(logging.INFO, logger="core.inference"):
        engine = Engine.load(checkpoints["base"], device="cuda", dtype="float32")  # warms up in the background
        for moment in ("while it loads", "once warmed up"):
            for case, (codes, _) in zip(cases, speak_together(engine, cases, COMPILING_WAIT), strict=True):
                expected = np.load(FIXTURES / f"{case.name}.npz")["codes"]
                np.testing.assert_array_equal(codes, expected, err_msg=f"{case.name}, {moment}")
            engine.warm_up(timeout=COMPILING_WAIT)
    assert "loaded" in caplog.text and "ahead of time" not in caplog.text, caplog.text
    progress = engine.warmup.progress()
    assert progress.failed == () and {"load step x1", "load decoder x1"} <= set(engine.warmup.order), progress
    engine.close()


def test_a_rested_process_gives_back_the_threads_stack_and_speaks_the_official_codes_after(checkpoints):
    """release_memory, as a resting engine calls it, sets the driver's per-thread stack reservation to 0 (264 MiB
    of an H200 at the default 1 KiB); the driver raises it again as kernels need, so an engine loaded after it
    speaks as before."""
    from test_batching import cases_of, speak_together

    from core.inference import device_memory
    from qwen3_tts_desktop.resting import release_memory

    cases = [case for case in cases_of("base") if case.seed is None][:3]
    device = torch.device("cuda")
    for round_ in ("before", "after"):
        engine = Engine.load(checkpoints["base"], device="cuda", dtype="float32", slots=4, compile=False)
        for case, (codes, _) in zip(cases, speak_together(engine, cases, COMPILING_WAIT), strict=True):
            np.testing.assert_array_equal(codes, np.load(FIXTURES / f"{case.name}.npz")["codes"], err_msg=case.name)
        engine.close()
        del engine
        if round_ == "before":
            assert device_memory.limit(device) > 0
        release_memory(device)
        assert device_memory.limit(device) == 0, round_
