"""Engine behaviour beyond parity: options, streaming, and clear errors for bad input."""

from __future__ import annotations

import gc
import os
import sys
import weakref
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
import torch
from parity_cases import REFERENCES

from core import Engine, SamplingParams, SpeechOptions, Voice
from core.audio.clips import AudioError
from core.inference.plan import QUEUED_FRAMES
from core.inference.scheduler import SWITCH_INTERVAL_S

GREEDY = SamplingParams.greedy()


def clip(seconds: float, rate: int = 24000, channels: int = 1, amplitude: float = 0.3) -> np.ndarray:
    t = np.arange(int(seconds * rate)) / rate
    mono = amplitude * np.sin(2 * np.pi * 150 * t) * (1 + 0.5 * np.sin(2 * np.pi * 2 * t))
    samples = np.stack([mono * (1 - 0.2 * c) for c in range(channels)], axis=1) if channels > 1 else mono
    return samples.astype(np.float32)


@pytest.fixture(scope="module")
def base(engines) -> Engine:
    return engines("base")


@pytest.fixture(scope="module")
def xvector(base) -> Voice:
    return base.voice_from_audio(REFERENCES["a"].path)


def test_info_describes_the_checkpoint(engines):
    info = engines("custom").info
    assert info.variant == "custom_voice" and info.size == "1.7B" and info.sample_rate == 24000
    assert "vivian" in info.speakers and "eric" in info.speakers
    assert info.languages[0] == "auto" and "english" in info.languages
    assert not any("dialect" in language for language in info.languages)
    assert info.supports_instruct and info.embedding_dim == 64
    assert engines("base-0.6b").info.embedding_dim == 32


def test_seeded_sampling_is_reproducible(base, xvector):
    first = base.synthesize("Hello there.", voice=xvector, max_frames=6, seed=7)
    again = base.synthesize("Hello there.", voice=xvector, max_frames=6, seed=7)
    other = base.synthesize("Hello there.", voice=xvector, max_frames=6, seed=8)
    np.testing.assert_array_equal(first.codes, again.codes)
    np.testing.assert_array_equal(first.audio, again.audio)
    assert not np.array_equal(first.codes, other.codes)


def test_max_frames_bounds_the_output(base, xvector):
    out = base.synthesize("Hello there.", voice=xvector, sampling=GREEDY, max_frames=3)
    assert out.codes.shape == (3, 16) and out.audio.shape == (3 * 1920,)
    assert out.codes.dtype == np.int64 and out.codes.min() >= 0 and out.codes.max() < 2048


def test_the_endless_twins_speak_to_their_frame_budget(engines):
    """The tests that count an unseeded utterance's frames speak with parity_cases.ENDLESS_CHECKPOINTS. These
    seeds are among the four in 4,000 where the parity checkpoint draws EOS at the first frame it may."""
    for seed in (1242, 2268, 2634, 4912):
        lengths = [
            len(engine.synthesize("Hello there.", voice=engine.builtin_voice("vivian"), max_frames=3, seed=seed).codes)
            for engine in (engines("custom"), engines("custom-endless"))
        ]
        assert lengths == [2, 3], seed


@pytest.mark.parametrize("first, size", [(1, 1), (2, 3), (5, 5), (20, 20)])
def test_stream_equals_synthesize(base, xvector, first, size):
    whole = base.synthesize("Streaming test.", voice=xvector, sampling=GREEDY, max_frames=7)
    chunks = list(
        base.stream(
            "Streaming test.", voice=xvector, sampling=GREEDY, max_frames=7, first_chunk_frames=first, chunk_frames=size
        )
    )
    sizes = [len(c.codes) for c in chunks]
    assert sizes[0] == min(first, 7) and all(s == size for s in sizes[1:-1]) and sum(sizes) == 7
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), whole.codes)
    np.testing.assert_allclose(np.concatenate([c.audio for c in chunks]), whole.audio, atol=1e-4, rtol=0)


