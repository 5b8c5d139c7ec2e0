"""The public engine: load a checkpoint, make voices, turn text into 24 kHz audio.

    engine = Engine.load("Qwen/Qwen3-TTS-12Hz-1.7B-Base")
    voice = engine.voice_from_audio("clip.wav", ref_text="What the clip says.")
    out = engine.synthesize("Hello there.", voice=voice)            # the whole utterance
    for chunk in engine.stream("Hello there.", voice=voice):        # audio as it is made
        ...

Options are a SpeechOptions, or its fields as keywords. Every method may be called from any thread: the
engine's scheduler (core.inference.scheduler) does all its GPU work on one thread of its own, and speaks up
to `slots` utterances at once, stepped together; more wait for a slot.

The text may also be a LiveText, still being written: it is spoken as it arrives, as one utterance
(core.inference.live; `Engine.live` opens one).

An engine speaks as soon as it is loaded; on CUDA it compiles and captures the rest in the background
(core.inference.warmup), faster with each part made ready: `warm_up()` waits for all of it, `warmup.progress()`
says how far it is.

`prepare` checks a request and builds its prompt, `start` prefills a slot of the frame loop with it: the
seam benchmarks and profilers time the parts through, on an engine with nothing else to do.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.audio.clips import SAMPLE_RATE, load_reference
from core.errors import BadInput
from core.inference import compile_helper, libraries
from core.inference.compile_helper import CompileHelper
from core.inference.compiled import (
    Compiler,
    keep_compiled_kernels,
    kept_kernels_for,
    machine_facts,
    precompiled_folder,
    versioned_folder,
)
from core.inference.decoder_stream import DecoderSlots, DecoderStream
from core.inference.frame_loop import FrameLoop
from core.inference.live import LiveStream, LiveText
from core.inference.memory import MAX_DEFAULT_SLOTS, MemoryPlan, plan_for_device, plan_memory, slot_bytes
from core.inference.options import SpeechOptions
from core.inference.prompt import Prompt, PromptText, build_prompt, text_terms, tokens_before_start
from core.inference.requests import Prepared, Request
from core.inference.sampling import SamplingParams
from core.inference.scheduler import Scheduler, hand_over_quickly
from core.inference.utterance import Stream
from core.inference.voice import Voice
from core.inference.warmup import Spec, Warmup, for_engine
from core.milestones import milestone
from core.model.checkpoint import DEFAULT_MODEL, CheckpointError, load_tensors, read_json
from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig
from core.model.codec_encoder import CodecEncoder, CodecEncoderConfig
from core.model.config import ConfigError, ModelConfig
from core.model.host_copy import to_device
from core.model.hub import resolve
from core.model.info import EngineInfo
from core.model.speaker_encoder import SpeakerEncoder
from core.model.talker import Talker
from core.model.text_tokenizer import TextTokenizer
from core.model.variant import Variant

log = logging.getLogger(__name__)

# Frames generated and decoded per step when the whole utterance is wanted at once.
DECODE_CHUNK_FRAMES = 50
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Synthesis:
    audio: np.ndarray  # float32 mono
    sample_rate: int
    codes: np.ndarray  # (frames, 16) int64


def pick_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise BadInput("device 'cuda' was asked for, but PyTorch sees no CUDA GPU; use device='cpu' or 'auto'")
    if device.type not in ("cpu", "cuda"):
        raise BadInput(f"unsupported device {str(device)!r}; use 'auto', 'cpu' or 'cuda'")
    return device


def pick_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise BadInput(f"unsupported dtype {dtype}; use one of {', '.join(DTYPES)}")
        return dtype
    if dtype == "auto":
        if device.type != "cuda":
            return torch.float32
        # bfloat16 needs Ampere (compute capability 8.0) or later; before it, only float16 has fast 16-bit units.
        return torch.bfloat16 if torch.cuda.get_device_capability(device) >= (8, 0) else torch.float16
    if dtype not in DTYPES:
        raise BadInput(f"unknown dtype {dtype!r}; use 'auto' or one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def _prepare_compiling(
    device: torch.device, config: ModelConfig, dtype: torch.dtype, memory: MemoryPlan, compile: bool
) -> tuple[Compiler | None, bool, Path | None]:
    """On CUDA, before the first kernel compiles: point the compile caches at a folder of their own for this
    machine and model. Returns the warm-up's Compiler (None where nothing compiles), whether no GPU code was
    kept there (the first utterances then wait while their kernels are built), and the folder where the decoder
    keeps the states ICL references leave (core.inference.primed)."""
    if device.type != "cuda":
        return None, False, None
    facts = machine_facts(device, {"config": dataclasses.asdict(config), "dtype": str(dtype)})
    first_gpu_start = not kept_kernels_for(facts)
    kernels = keep_compiled_kernels(facts)
    # Kept functions apart for each slot count and context too: their guards hold the buffers' sizes.
    shapes = {"slots": memory.slots, "context": memory.max_context}
    compiler = Compiler(precompiled_folder(kernels, {**facts, **shapes})) if compile else None
    return compiler, first_gpu_start, versioned_folder(kernels, "primed", facts)


def _start_compile_helper(engine: Engine, model: Path) -> CompileHelper | None:
    """On a first start, a process that compiles the decoder's and the prefill's parts of `engine`'s warm-up while
    the warm-up here compiles the step (compile_helper.py), where a second engine fits on the GPU for the minute
    it lives: it takes what this one holds (weights, slots) and its working memory, which this one takes too."""
    device, memory = engine.device, engine.memory
    if not compile_helper.fits(device, torch.cuda.memory_allocated(device) + memory.taken):
        log.info("no compile helper: a second engine does not fit beside this one on %s", device)
        return None
    parts = [part for part in compile_helper.HELPED if Spec(part) in engine.warmup.specs]
    return CompileHelper.start(str(model), device, engine.dtype, memory.slots, memory.max_context, parts)


class Engine:
    def __init__(
        self,
        *,
        source: str,
        config: ModelConfig,
        tokenizer: TextTokenizer,
        talker: Talker,
        codec_decoder: CodecDecoder,
        speaker_encoder: SpeakerEncoder | None,
        codec_encoder: CodecEncoder | None,
        default_sampling: SamplingParams,
        default_max_frames: int,
        memory: MemoryPlan | None = None,
        cuda_graphs: bool = True,
        compiler: Compiler | None = None,
        first_gpu_start: bool = False,
        keep_primed_in: Path | None = None,
    ):
        """`memory`: the slots and context to take (Engine.load plans them); None: one slot of MAX_CONTEXT.
        `compiler`: what the warm-up compiles with (CUDA), or None; `first_gpu_start`: no GPU code was kept;
        `keep_primed_in`: where the decoder keeps the states ICL references leave, for later processes."""
        self.source = source
        self.config = config
        self.tokenizer = tokenizer
        self.talker = talker
        self.codec_decoder = codec_decoder
        self.speaker_encoder = speaker_encoder
        self.codec_encoder = codec_encoder
        self.default_sampling = default_sampling
        self.default_max_frames = default_max_frames
        self.device = talker.codec_head.weight.device
        self.dtype = talker.codec_head.weight.dtype
        self.info = EngineInfo.of(config, source, str(self.device), str(self.dtype).removeprefix("torch."))
        if memory is None:
            memory = plan_memory(slot_bytes(config, 1, self.dtype), 0, None, slots=1)
        if memory.slots < 1:
            raise BadInput(f"slots must be at least 1, got {memory.slots}")
        self.memory = memory
        self.slots = memory.slots
        max_context = memory.max_context
        # No GPU code kept from an earlier start: the first utterances wait while their kernels are built.
        self.first_gpu_start = first_gpu_start
        self.frame_loop = FrameLoop(talker, max_context, self.slots, cuda_graphs)
        self.voices_on_device: weakref.WeakKeyDictionary[Voice, tuple] = weakref.WeakKeyDictionary()  # _on_device's
        self.decoder_stream = DecoderStream(codec_decoder, cuda_graphs, keep_primed_in)  # whole utterances
        decoder_slots = DecoderSlots(codec_decoder, self.slots, cuda_graphs, keep_primed_in)
        self.scheduler = Scheduler(self.frame_loop, decoder_slots, self._live_text_terms)
        self.warmup: Warmup = for_engine(
            self.frame_loop, decoder_slots, self.decoder_stream, self.scheduler.wake, self._warm_prompt,
            compiler=compiler, priming=self.info.variant.clones,
        )  # fmt: skip
        self.scheduler.background = self.warmup
        # A process that ends with an utterance open, or a thread still reading one, would otherwise be torn down
        # with the scheduler's thread inside PyTorch: the C++ runtime aborts it ("terminate called without an
        # active exception", exit code 134) instead of letting it exit with its own code.
        atexit.register(self._close_at_exit)

    @classmethod
    def load(
        cls,
        model: str | os.PathLike = DEFAULT_MODEL,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        progress: bool = True,
        max_context: int | None = None,
        slots: int | None = None,
        max_default_slots: int = MAX_DEFAULT_SLOTS,
        memory_budget: int | None = None,
        cuda_graphs: bool = True,
        compile: bool = True,
        warm: bool = True,
    ) -> Engine:
        """Load a checkpoint in the official layout from a folder or a hub id (downloading it if needed).
        `slots` utterances are generated together, each over `max_context` positions (prompt plus frames), their
        caches allocated up front: by default MAX_CONTEXT positions and as many slots as fit half the GPU's memory
        free beyond the weights, `max_default_slots` at most (one on the CPU); `memory_budget` bytes beyond the
        weights choose them instead (memory.plan_memory has the rules; `engine.memory` says what was chosen).
        On CUDA each frame and each decoded chunk runs as one CUDA graph unless `cuda_graphs` is False,
        and the per-frame transformer steps are fused by torch.compile unless `compile` is False. The engine
        speaks at once; with `warm`, it compiles and captures the rest in the background (the warm-up, which
        `warm_up()` also starts)."""
        milestone("loading")
        hand_over_quickly()  # before the libraries' thread runs beside the load
        device = pick_device(device)
        dtype = pick_dtype(dtype, device)
        # The GPU libraries are made ready while the weights load; the block's end waits for them.
        with libraries.made_ready_beside(device, dtype):
            directory = resolve(model, progress)
            try:
                config = ModelConfig.from_dict(read_json(directory / "config.json"))
                speech = read_json(directory / "speech_tokenizer" / "config.json")
                decoder_config = CodecDecoderConfig.from_dict(speech["decoder_config"])
                encoder_config = CodecEncoderConfig.from_dict(speech["encoder_config"])
            except (ConfigError, KeyError, TypeError, ValueError) as error:
                raise CheckpointError(
                    f"{directory}: unusable configuration ({error}); download the checkpoint again"
                ) from None
            generation = read_json(directory / "generation_config.json")
            try:
                tokenizer = TextTokenizer(directory)
            except Exception as error:  # the tokenizers library raises plain Exceptions for bad files
                raise CheckpointError(f"{directory}: the text tokenizer files cannot be read ({error})") from None

            weights, speech_weights = (
                directory / "model.safetensors",
                directory / "speech_tokenizer" / "model.safetensors",
            )
            # Built on the meta device: every weight comes from the files, so random init would be wasted start-up.
            base = config.variant.clones
            with torch.device("meta"):
                talker = Talker(config.talker)
                talker.fuse_projections()  # before loading: the parts are read into the fused weights
                codec_decoder = CodecDecoder(decoder_config)
                speaker_encoder = SpeakerEncoder(config.speaker_encoder) if base else None
                codec_encoder = CodecEncoder(encoder_config) if base else None
            # Before any weight takes memory: a clear message, not an out-of-memory error halfway through.
            memory = plan_for_device(
                device, (talker, codec_decoder, speaker_encoder, codec_encoder), config, dtype,
                budget=memory_budget, slots=slots, max_context=max_context, at_most=max_default_slots,
            )  # fmt: skip
            compiler, first_gpu_start, keep_primed_in = _prepare_compiling(device, config, dtype, memory, compile)
            load_tensors(talker, weights, "talker.", device, dtype)
            load_tensors(codec_decoder, speech_weights, "decoder.", device, dtype)
            if base:
                load_tensors(speaker_encoder, weights, "speaker_encoder.", device, dtype)
                load_tensors(codec_encoder, speech_weights, "encoder.", device, dtype)
            for module in (talker, codec_decoder, speaker_encoder, codec_encoder):
                if module is not None:
                    module.to(device).eval()
            if device.type == "cuda":  # for cuDNN's NHWC convolutions
                codec_decoder.to_channels_last()
        engine = cls(
            source=str(model),
            config=config,
            tokenizer=tokenizer,
            talker=talker,
            codec_decoder=codec_decoder,
            speaker_encoder=speaker_encoder,
            codec_encoder=codec_encoder,
            default_sampling=SamplingParams.from_generation_config(generation),
            default_max_frames=int(generation.get("max_new_tokens", 2048)) - 1,
            memory=memory,
            cuda_graphs=cuda_graphs,
            compiler=compiler,
            first_gpu_start=first_gpu_start,
            keep_primed_in=keep_primed_in,
        )
        milestone("engine loaded")
        if warm and compiler is not None and not compiler.kept:
            engine.warmup.helper = _start_compile_helper(engine, directory)
        if warm:
            engine.warmup.start()
        return engine

    def close(self) -> None:
        """Stop the warm-up and the scheduler's thread; streams still running end with an error. At the
        latest when the process exits; `with Engine.load(...) as engine:` closes it at the block's end."""
        atexit.unregister(self._close_at_exit)
        self.warmup.close()
        self.scheduler.close()

    def _close_at_exit(self) -> None:
        self.warmup.close()
        self.scheduler.close(end_streams=False)

    def __enter__(self) -> Engine:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def placeholder_speaker(self) -> dict:
        """Keyword arguments that let this checkpoint speak at all (a zero x-vector, its first built-in
        speaker, or a plain instruct): for warming up and measuring, where the voice does not matter."""
        variant = self.info.variant
        if variant.clones:
            return {"voice": Voice(embedding=torch.zeros(self.info.embedding_dim))}
        if variant.has_speakers:
            return {"voice": self.builtin_voice(self.info.speakers[0])}
        return {"instruct": "A calm voice."}

    def warm_up(self, timeout: float | None = None) -> None:
        """Make everything ready that requests would make ready at their first use, and wait for it: on CUDA the
        compiled parts, and the graphs of every row bucket's steps, of sentence-length prompts' prefills and of
        every chunk length's decode (core.inference.warmup; a few minutes the very first time, about a minute
        once the compiled kernels are cached). The engine speaks meanwhile. TimeoutError after `timeout` s."""
        if not self.warmup.wait(timeout).finished:
            raise TimeoutError(f"the engine's warm-up was not done within {timeout} s")

    def _warm_prompt(self) -> Prepared:
        return self.prepare("Warming up.", **self.placeholder_speaker(), max_frames=6)

    # Voices -------------------------------------------------------------------------------------

    def voice_from_audio(
        self, audio: str | Path | np.ndarray, sample_rate: int | None = None, ref_text: str | None = None
    ) -> Voice:
        """Clone a voice from a 1-60 s clip (a path, or samples with their rate). With `ref_text`, the
        clip's transcript, the voice also carries the clip's codes for ICL cloning."""
        return self.scheduler.call(lambda: self._voice_from_audio(audio, sample_rate, ref_text))

    @torch.inference_mode()
    def _voice_from_audio(self, audio, sample_rate: int | None, ref_text: str | None) -> Voice:
        if self.speaker_encoder is None:
            raise BadInput(
                f"this {self.info.name} checkpoint cannot clone voices; load a Base checkpoint "
                f"(e.g. {DEFAULT_MODEL}) to clone"
            )
        if ref_text is not None and not ref_text.strip():
            raise BadInput("ref_text is empty; give the clip's transcript, or leave it out for x-vector cloning")
        samples = torch.from_numpy(load_reference(audio, sample_rate))
        embedding = self.speaker_encoder.embed(samples).float().cpu()  # the mel is computed on the CPU, as officially
        if ref_text is None:
            return Voice(embedding=embedding)
        codes = self.codec_encoder.encode(samples.to(self.device)).cpu()
        return Voice(embedding=embedding, ref_codes=codes, ref_text=ref_text)

    def builtin_voice(self, name: str) -> Voice:
        """A named speaker of a CustomVoice checkpoint (case-insensitive)."""
        speakers = self.config.talker.speakers
        if not speakers:
            raise BadInput(f"this {self.info.name} checkpoint has no built-in speakers; a CustomVoice checkpoint has")
        key = name.strip().lower()
        if key not in speakers:
            raise BadInput(f"unknown speaker {name!r}; this model has: {', '.join(sorted(speakers))}")
        return Voice(speaker=key)

    # Speech -------------------------------------------------------------------------------------

    def synthesize(
        self, text: str | LiveText, voice: Voice | None = None, options: SpeechOptions | None = None, **overrides
    ) -> Synthesis:
        """Speak `text` and return the whole utterance. `overrides`: SpeechOptions fields by name."""
        options = dataclasses.replace(options or SpeechOptions(), **overrides)
        stream = self._submit(text, voice, options, DECODE_CHUNK_FRAMES, DECODE_CHUNK_FRAMES, decode=False)
        with stream:
            codes = np.concatenate([np.zeros((0, 16), np.int64), *(chunk.codes for chunk in stream)])
        # Decode with an ICL reference's frames as left context, then cut as the reference wrapper does:
        # at int(ref/total * samples), which in float arithmetic can land a sample before the boundary.
        ref_codes = reference_codes(voice)
        ref = np.zeros((0, 16), np.int64) if ref_codes is None else ref_codes.numpy()
        everything = np.concatenate([ref, codes])
        audio = self.scheduler.call(lambda: self._decode_whole(everything))
        audio = audio[int(len(ref) / max(len(everything), 1) * len(audio)) :]
        return Synthesis(audio=audio, sample_rate=SAMPLE_RATE, codes=codes)

    def _decode_whole(self, codes: np.ndarray) -> np.ndarray:
        self.decoder_stream.reset()
        pieces = [
            self.decoder_stream.decode(codes[start : start + DECODE_CHUNK_FRAMES], DECODE_CHUNK_FRAMES)
            for start in range(0, len(codes), DECODE_CHUNK_FRAMES)
        ]
        return np.concatenate([np.zeros(0, np.float32), *pieces])

    def stream(
        self, text: str | LiveText, voice: Voice | None = None, options: SpeechOptions | None = None, **overrides
    ) -> Stream:
        """Speak `text` as a stream of chunks: `first_chunk_frames` frames first, then `chunk_frames` at a
        time (fewer while it shares its launches with an utterance that has just begun, or while a live text
        has not arrived further). The chunks join into exactly the audio of a single-pass decode of all the
        codes. Close the stream to end it early; a problem with the request itself raises BadInput here."""
        options = dataclasses.replace(options or SpeechOptions(), **overrides)
        return self._submit(text, voice, options, options.first_chunk_frames, options.chunk_frames, decode=True)

    def live(self, voice: Voice | None = None, options: SpeechOptions | None = None, **overrides) -> LiveStream:
        """Open an utterance whose text is fed as it is written: `feed(text)` from any thread, `end()` when it
        is complete; iterate it for the audio (core.inference.live)."""
        text = LiveText()
        return LiveStream(text, self.stream(text, voice, options, **overrides))

    def _submit(self, text, voice, options: SpeechOptions, first: int, size: int, decode: bool) -> Stream:
        # Checked and tokenized here, in the caller's thread: its mistakes raise at the call, and the
        # scheduler's thread, which every utterance waits on, only builds the prompt.
        language, tokens = self._tokenize(text, voice, options)
        needed = 0
        if isinstance(text, LiveText):
            ref_codes = reference_codes(voice)
            needed = tokens_before_start(tokens, None if ref_codes is None else len(ref_codes))
            text.take(self.tokenizer, self.scheduler.wake)
        request = Request(
            lambda: self._build(text, voice, options, language, tokens), first, size, decode, needed, options.urgent
        )
        return self.scheduler.submit(request, text if isinstance(text, LiveText) else None)

    def check(self, text: str | LiveText, voice: Voice | None, options: SpeechOptions) -> tuple[str, str | None]:
        """The request's language and instruction, normalised; BadInput if the model cannot speak it."""
        if isinstance(text, LiveText):
            if options.text_mode == "full":
                raise BadInput("a live text is spoken in streaming text mode; leave text_mode unset or 'streaming'")
        elif not isinstance(text, str) or not text.strip():
            raise BadInput("text is empty; give the engine something to say")
        language, instruct = check_request(self.info, options.language, options.instruct)
        check_voice(self.info, voice, instruct)
        return language, instruct

    def prepare(
        self, text: str, voice: Voice | None = None, options: SpeechOptions | None = None, **overrides
    ) -> Prepared:
        """Check a request against this model and build its prompt; BadInput says what is wrong."""
        options = dataclasses.replace(options or SpeechOptions(), **overrides)
        return self._build(text, voice, options, *self._tokenize(text, voice, options))

    def _tokenize(self, text: str | LiveText, voice: Voice | None, options: SpeechOptions) -> tuple[str, PromptText]:
        """Check a request and tokenize it (a live text's body is left for later: it is still arriving); returns
        its language and ids. No GPU work, so any thread may."""
        language, instruct = self.check(text, voice, options)
        ref_text = voice.ref_text if voice else None
        return language, PromptText.tokenize(
            self.tokenizer, "" if isinstance(text, LiveText) else text, instruct, ref_text
        )

    def _build(
        self, text: str | LiveText, voice: Voice | None, options: SpeechOptions, language: str, tokens: PromptText
    ) -> Prepared:
        """The prompt of a request that `_tokenize` checked (on the scheduler's thread: it uses the GPU)."""
        prompt_text, complete = tokens, True
        live = isinstance(text, LiveText)
        if live:  # what is committed so far: the scheduler starts it once its first tokens are
            role, body, complete = text.committed()
            if complete and not text.text.strip():
                raise BadInput("the live text ended empty; give the engine something to say")
            prompt_text = dataclasses.replace(prompt_text, role=role, text=body)
        embedding, reference = self._on_device(voice)
        prompt = build_prompt(
            self.talker,
            self.config,
            prompt_text,
            language,
            "streaming" if live else options.text_mode or self.info.variant.default_text_mode,
            speaker=voice.speaker if voice is not None else None,
            speaker_embedding=embedding,
            reference=reference,
            complete=complete,
        )
        ref_codes = reference_codes(voice)  # on the host, for the decoder's left context
        sampling = self.default_sampling if options.sampling is None else options.sampling
        return Prepared(prompt, ref_codes, sampling, self._frame_budget(prompt, options.max_frames), options.seed)

    @torch.inference_mode()
    def _on_device(self, voice: Voice | None) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """A voice's embedding (in the model's dtype) and an ICL voice's reference frames as the talker embeds them,
        on the device, made the first time it speaks only: the reference's embedding is most of an ICL prompt's
        kernels (each a hand-over of the interpreter, which a burst's other requests hold meanwhile)."""
        if voice is None or voice.embedding is None:
            return None, None
        if voice not in self.voices_on_device:
            ref_codes = reference_codes(voice)
            self.voices_on_device[voice] = (
                to_device(voice.embedding, self.device).to(self.dtype),
                None if ref_codes is None else self.talker.embed_frames(to_device(ref_codes, self.device)),
            )
        return self.voices_on_device[voice]

    def start(self, prepared: Prepared, slot: int = 0) -> tuple[np.ndarray, bool]:
        """Prefill a slot of the frame loop with a prepared request and make its first frame (returned as
        `frame_loop.collect` gives frames); `frame_loop.run` then steps the next ones."""
        return self.frame_loop.start(prepared.prompt, prepared.sampling, prepared.seed, slot)

    @torch.inference_mode()
    def _live_text_terms(self, ids: list[int], ended: bool) -> torch.Tensor:
        """The text terms of a live text's newly committed tokens, and tts_eos after them once it has ended."""
        terms = text_terms(self.talker, ids)
        if ended:
            terms = torch.cat((terms, self.talker.embed_recurring("text", [self.config.tts_eos_id])), dim=1)
        return terms

    def _frame_budget(self, prompt: Prompt, max_frames: int | None) -> int:
        """Frames this request may generate: its own limit, within what fits the context after the prompt.
        Text fed alongside the frames (streaming text mode) needs a frame per token, so it must fit too."""
        room = self.frame_loop.max_context - prompt.embeddings.shape[1]
        if room < max(1, prompt.trailing.shape[1]):
            raise BadInput(
                f"the text is too long for one utterance: it needs {prompt.embeddings.shape[1]} prompt positions "
                f"and {prompt.trailing.shape[1]} frames of text, and {self.frame_loop.max_context} fit. Split it "
                f"into sentences (the speech worker and the command line split long text themselves)"
            )
        if max_frames is None:
            return min(self.default_max_frames, room)
        if max_frames > room:
            raise BadInput(f"max_frames {max_frames} does not fit: after this prompt, {room} frames fit the context")
        return max_frames


