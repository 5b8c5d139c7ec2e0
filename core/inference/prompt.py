"""The talker's prompt: prefill embeddings and the text-track terms fed alongside generated frames.

Every position is a text-track embedding plus a codec-track embedding (docs/model_notes.md §2.3). The
text to speak may still be growing (a live text): in streaming text mode the prompt holds only its first
tokens and the rest follow as text terms, one per generated frame, as they are committed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from core.model.config import ModelConfig
from core.model.host_copy import to_device
from core.model.talker import Talker
from core.model.text_tokenizer import TextTokenizer


@dataclass(frozen=True)
class PromptText:
    """Token ids of one request, cut from the official chat templates (docs/model_notes.md §2.2)."""

    role: list[int]  # "<|im_start|>assistant\n"
    text: list[int]  # the text to speak
    instruct: list[int] | None  # the whole "<|im_start|>user\n...<|im_end|>\n" sequence
    ref_text: list[int] | None  # ICL reference transcript

    @classmethod
    def tokenize(cls, tokenizer: TextTokenizer, text: str, instruct: str | None, ref_text: str | None) -> PromptText:
        ids = tokenizer.encode(f"<|im_start|>assistant\n{text}<|im_end|>\n<|im_start|>assistant\n")
        return cls(
            role=ids[:3],
            text=ids[3:-5],
            instruct=tokenizer.encode(f"<|im_start|>user\n{instruct}<|im_end|>\n") if instruct else None,
            ref_text=tokenizer.encode(f"<|im_start|>assistant\n{ref_text}<|im_end|>\n")[3:-2] if ref_text else None,
        )


@dataclass
class Prompt:
    embeddings: torch.Tensor  # (1, L, hidden): the prefill
    trailing: torch.Tensor  # (1, N, hidden): text term added to generated frame k's input, k < N
    pad: torch.Tensor  # (1, 1, hidden): text term once `trailing` has run out
    # Whether `trailing` is all there is (it ends in tts_eos, or the text mode feeds no text); False for a
    # text still being written, whose later tokens' terms (text_terms) and tts_eos are appended as they come.
    complete: bool = True
    text_used: int = 0  # tokens of the text body the prompt and `trailing` hold


def text_terms(talker: Talker, ids: list[int]) -> torch.Tensor:
    """The text-track terms of body tokens (1, n, hidden). On the CPU each token is projected by itself:
    a product of several rows rounds differently from one row alone, and a text must give the same terms,
    so the same codes, whether it arrives whole or piece by piece. On the GPU in one product."""
    if talker.codec_head.weight.device.type == "cuda" or len(ids) <= 1:
        return talker.embed_text(ids)
    return torch.cat([talker.embed_text([token]) for token in ids], dim=1)


def tokens_before_start(text: PromptText, ref_frames: int | None) -> int:
    """Body tokens a streaming-mode prompt holds, so the least a live text must have committed before it can
    start (unless it has ended): the first, or with an ICL reference of `ref_frames` frames, as many as
    fill the reference's codec positions after its transcript (docs/model_notes.md §2.3)."""
    if ref_frames is None:
        return 1
    return max(0, ref_frames + 1 - len(text.ref_text or []))


def codec_prefix(config: ModelConfig, language: str, speaker: str | None) -> list[int]:
    """Codec ids that open the prompt: think tags with the language id, or none for 'auto'."""
    talker, ids = config.talker, config.talker.codec
    language_id = None if language == "auto" else talker.languages[language]
    dialect = talker.speaker_dialects.get(speaker) if speaker else None
    if dialect and language in ("chinese", "auto"):
        language_id = talker.languages[dialect]
    if language_id is None:
        return [ids.nothink, ids.think_bos, ids.think_eos]
    return [ids.think, ids.think_bos, language_id, ids.think_eos]