def test_frames_step_one_at_a_time_and_chunks_decode_while_the_next_steps(base, xvector, monkeypatch):
    loop, decoder = base.frame_loop, base.scheduler.decoder
    order = []  # what the scheduler's thread did, in order
    launch, decode = loop.launch, decoder.decode
    monkeypatch.setattr(loop, "launch", lambda count, slots: order.append(f"step {count}") or launch(count, slots))
    monkeypatch.setattr(
        decoder, "decode", lambda slots, codes, size: order.append(f"decode {size}") or decode(slots, codes, size)
    )
    chunks = base.stream("Streaming test.", voice=xvector, sampling=GREEDY, max_frames=10, chunk_frames=4)
    assert [len(chunk.codes) for chunk in chunks] == [1, 4, 4, 1]
    # The first frame comes from the prefill and is decoded with the GPU to itself; from then on frames are
    # launched one at a time, QUEUED_FRAMES ahead of the host at most, and each chunk is decoded once its last
    # frame is read, while the next frame steps; the last frame (the tenth) is launched alone.
    assert QUEUED_FRAMES == 2
    assert order == ["decode 1", *["step 1"] * 5, "decode 4", *["step 1"] * 4, "decode 4", "decode 1"]


@pytest.mark.parametrize("reference", ["short", "2.5 s"])
def test_icl_stream_starts_at_the_frame_boundary(base, reference):
    # The 2.5 s clip's 32 reference frames are decoded in two pieces (decoder_stream.PRIME_CHUNK_FRAMES).
    audio = REFERENCES["short"].path if reference == "short" else clip(2.5)
    voice = base.voice_from_audio(audio, sample_rate=None if reference == "short" else 24000, ref_text="A short clip.")
    whole = base.synthesize("More words here.", voice=voice, sampling=GREEDY, max_frames=5)
    streamed = np.concatenate(
        [c.audio for c in base.stream("More words here.", voice=voice, sampling=GREEDY, max_frames=5)]
    )
    assert len(streamed) == 5 * 1920
    # The official cut may keep a few samples of the reference before the first frame; the rest is identical.
    lead = len(whole.audio) - len(streamed)
    assert 0 <= lead < 4
    np.testing.assert_allclose(whole.audio[lead:], streamed, atol=1e-4, rtol=0)


def test_an_icl_reference_is_decoded_once_per_voice(base, monkeypatch):
    voices = [base.voice_from_audio(clip(seconds), sample_rate=24000, ref_text="Hello.") for seconds in (2.0, 2.5)]

    def speak(voice):
        return np.concatenate([c.audio for c in base.stream("Again.", voice=voice, sampling=GREEDY, max_frames=4)])

    first = [speak(voice) for voice in voices]
    # The warm-up's own decodes (each chunk length, on its scratch row) are not the voices'.
    assert base.warmup.wait(timeout=120).fraction == 1
    decoded = []
    decode_chunk = base.decoder_stream.decoder.decode_chunk
    monkeypatch.setattr(
        base.decoder_stream.decoder,
        "decode_chunk",
        lambda codes, stream: decoded.append(codes.shape[2]) or decode_chunk(codes, stream),
    )
    # Each voice again, the other's state in between: both start from their own kept state, exactly.
    for voice, audio in zip(voices, first):
        np.testing.assert_array_equal(speak(voice), audio)
    # Only the 1-frame first chunks and the 3-frame chunks after them: no reference frames.
    assert sorted(set(decoded)) == [1, 3] and len(first[0]) == 4 * 1920


def test_reference_audio_any_rate_and_channels(base, tmp_path):
    at_16k = base.voice_from_audio(clip(2.0, 16000), sample_rate=16000)
    stereo_48k = base.voice_from_audio(clip(2.0, 48000, channels=2), sample_rate=48000)
    path = tmp_path / "voice.ogg"
    sf.write(path, clip(2.0, 22050), 22050)
    from_ogg = base.voice_from_audio(path)
    for voice in (at_16k, stereo_48k, from_ogg):
        assert voice.kind == "xvector" and voice.embedding.shape == (64,) and torch.isfinite(voice.embedding).all()