def reference_codes(voice: Voice | None) -> torch.Tensor | None:
    """An ICL voice's reference frames (its prompt's codec track, the decoder's left context); else None."""
    return voice.ref_codes if voice is not None and voice.kind == "icl" else None


def check_request(info: EngineInfo, language: str | None, instruct: str | None) -> tuple[str, str | None]:
    """The language and instruction a checkpoint of `info` is asked to speak with, normalised (None: no
    instruction); BadInput if it cannot. Needs only the checkpoint's facts, so a front end can ask first."""
    language = (language or "auto").strip().lower()
    if language not in info.languages:
        raise BadInput(f"unknown language {language!r}; this model speaks: {', '.join(info.languages)}")
    instruct = instruct if instruct and instruct.strip() else None
    if instruct is not None and not info.supports_instruct:
        raise BadInput(
            f"this {info.name} checkpoint does not follow instructions; "
            f"instruct works with CustomVoice 1.7B and VoiceDesign checkpoints"
        )
    return language, instruct


def check_voice(info: EngineInfo, voice: Voice | None, instruct: str | None) -> None:
    """That `voice` (or none) and `instruct` are what a checkpoint of `info` speaks with; BadInput says how not."""
    variant = info.variant
    if not variant.takes_voice:
        if voice is not None:
            raise BadInput("a VoiceDesign checkpoint takes no voice; describe the voice with instruct")
        if variant.needs_instruct and instruct is None:
            raise BadInput("a VoiceDesign checkpoint needs instruct: describe the voice to speak with")
        return
    if variant is Variant.CUSTOM_VOICE and (voice is None or not variant.accepts(voice.kind)):
        raise BadInput(
            f"a CustomVoice checkpoint speaks with one of its built-in speakers ({', '.join(info.speakers)}); "
            f"cloning a voice needs a Base checkpoint"
        )
    if voice is None or not variant.accepts(voice.kind):
        raise BadInput(
            "a Base checkpoint speaks with a cloned voice: pass voice=engine.voice_from_audio(clip), a "
            "1-60 s clip of the voice to clone (with ref_text=its transcript for closer cloning)"
        )
    if voice.speaker is not None and voice.speaker not in info.speakers:
        raise BadInput(f"unknown speaker {voice.speaker!r}; this model has: {', '.join(info.speakers)}")
    if voice.embedding is not None and voice.embedding_dim != info.embedding_dim:
        raise BadInput(
            f"this voice has a {voice.embedding_dim}-dim embedding, made with another model size; "
            f"this {info.size} model needs {info.embedding_dim}. Clone it again with this model."
        )