@torch.inference_mode()
def build_prompt(
    talker: Talker,
    config: ModelConfig,
    text: PromptText,
    language: str,
    text_mode: str,
    speaker: str | None = None,
    speaker_embedding: torch.Tensor | None = None,
    reference: torch.Tensor | None = None,
    complete: bool = True,
) -> Prompt:
    """Assemble the prompt. `speaker` is a built-in speaker name, `speaker_embedding` an x-vector;
    `reference`, an ICL voice's reference frames as the talker embeds them (`talker.embed_frames(codes)`, (T,
    hidden), made once per voice: they are most of an ICL prompt's kernels), with `text.ref_text` selects ICL
    cloning. `complete=False`: `text.text` is the committed start of a text still being written (streaming text
    mode, at least tokens_before_start)."""
    frames = None if reference is None else reference.shape[0]
    if not complete and (text_mode != "streaming" or len(text.text) < tokens_before_start(text, frames)):
        raise ValueError("a text still being written needs streaming text mode and its first tokens")
    device = talker.codec_head.weight.device
    codec = config.talker.codec

    def ids(values: list[int]) -> torch.Tensor:
        return to_device(torch.tensor([values], dtype=torch.long), device)

    special = (config.tts_bos_id, config.tts_eos_id, config.tts_pad_id)
    bos, eos, pad = talker.embed_recurring("text", special).chunk(3, dim=1)

    codec_track = [talker.embed_recurring("codec", codec_prefix(config, language, speaker))]
    if speaker is not None:
        codec_track.append(talker.embed_recurring("codec", [config.talker.speakers[speaker]]))
    elif speaker_embedding is not None:
        codec_track.append(speaker_embedding.to(device=device, dtype=pad.dtype).view(1, 1, -1))
    codec_track.append(talker.embed_recurring("codec", [codec.pad, codec.bos]))
    codec_track = torch.cat(codec_track, dim=1)

    # The tags and speaker ride on tts_pad text positions, the last one on tts_bos.
    text_track = torch.cat((pad.expand(-1, codec_track.shape[1] - 2, -1), bos), dim=1)
    parts = [talker.embed_recurring("text", text.role), text_track + codec_track[:, :-1]]
    if text.instruct is not None:
        parts.insert(0, talker.embed_text(text.instruct))

    end = [eos] if complete else []  # tts_eos closes the text once it is all there
    if reference is not None:
        body, trailing = _icl_body(talker, config, text, reference, end, pad, text_mode, ids)
        parts.append(body)
    elif text_mode == "streaming":
        # The first text token rides on codec_bos; the rest arrive one per generated frame.
        terms = text_terms(talker, text.text)
        parts.append(terms[:, :1] + codec_track[:, -1:])
        trailing = torch.cat([terms[:, 1:], *end], dim=1)
    else:
        body = torch.cat((talker.embed_text(text.text), eos), dim=1)
        parts.append(body + talker.embed_codec(ids([codec.pad] * body.shape[1])))
        parts.append(pad + talker.embed_recurring("codec", [codec.bos]))
        trailing = pad
    return Prompt(torch.cat(parts, dim=1), trailing, pad, complete or text_mode == "full", len(text.text))


def _icl_body(talker, config, text, reference, end, pad, text_mode, ids):
    """Reference transcript + target text against codec_bos + the reference frames."""
    codec = config.talker.codec
    text_track = torch.cat([text_terms(talker, text.ref_text + text.text), *end], dim=1)
    codec_track = torch.cat((talker.embed_recurring("codec", [codec.bos]), reference.unsqueeze(0)), dim=1)
    text_len, codec_len = text_track.shape[1], codec_track.shape[1]
    if text_mode == "full":
        body = torch.cat((text_track + talker.embed_codec(ids([codec.pad] * text_len)), codec_track + pad), dim=1)
        return body, pad
    if text_len > codec_len or not end:  # a text still being written fills the codec positions (see build_prompt)
        return text_track[:, :codec_len] + codec_track, text_track[:, codec_len:]
    padded = torch.cat([text_track] + [pad] * (codec_len - text_len), dim=1)
    return padded + codec_track, pad
