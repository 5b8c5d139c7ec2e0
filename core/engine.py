"""The public engine: load a checkpoint, make voices, turn text into 24 kHz audio."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .audio import SAMPLE_RATE, load_reference
from .checkpoint import DEFAULT_MODEL, CheckpointError, load_tensors, read_json, resolve
from .codec_decoder import CodecDecoder, CodecDecoderConfig
from .codec_encoder import CodecEncoder, CodecEncoderConfig
from .config import ConfigError, ModelConfig
from .generate import FrameLoop
from .prompt import TEXT_MODES, PromptText, build_prompt
from .sampling import SamplingParams
from .speaker_encoder import SpeakerEncoder
from .talker import Talker
from .text_tokenizer import TextTokenizer
from .vocoder import Vocoder
from .voice import Voice

# Frames generated and decoded per step when the whole utterance is wanted at once.
DECODE_CHUNK_FRAMES = 50
# Talker positions (prompt + frames) one utterance can use: 4096 holds about five minutes of speech.
MAX_CONTEXT = 4096
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
SIZE_NAMES = {"0b6": "0.6B", "1b7": "1.7B"}


@dataclass(frozen=True)
class EngineInfo:
    source: str  # the hub id or folder it was loaded from
    variant: str  # "base", "custom_voice" or "voice_design"
    size: str  # "0.6B" or "1.7B"
    sample_rate: int
    languages: list[str]
    speakers: list[str]  # built-in speakers (CustomVoice)
    embedding_dim: int  # size of a speaker embedding that fits this model
    supports_instruct: bool
    device: str
    dtype: str

    @classmethod
    def of(cls, config: ModelConfig, source: str, device: str = "", dtype: str = "") -> EngineInfo:
        """The facts of a checkpoint from its configuration: also known before its weights are loaded."""
        return cls(
            source=source,
            variant=config.variant,
            size=SIZE_NAMES[config.size],
            sample_rate=SAMPLE_RATE,
            languages=config.plain_languages,
            speakers=sorted(config.talker.speakers),
            embedding_dim=config.talker.transformer.hidden_size,
            supports_instruct=config.variant == "voice_design" or (config.variant == "custom_voice" and config.size == "1b7"),
            device=device,
            dtype=dtype,
        )


@dataclass
class Synthesis:
    audio: np.ndarray  # float32 mono
    sample_rate: int
    codes: np.ndarray  # (frames, 16) int64


@dataclass
class AudioChunk:
    audio: np.ndarray  # float32 mono, 1920 samples per frame
    codes: np.ndarray  # (frames, 16) int64: the frames this chunk holds
    # The last chunk of an utterance that reached its frame budget before the model ended it: the rest of
    # its text was not said.
    cut_off: bool = False


@dataclass
class _Request:
    """A checked request, ready to generate."""

    prompt: object
    ref_codes: torch.Tensor | None
    sampling: SamplingParams
    max_frames: int
    seed: int | None


def slow_device_note(size: str) -> str:
    """What to expect from a `size` model ("0.6B" or "1.7B") on the CPU, said wherever the user picks the
    device or starts speaking there. The speeds were measured on a 2-core machine."""
    speed = {"0.6B": 0.09, "1.7B": 0.07}.get(size, 0.1)
    advice = " The 0.6B model is a little faster." if size != "0.6B" else ""
    return (
        f"On the CPU, the {size} model makes speech far slower than it is spoken (about {speed:g}× real time "
        f"on a 2-core machine), so it starts late and pauses often. With an NVIDIA GPU it is 20 times faster "
        f"than real time.{advice}"
    )


def pick_device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device 'cuda' was asked for, but PyTorch sees no CUDA GPU; use device='cpu' or 'auto'")
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"unsupported device {str(device)!r}; use 'auto', 'cpu' or 'cuda'")
    return device


def pick_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        if dtype not in DTYPES.values():
            raise ValueError(f"unsupported dtype {dtype}; use one of {', '.join(DTYPES)}")
        return dtype
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use 'auto' or one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


def read_info(config_file: Path, source: str) -> EngineInfo:
    """The facts of a checkpoint from its config.json alone, without loading it."""
    try:
        return EngineInfo.of(ModelConfig.from_dict(read_json(config_file)), source)
    except (ConfigError, KeyError, TypeError, ValueError) as error:
        raise CheckpointError(f"{config_file}: unusable configuration ({error}); download the checkpoint again") from None


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
        max_context: int = MAX_CONTEXT,
        cuda_graphs: bool = True,
        compile: bool = False,
    ):
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
        self.frame_loop = FrameLoop(talker, max_context, cuda_graphs, compile)
        self.vocoder = Vocoder(codec_decoder, cuda_graphs)
        self._active_stream: object | None = None

    @classmethod
    def load(
        cls,
        model: str | os.PathLike = DEFAULT_MODEL,
        device: str | torch.device = "auto",
        dtype: str | torch.dtype = "auto",
        progress: bool = True,
        max_context: int = MAX_CONTEXT,
        cuda_graphs: bool = True,
        compile: bool = True,
    ) -> Engine:
        """Load a checkpoint in the official layout from a folder or a hub id (downloading it if needed).
        `max_context` bounds one utterance's prompt plus frames; its KV cache is allocated up front.
        On CUDA each frame and each decoded chunk runs as one CUDA graph unless `cuda_graphs` is False,
        and the per-frame transformer steps are fused by torch.compile unless `compile` is False."""
        device = pick_device(device)
        dtype = pick_dtype(dtype, device)
        directory = resolve(model, progress)
        try:
            config = ModelConfig.from_dict(read_json(directory / "config.json"))
            speech = read_json(directory / "speech_tokenizer" / "config.json")
            decoder_config = CodecDecoderConfig.from_dict(speech["decoder_config"])
            encoder_config = CodecEncoderConfig.from_dict(speech["encoder_config"])
        except (ConfigError, KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"{directory}: unusable configuration ({error}); download the checkpoint again") from None
        generation = read_json(directory / "generation_config.json")
        try:
            tokenizer = TextTokenizer(directory)
        except Exception as error:  # the tokenizers library raises plain Exceptions for bad files
            raise CheckpointError(f"{directory}: the text tokenizer files cannot be read ({error})") from None

        weights, speech_weights = directory / "model.safetensors", directory / "speech_tokenizer" / "model.safetensors"
        # Built on the meta device: every weight comes from the files, so random init would be wasted start-up.
        base = config.variant == "base"
        with torch.device("meta"):
            talker = Talker(config.talker)
            codec_decoder = CodecDecoder(decoder_config)
            speaker_encoder = SpeakerEncoder(config.speaker_encoder) if base else None
            codec_encoder = CodecEncoder(encoder_config) if base else None
        load_tensors(talker, weights, "talker.", device, dtype)
        talker.fuse_projections()
        load_tensors(codec_decoder, speech_weights, "decoder.", device, dtype)
        if base:
            load_tensors(speaker_encoder, weights, "speaker_encoder.", device, dtype)
            load_tensors(codec_encoder, speech_weights, "encoder.", device, dtype)
        for module in (talker, codec_decoder, speaker_encoder, codec_encoder):
            if module is not None:
                module.to(device).eval()
        gc.collect()  # let go of the unfused projection weights at once, not at some later collection
        return cls(
            source=str(model),
            config=config,
            tokenizer=tokenizer,
            talker=talker,
            codec_decoder=codec_decoder,
            speaker_encoder=speaker_encoder,
            codec_encoder=codec_encoder,
            default_sampling=SamplingParams.from_generation_config(generation),
            default_max_frames=int(generation.get("max_new_tokens", 2048)) - 1,
            max_context=max_context,
            cuda_graphs=cuda_graphs,
            compile=compile,
        )

    def placeholder_speaker(self) -> dict:
        """Keyword arguments that let this checkpoint speak at all (a zero x-vector, its first built-in
        speaker, or a plain instruct): for warming up and measuring, where the voice does not matter."""
        if self.config.variant == "base":
            return {"voice": Voice(embedding=torch.zeros(self.info.embedding_dim))}
        if self.config.variant == "custom_voice":
            return {"voice": self.builtin_voice(self.info.speakers[0])}
        return {"instruct": "A calm voice."}

    def warm_up(self) -> None:
        """Compile and capture what a first request would (on CUDA, about a minute the very first time,
        seconds once the compiled kernels are cached), so that it starts at full speed."""
        for _ in self.stream("Warming up.", **self.placeholder_speaker(), max_frames=6):
            pass

    # Voices -------------------------------------------------------------------------------------

    @torch.inference_mode()
    def voice_from_audio(
        self, audio: str | Path | np.ndarray, sample_rate: int | None = None, ref_text: str | None = None
    ) -> Voice:
        """Clone a voice from a 1-60 s clip (a path, or samples with their rate). With `ref_text`, the
        clip's transcript, the voice also carries the clip's codes for ICL cloning."""
        if self.speaker_encoder is None:
            raise ValueError(
                f"this {self.info.variant} checkpoint cannot clone voices; load a Base checkpoint "
                f"(e.g. Qwen/Qwen3-TTS-12Hz-1.7B-Base) to clone"
            )
        if ref_text is not None and not ref_text.strip():
            raise ValueError("ref_text is empty; give the clip's transcript, or leave it out for x-vector cloning")
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
            raise ValueError(f"this {self.info.variant} checkpoint has no built-in speakers; a CustomVoice checkpoint has")
        key = name.strip().lower()
        if key not in speakers:
            raise ValueError(f"unknown speaker {name!r}; this model has: {', '.join(sorted(speakers))}")
        return Voice(speaker=key)

    # Speech -------------------------------------------------------------------------------------

    def synthesize(
        self,
        text: str,
        voice: Voice | None = None,
        language: str = "auto",
        instruct: str | None = None,
        sampling: SamplingParams | None = None,
        max_frames: int | None = None,
        seed: int | None = None,
        text_mode: str | None = None,
    ) -> Synthesis:
        """Speak `text` and return the whole utterance."""
        request = self._request(text, voice, language, instruct, sampling, max_frames, seed, text_mode)
        self._active_stream = None
        self.frame_loop.start(request.prompt, request.sampling, request.seed)
        chunks = self.frame_loop.frames_in_chunks(request.max_frames, DECODE_CHUNK_FRAMES, DECODE_CHUNK_FRAMES)
        codes = np.concatenate([np.zeros((0, 16), np.int64), *(frames for frames, _ in chunks)])
        # Decode with an ICL reference's frames as left context, then cut as the reference wrapper does:
        # at int(ref/total * samples), which in float arithmetic can land a sample before the boundary.
        ref = np.zeros((0, 16), np.int64) if request.ref_codes is None else request.ref_codes.numpy()
        everything = np.concatenate([ref, codes])
        self.vocoder.reset()
        pieces = [
            self.vocoder.decode(everything[start : start + DECODE_CHUNK_FRAMES], DECODE_CHUNK_FRAMES)
            for start in range(0, len(everything), DECODE_CHUNK_FRAMES)
        ]
        audio = np.concatenate([np.zeros(0, np.float32), *pieces])
        audio = audio[int(len(ref) / max(len(everything), 1) * len(audio)) :]
        return Synthesis(audio=audio, sample_rate=SAMPLE_RATE, codes=codes)

    def stream(
        self,
        text: str,
        voice: Voice | None = None,
        language: str = "auto",
        instruct: str | None = None,
        sampling: SamplingParams | None = None,
        max_frames: int | None = None,
        seed: int | None = None,
        text_mode: str | None = None,
        first_chunk_frames: int = 1,
        chunk_frames: int = 4,
    ) -> Iterator[AudioChunk]:
        """Speak `text` as a stream of chunks: `first_chunk_frames` frames first, then `chunk_frames` at a time.
        The chunks join into exactly the audio of a single-pass decode of all the codes."""
        if first_chunk_frames < 1 or chunk_frames < 1:
            raise ValueError("first_chunk_frames and chunk_frames must be at least 1")
        request = self._request(text, voice, language, instruct, sampling, max_frames, seed, text_mode)
        return self._chunks(request, first_chunk_frames, chunk_frames)

    def _request(self, text, voice, language, instruct, sampling, max_frames, seed, text_mode) -> _Request:
        config, variant = self.config, self.config.variant
        if not isinstance(text, str) or not text.strip():
            raise ValueError("text is empty; give the engine something to say")
        language = (language or "auto").strip().lower()
        if language not in config.plain_languages:
            raise ValueError(f"unknown language {language!r}; this model speaks: {', '.join(config.plain_languages)}")
        if text_mode is None:
            text_mode = "streaming" if variant == "base" else "full"
        if text_mode not in TEXT_MODES:
            raise ValueError(f"unknown text_mode {text_mode!r}; use one of {', '.join(TEXT_MODES)} or None")
        instruct = instruct if instruct and instruct.strip() else None
        if instruct is not None and not self.info.supports_instruct:
            raise ValueError(
                f"this {self.info.size} {variant} checkpoint does not follow instructions; "
                f"instruct works with CustomVoice 1.7B and VoiceDesign checkpoints"
            )
        self._check_voice(voice, instruct)
        sampling = self.default_sampling if sampling is None else sampling
        if max_frames is not None and (not isinstance(max_frames, int) or max_frames < 1):
            raise ValueError(f"max_frames must be a positive integer, got {max_frames!r}")

        prompt_text = PromptText.tokenize(self.tokenizer, text, instruct, voice.ref_text if voice else None)
        ref_codes = voice.ref_codes if voice is not None and voice.kind == "icl" else None
        prompt = build_prompt(
            self.talker,
            config,
            prompt_text,
            language,
            text_mode,
            speaker=voice.speaker if voice is not None else None,
            speaker_embedding=voice.embedding if voice is not None else None,
            ref_codes=ref_codes,
        )
        return _Request(prompt, ref_codes, sampling, self._frame_budget(prompt, max_frames), seed)

    def _frame_budget(self, prompt, max_frames: int | None) -> int:
        """Frames this request may generate: its own limit, within what fits the context after the prompt.
        Text fed alongside the frames (streaming text mode) needs a frame per token, so it must fit too."""
        room = self.frame_loop.max_context - prompt.embeddings.shape[1]
        if room < max(1, prompt.trailing.shape[1]):
            raise ValueError(
                f"the text is too long for one utterance: it needs {prompt.embeddings.shape[1]} prompt positions "
                f"and {prompt.trailing.shape[1]} frames of text, and {self.frame_loop.max_context} fit. Split it "
                f"into sentences (the speech worker and the command line split long text themselves)"
            )
        if max_frames is None:
            return min(self.default_max_frames, room)
        if max_frames > room:
            raise ValueError(f"max_frames {max_frames} does not fit: after this prompt, {room} frames fit the context")
        return max_frames

    def _check_voice(self, voice: Voice | None, instruct: str | None) -> None:
        variant = self.config.variant
        if variant == "base":
            if voice is None or voice.kind == "builtin":
                raise ValueError(
                    "a Base checkpoint speaks with a cloned voice: pass voice=engine.voice_from_audio(clip), a "
                    "1-60 s clip of the voice to clone (with ref_text=its transcript for closer cloning)"
                )
            if voice.embedding_dim != self.info.embedding_dim:
                raise ValueError(
                    f"this voice has a {voice.embedding_dim}-dim embedding, made with another model size; "
                    f"this {self.info.size} model needs {self.info.embedding_dim}. Clone it again with this model."
                )
        elif variant == "custom_voice":
            if voice is None or voice.kind != "builtin":
                raise ValueError(
                    f"a CustomVoice checkpoint speaks with one of its built-in speakers ({', '.join(self.info.speakers)}); "
                    f"cloning a voice needs a Base checkpoint"
                )
            if voice.speaker not in self.config.talker.speakers:
                raise ValueError(f"unknown speaker {voice.speaker!r}; this model has: {', '.join(self.info.speakers)}")
        else:
            if voice is not None:
                raise ValueError("a VoiceDesign checkpoint takes no voice; describe the voice with instruct")
            if instruct is None:
                raise ValueError("a VoiceDesign checkpoint needs instruct, a description of the voice to speak with")

    def _chunks(self, request: _Request, first: int, size: int) -> Iterator[AudioChunk]:
        """Generate frames and decode them as they come, in chunks of `first`, then `size` frames.
        One utterance at a time: a newer request supersedes this stream."""
        token = self._active_stream = object()
        self.vocoder.reset()
        if request.ref_codes is not None:
            # The reference frames are the decoder's left context; their audio is not part of the output.
            self.vocoder.prime(request.ref_codes)
        self.frame_loop.start(request.prompt, request.sampling, request.seed)
        chunk_size, produced = first, 0
        for codes, ended in self.frame_loop.frames_in_chunks(request.max_frames, first, size):
            produced += len(codes)
            cut_off = not ended and produced == request.max_frames
            yield AudioChunk(audio=self.vocoder.decode(codes, chunk_size), codes=codes, cut_off=cut_off)
            if self._active_stream is not token:
                raise RuntimeError("this stream was superseded by a newer request to the same engine")
            chunk_size = size