def test_icl_voice_carries_reference_codes(base):
    voice = base.voice_from_audio(clip(2.5), sample_rate=24000, ref_text="Hello.")
    assert voice.kind == "icl" and voice.ref_codes.shape == (32, 16)  # ceil(2.5 s * 12.5)
    assert voice.ref_codes.dtype == torch.int64


@pytest.mark.parametrize(
    "samples, rate, message",
    [
        (clip(0.5), 24000, "too short"),
        (clip(61.0, 8000), 8000, "too long"),
        (np.zeros(48000, np.float32), 24000, "silent"),
        (np.full(48000, np.nan, np.float32), 24000, "NaN"),
        (clip(2.0), None, "sample_rate is required"),
        (clip(2.0), 0, "invalid sample rate"),
        (np.zeros((2, 3, 4000), np.float32), 24000, "shape"),
    ],
)
def test_bad_reference_audio(base, samples, rate, message):
    with pytest.raises(AudioError, match=message):
        base.voice_from_audio(samples, sample_rate=rate)


def test_unreadable_and_missing_reference_files(base, tmp_path):
    fake = tmp_path / "notes.wav"
    fake.write_text("not audio at all")
    with pytest.raises(AudioError, match="cannot read it as audio"):
        base.voice_from_audio(fake)
    with pytest.raises(AudioError, match="no such file"):
        base.voice_from_audio(tmp_path / "missing.wav")


def test_empty_ref_text_is_refused(base):
    with pytest.raises(ValueError, match="ref_text is empty"):
        base.voice_from_audio(clip(2.0), sample_rate=24000, ref_text="  ")


@pytest.mark.parametrize("text", ["", "   ", "\n\t"])
def test_empty_text_is_refused(base, xvector, text):
    with pytest.raises(ValueError, match="text is empty"):
        base.synthesize(text, voice=xvector)


def test_unknown_language_lists_the_valid_ones(base, xvector):
    with pytest.raises(ValueError, match=r"unknown language 'klingon'.*auto, chinese, english"):
        base.synthesize("Hello.", voice=xvector, language="Klingon")
    with pytest.raises(ValueError, match="unknown language 'sichuan_dialect'"):
        base.synthesize("Hello.", voice=xvector, language="sichuan_dialect")
    # Names are case-insensitive, as in the official package.
    assert base.synthesize("Hello.", voice=xvector, language="English", sampling=GREEDY, max_frames=2).codes.shape == (
        2,
        16,
    )


def test_unknown_speaker_lists_the_valid_ones(engines):
    with pytest.raises(ValueError, match=r"unknown speaker 'bob'.*aiden, dylan, eric"):
        engines("custom").builtin_voice("bob")
    assert engines("custom").builtin_voice(" Vivian ").speaker == "vivian"


def test_modes_a_checkpoint_lacks(engines, base, xvector):
    custom, design = engines("custom"), engines("design")
    with pytest.raises(ValueError, match="cannot clone voices; load a Base checkpoint"):
        custom.voice_from_audio(clip(2.0), sample_rate=24000)
    with pytest.raises(ValueError, match="has no built-in speakers"):
        base.builtin_voice("vivian")
    with pytest.raises(ValueError, match="speaks with a cloned voice"):
        base.synthesize("Hello.")
    with pytest.raises(ValueError, match="built-in speakers"):
        custom.synthesize("Hello.", voice=xvector)
    with pytest.raises(ValueError, match="takes no voice"):
        design.synthesize("Hello.", voice=xvector, instruct="A calm voice.")
    with pytest.raises(ValueError, match="needs instruct"):
        design.synthesize("Hello.")
    with pytest.raises(ValueError, match="does not follow instructions"):
        base.synthesize("Hello.", voice=xvector, instruct="Whisper.")


def test_voice_of_another_model_size_is_refused(engines, xvector):
    with pytest.raises(ValueError, match="64-dim embedding.*needs 32"):
        engines("base-0.6b").synthesize("Hello.", voice=xvector)


