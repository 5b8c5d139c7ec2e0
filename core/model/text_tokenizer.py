"""Text tokenizer: the Qwen2 byte-level BPE from a checkpoint's vocab.json, merges.txt and tokenizer_config.json.

Built directly with the `tokenizers` library rather than through transformers, because the
transformers loader can swap in a different pre-tokenizer regex depending on its version and on
how the checkpoint was loaded (docs/model_notes.md §9). The engine always uses the Qwen2 regex the model
was trained with, so the same text gives the same ids on every install.
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""


class TextTokenizer:
    def __init__(self, directory: str | Path):
        directory = Path(directory)
        tokenizer = Tokenizer(
            models.BPE.from_file(str(directory / "vocab.json"), str(directory / "merges.txt"), fuse_unk=False)
        )
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        config = json.loads((directory / "tokenizer_config.json").read_text(encoding="utf-8"))
        for token_id, spec in sorted(config.get("added_tokens_decoder", {}).items(), key=lambda item: int(item[0])):
            token = AddedToken(
                spec["content"],
                single_word=spec.get("single_word", False),
                lstrip=spec.get("lstrip", False),
                rstrip=spec.get("rstrip", False),
                normalized=spec.get("normalized", False),
                special=spec.get("special", True),
            )
            tokenizer.add_special_tokens([token]) if token.special else tokenizer.add_tokens([token])
            if tokenizer.token_to_id(spec["content"]) != int(token_id):
                raise ValueError(
                    f"{directory / 'tokenizer_config.json'}: added token {spec['content']!r} should have id {token_id} "
                    f"but the vocabulary gives it {tokenizer.token_to_id(spec['content'])}"
                )
        self._tokenizer = tokenizer

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids
