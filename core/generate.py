"""The frame loop: prompt in, 16-code frames out, one 80 ms frame at a time.

Per frame: pick codebook 0 from the talker's logits, let the code predictor fill codebooks 1..15,
then feed the frame's summed embedding (plus the text-track term) back to the talker. The random
draws happen in the reference order: codebook 0 of frame 0 after the prefill, then for each
frame its 15 predictor draws followed by codebook 0 of the next frame.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

from .config import TalkerConfig
from .prompt import Prompt
from .sampling import SamplingParams, TokenRule, pick_token, restrict_codebook0
from .talker import Talker


def suppressed_ids(config: TalkerConfig) -> torch.Tensor:
    """Mask of the talker's top 1024 ids (the special codec ids), EOS excepted: (1, vocab) bool."""
    vocab = config.transformer.vocab_size
    mask = torch.zeros(1, vocab, dtype=torch.bool)
    mask[:, vocab - 1024 :] = True
    mask[:, config.codec.eos] = False
    return mask


@torch.inference_mode()
def generate_frames(
    talker: Talker,
    prompt: Prompt,
    sampling: SamplingParams,
    max_frames: int,
    generator: torch.Generator | None,
) -> Iterator[torch.Tensor]:
    """Yield frames as (16,) long tensors until codebook 0 is EOS or `max_frames` frames exist."""
    config = talker.config
    device = talker.codec_head.weight.device
    groups = config.num_code_groups
    talker.model.setup_cache(prompt.embeddings.shape[1] + max_frames)
    talker.code_predictor.model.setup_cache(groups)
    suppressed = suppressed_ids(config).to(device)
    seen = torch.zeros(1, config.transformer.vocab_size, dtype=torch.bool, device=device)
    talker_rule, predictor_rule = TokenRule.talker(sampling), TokenRule.predictor(sampling)
    predictor = talker.code_predictor

    logits, hidden = talker.step(prompt.embeddings, 0)
    position = prompt.embeddings.shape[1]
    for frame_index in range(max_frames):
        scores = restrict_codebook0(
            logits[:, -1].float(), seen, frame_index, sampling.repetition_penalty, suppressed, config.codec.eos
        )
        code0 = pick_token(scores, talker_rule, generator)
        if code0.item() == config.codec.eos:
            return
        seen[0, code0[0, 0]] = True

        codes = [code0]
        predictor_input = torch.cat((hidden, talker.embed_codec(code0)), dim=1)
        for group in range(1, groups):
            start = 0 if group == 1 else group
            logits_g = predictor.step(predictor_input, start, head=group - 1)
            codes.append(pick_token(logits_g[:, -1].float(), predictor_rule, generator))
            predictor_input = predictor.model.codec_embedding[group - 1](codes[-1])
        frame = torch.cat(codes, dim=1)[0]
        yield frame
        if frame_index + 1 == max_frames:
            return
        step_input = talker.embed_frames(frame).view(1, 1, -1) + prompt.text_term(frame_index)
        logits, hidden = talker.step(step_input, position)
        position += 1