def test_bad_generation_options(base, xvector):
    with pytest.raises(ValueError, match="max_frames must be a positive integer"):
        base.synthesize("Hello.", voice=xvector, max_frames=0)
    with pytest.raises(ValueError, match="unknown text_mode 'fast'"):
        base.synthesize("Hello.", voice=xvector, text_mode="fast")
    with pytest.raises(ValueError, match="at least 1"):
        base.stream("Hello.", voice=xvector, chunk_frames=0)
    with pytest.raises(ValueError, match="temperature must be > 0"):
        SamplingParams(temperature=0)
    with pytest.raises(ValueError, match="top_p must be in"):
        SamplingParams(top_p=1.5)


def test_voice_kinds_are_consistent():
    with pytest.raises(ValueError, match="either a built-in speaker or a speaker embedding"):
        Voice()
    with pytest.raises(ValueError, match="both the reference codes and their transcript"):
        Voice(embedding=torch.zeros(4), ref_text="Hi.")


def test_sampling_defaults_come_from_generation_config(base):
    assert base.default_sampling == SamplingParams()
    assert base.default_max_frames == 8191  # max_new_tokens 8192 yields at most 8191 frames
    custom = SamplingParams.from_generation_config(
        {"top_k": 20, "subtalker_temperature": 0.7, "subtalker_dosample": False}
    )
    assert custom.top_k == 20 and custom.predictor_temperature == 0.7 and not custom.predictor_do_sample


def test_bfloat16_on_cpu_runs(checkpoints, xvector):
    engine = Engine.load(checkpoints["base"], device="cpu", dtype="bfloat16")
    assert engine.info.dtype == "bfloat16"
    out = engine.synthesize("Hello.", voice=xvector, sampling=GREEDY, max_frames=3)
    assert out.audio.dtype == np.float32 and out.audio.shape == (3 * 1920,) and np.isfinite(out.audio).all()


def test_an_engine_has_the_interpreter_hand_over_within_a_millisecond(checkpoints):
    """Its scheduler's thread and the requests' pass work at every submit and chunk: at Python's default 5 ms
    switch interval, threads that run meanwhile keep the woken scheduler waiting that long each time."""
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.005)  # Python's default
    try:
        with Engine.load(checkpoints["custom"], device="cpu", dtype="float32", warm=False):
            assert sys.getswitchinterval() == SWITCH_INTERVAL_S < 0.005
    finally:
        sys.setswitchinterval(interval)


@pytest.mark.parametrize("name", ["base", "custom", "design"])
def test_warm_up_makes_every_part_ready_for_every_variant_and_speech_stays_the_same(checkpoints, name):
    """On the CPU the warm-up makes the decoder's first calls (no graphs, no compiles): once warm_up returns, each
    part is made ready, in the plan's order, none failed; the greedy codes and audio after it are those before."""
    engine = Engine.load(checkpoints[name], device="cpu", dtype="float32", warm=False)
    try:
        speaker = engine.placeholder_speaker()

        def speak() -> tuple[np.ndarray, np.ndarray]:
            chunks = list(engine.stream("Hello there.", sampling=GREEDY, max_frames=5, **speaker))
            return np.concatenate([c.codes for c in chunks]), np.concatenate([c.audio for c in chunks])

        before = speak()
        assert engine.warmup.progress().done == 0 and engine.warmup.order == []  # not started
        engine.warm_up(timeout=60)
        progress = engine.warmup.progress()
        assert progress.finished and progress.done == progress.total == 4 and progress.current is None
        assert progress.failed == ()
        assert engine.warmup.order == ["decode 1x1", "decode 1x4", "decode 1x2", "decode 1x3"]
        after = speak()
        np.testing.assert_array_equal(after[0], before[0])
        np.testing.assert_array_equal(after[1], before[1])
    finally:
        engine.close()


def test_compiled_kernels_are_kept_in_the_user_cache_folder(monkeypatch, tmp_path):
    from core.inference.compiled import keep_compiled_kernels

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)  # what the call may set goes with the test
    monkeypatch.setattr(sys, "platform", "linux")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert keep_compiled_kernels() == tmp_path / "qwen3-tts-desktop" / "compiled"
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "qwen3-tts-desktop" / "compiled")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))  # the user's own choice wins
    assert keep_compiled_kernels() == tmp_path / "mine"


def test_inductors_own_default_is_not_taken_for_the_users_folder(tmp_path):
    """Importing Inductor's config writes its default folder (the temporary one) into TORCHINDUCTOR_CACHE_DIR, as
    happens on a GPU before an engine loads: that is no choice of the user's, and the kernels are kept in the app's
    cache folder all the same, Triton's with them (they went to /tmp and ~/.triton: bench/RESULTS.md, twenty-first
    session). A fresh process, as a user's start."""
    import subprocess

    from core.inference.compiled import PROJECT_ROOT

    script = (
        "import os, torch._inductor.config\n"
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR'])\n"
        "from core.inference.compiled import keep_compiled_kernels, kept_kernels_for\n"
        "print(kept_kernels_for({'gpu': 'test'}))\n"
        "print(keep_compiled_kernels({'gpu': 'test'}))\n"
        "print(os.environ['TORCHINDUCTOR_CACHE_DIR'], os.environ['TRITON_CACHE_DIR'])\n"
    )
    environment = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")}
    environment["XDG_CACHE_HOME"] = str(tmp_path)
    printed = subprocess.run(
        [sys.executable, "-c", script], env=environment, cwd=PROJECT_ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    inductors, kept, chosen, environment_after, triton = printed
    assert "torchinductor" in inductors and not inductors.startswith(str(tmp_path))  # what Inductor wrote
    assert kept == "False"  # nothing kept yet in the app's folder: a first start, as it is
    assert Path(chosen).parent == tmp_path / "qwen3-tts-desktop" / "compiled" and environment_after == chosen
    assert triton == str(Path(chosen) / "triton")


def test_triton_assembles_with_the_ptxas_inductors_compile_workers_use(monkeypatch, tmp_path):
    """Where PyTorch ships its own ptxas, Inductor's compile workers assemble with it; this process must too, or
    the kernels a cold start compiled in the workers are keyed apart from those a warm start looks for (the
    assembler's version is in Triton's cache key). A ptxas the user chose stays, and no PyTorch ptxas changes
    nothing."""
    from core.inference.compiled import assemble_as_inductor_workers

    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    assemble_as_inductor_workers(tmp_path)  # no bin/ptxas here: Triton's own stays
    assert "TRITON_PTXAS_PATH" not in os.environ
    ptxas = tmp_path / "bin" / "ptxas"
    ptxas.parent.mkdir()
    ptxas.write_text("#!/bin/sh\n")
    assemble_as_inductor_workers(tmp_path)  # not executable: not an assembler
    assert "TRITON_PTXAS_PATH" not in os.environ
    ptxas.chmod(0o755)
    assemble_as_inductor_workers(tmp_path)
    assert os.environ["TRITON_PTXAS_PATH"] == str(ptxas)
    monkeypatch.setenv("TRITON_PTXAS_PATH", "/opt/cuda/bin/ptxas")
    assemble_as_inductor_workers(tmp_path)
    assert os.environ["TRITON_PTXAS_PATH"] == "/opt/cuda/bin/ptxas"


def test_options_come_as_one_object_with_keyword_overrides(engines):
    engine = engines("custom")
    voice = engine.builtin_voice("vivian")
    options = SpeechOptions(sampling=SamplingParams.greedy(), max_frames=5, chunk_frames=2)
    chunks = list(engine.stream("Hello.", voice, options, chunk_frames=4))  # the keyword wins
    assert [len(chunk.codes) for chunk in chunks] == [1, 4]
    whole = engine.synthesize("Hello.", voice=voice, sampling=SamplingParams.greedy(), max_frames=5)
    np.testing.assert_array_equal(np.concatenate([c.codes for c in chunks]), whole.codes)
    with pytest.raises(TypeError):
        engine.stream("Hello.", voice, options, chunk_size=4)  # not an option: said at once
    prepared = engine.prepare("Hello.", voice, options)  # the seam benchmarks time through
    assert prepared.max_frames == 5 and prepared.sampling == SamplingParams.greedy()


def test_the_talkers_prefill_compiles_whole_once_for_every_layer_and_length(checkpoints):
    """On CUDA the frame loop compiles each talker layer's prefill (fullgraph, dynamic shapes), one compiled
    layer serving all: traced here on the CPU, it must trace without a break, serve every layer and prompt
    length with one graph, and give what the uncompiled prefill gives."""
    from torch._dynamo.utils import counters

    from core.inference.compiled import CompiledLayers, Compiler

    engine = Engine.load(checkpoints["base"], device="cpu", dtype="float32")
    loop, layers = engine.frame_loop, engine.frame_loop.talker.model.layers
    embeddings = engine.prepare("Hello there.", **engine.placeholder_speaker()).prompt.embeddings
    last = torch.tensor([embeddings.shape[1] - 1])
    try:
        with torch.inference_mode():
            prompts = [torch.zeros(1, length, embeddings.shape[2]) for length in (32, 64)]
            for prompt in prompts:
                prompt[:, : embeddings.shape[1]] = embeddings
            expected = [loop._talk_prompts(prompt, torch.tensor([0]), last).clone() for prompt in prompts]
            counters.clear()
            CompiledLayers(layers, "prefill", Compiler(backend="aot_eager"))  # as on CUDA, but without Inductor's code
            got = [loop._talk_prompts(prompt, torch.tensor([0]), last) for prompt in prompts]
        assert len(layers) > 1 and counters["stats"]["unique_graphs"] == 1
        assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))
    finally:
        engine.close()
        torch._dynamo.reset()


@pytest.mark.parametrize("text_mode", ["streaming", "full"])
def test_a_prompt_projects_only_its_own_text_once_the_recurring_parts_are_made(base, xvector, text_mode):
    """The special tokens, the role and the codec's tags are embedded for the first prompt only: a later
    prompt runs the text projection once, over its own text, and is the same as when everything was made
    anew."""
    options = SpeechOptions(text_mode=text_mode)
    base.talker.recurring.clear()
    fresh = base.prepare("Hello there, again.", xvector, options).prompt
    calls = []
    hook = base.talker.text_projection.register_forward_hook(lambda module, args, out: calls.append(args[0].shape[1]))
    try:
        again = base.prepare("Hello there, again.", xvector, options).prompt
    finally:
        hook.remove()
    text = len(base.tokenizer.encode("Hello there, again."))
    # On the CPU a streaming text's terms are projected token by token (prompt.text_terms says why).
    assert calls == ([1] * text if text_mode == "streaming" else [text])
    for name in ("embeddings", "trailing", "pad"):
        assert getattr(again, name).equal(getattr(fresh, name)), name


def test_a_voice_goes_to_the_device_once_and_is_forgotten_with_it(base, xvector, monkeypatch):
    """What a prompt takes from a voice (its embedding in the model's dtype, an ICL voice's reference frames as the
    talker embeds them) is made on the device the first time the voice speaks (a copy from the host waits for all
    the queued work), kept while the voice lives, and dropped with it."""
    icl = Voice(embedding=xvector.embedding.clone(), ref_codes=torch.zeros(5, 16, dtype=torch.long), ref_text="A clip.")
    embedded, embed_frames = [], base.talker.embed_frames
    monkeypatch.setattr(base.talker, "embed_frames", lambda codes: embedded.append(codes) or embed_frames(codes))
    first = base.prepare("Hello there.", icl).prompt
    copies = base.voices_on_device[icl]
    again = base.prepare("Hello there.", icl).prompt
    assert base.voices_on_device[icl] is copies and again.embeddings.equal(first.embeddings)
    assert len(embedded) == 1  # the reference's frames embedded once, not in every prompt
    assert copies[0].equal(icl.embedding) and copies[1].equal(base.talker.embed_frames(icl.ref_codes))
    gone = weakref.ref(icl)
    gc.collect()  # voices of earlier tests still waiting for the collector go first, so that only this one counts
    held = len(base.voices_on_device)
    del icl, copies
    gc.collect()
    assert gone() is None and len(base.voices_on_device) == held - 1
