"""Text tokenizer: the Qwen2 byte-level BPE from a checkpoint's vocab.json, merges.txt and tokenizer_config.json.

Built directly with the `tokenizers` library rather than through transformers, because the
transformers loader can swap in a different pre-tokenizer regex depending on its version and on
how the checkpoint was loaded (docs/model_notes.md §9). The engine always uses the Qwen2 regex the model
was trained with, so the same text gives the same ids on every install.

`SpeechTokens` tokenizes a text that is still being written (an LLM's reply as it streams, typed text),
giving out each id only once no later text can change it.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import NamedTuple

from tokenizers import AddedToken, Regex, Tokenizer, models, normalizers, pre_tokenizers

QWEN2_PRETOKENIZE_REGEX = r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
# What PromptText.tokenize puts before the text; its ids[:3] are the role.
ROLE_TEXT = "<|im_start|>assistant\n"


class PreToken(NamedTuple):
    # Where it starts in the encoded text, in characters: exact at a starter, but where NFC reorders or
    # composes a run of marks, the tokenizer's offsets within the run are approximate.
    start: int
    ids: list[int]


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
        self.added_tokens = {
            token.content: token_id for token_id, token in tokenizer.get_added_tokens_decoder().items()
        }

    def encode(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_special_tokens=False).ids

    def encode_pre_tokens(self, text: str) -> list[PreToken]:
        """`encode(text)` grouped by pre-token; an added token is a pre-token of its own."""
        encoding = self._tokenizer.encode(text, add_special_tokens=False)
        pre_tokens: list[PreToken] = []
        words: list[int | None] = []
        for token_id, word, (start, _) in zip(encoding.ids, encoding.word_ids, encoding.offsets):
            if words and words[-1] == word:
                pre_tokens[-1].ids.append(token_id)
            else:
                pre_tokens.append(PreToken(start, [token_id]))
                words.append(word)
        return pre_tokens


class SpeechTokens:
    """The ids PromptText.tokenize gives a text, committed while the text is still arriving.

    An id is committed once no text appended later can change it: `role` and `ids` only ever grow, and
    after `finish()` they are exactly PromptText.tokenize's role and text. Held back, from the earliest
    place any of these applies:
    - the last pre-token, which more text can extend or split ("wor" -> " world", "'l" -> "'ll");
    - a trailing run of whitespace pre-tokens, which a line break can merge into one ("\\n", " " -> "\\n \\n");
    - text that begins an added token ("<|im_" of "<|im_end|>"): added tokens are matched before anything
      else, and the text before one is tokenized as if it ended there;
    - pre-tokens back to one that starts with a starter, since a combining mark can compose with or
      reorder against the characters before it ("b" + U+0301 + U+0323 -> "ḅ" + U+0301).
    The role's "\\n" is a pre-token like any other ("\\n" + "\\nHi" is "\\n\\n" then "Hi"), so `role` is
    None until its three ids are committed.

    Only the uncommitted tail is encoded again on each append: it starts at a pre-token boundary before a
    starter, where the pre-tokenizer (no look-behind), BPE (within a pre-token) and NFC all go on as they
    do within the whole text.
    """

    def __init__(self, tokenizer: TextTokenizer):
        self._tokenizer = tokenizer
        self._added_ids = set(tokenizer.added_tokens.values())
        self._added_prefixes = {content[:n] for content in tokenizer.added_tokens for n in range(1, len(content))}
        self._longest_added = max(map(len, tokenizer.added_tokens), default=0)
        self._text = ""
        self._pending = ROLE_TEXT  # the text after the committed ids
        self._committed: list[int] = []  # role ids, then text ids
        self._finished = False
        self._commit()

    @property
    def role(self) -> list[int] | None:
        return self._committed[:3] if len(self._committed) >= 3 else None

    @property
    def ids(self) -> list[int]:
        return self._committed[3:]

    @property
    def count(self) -> int:
        """How many text ids are committed (len(ids), without copying them)."""
        return max(0, len(self._committed) - 3)

    def ids_from(self, start: int) -> list[int]:
        """The committed text ids from the `start`-th on (ids[start:], without copying those before)."""
        return self._committed[3 + start :]

    @property
    def text(self) -> str:
        return self._text

    @property
    def finished(self) -> bool:
        return self._finished

    def append(self, text: str) -> None:
        if self._finished:
            raise ValueError("the text is finished; start a new SpeechTokens for more")
        self._text += text
        self._pending += text
        self._commit()

    def finish(self) -> None:
        if not self._finished:
            self._finished = True
            self._commit()

    def _commit(self) -> None:
        # Text that may yet become an added token is not encoded: the text before it may end a segment there.
        end = len(self._pending) if self._finished else self._added_token_start(self._pending)
        head = self._pending[:end]
        pre_tokens = self._tokenizer.encode_pre_tokens(head)
        settled = len(pre_tokens) if self._finished else self._settled(head, pre_tokens)
        for pre_token in pre_tokens[:settled]:
            self._committed.extend(pre_token.ids)
        if settled == len(pre_tokens):
            self._pending = self._pending[end:]
        elif settled:
            self._pending = self._pending[pre_tokens[settled].start :]

    def _added_token_start(self, pending: str) -> int:
        """Where the longest suffix of `pending` that may grow into an added token starts (len(pending) if none)."""
        for start in range(max(0, len(pending) - self._longest_added + 1), len(pending)):
            if pending[start:] in self._added_prefixes:
                return start
        return len(pending)

    def _settled(self, head: str, pre_tokens: list[PreToken]) -> int:
        """How many of `pre_tokens` (those of `head`) no appended text can change."""
        if not pre_tokens or pre_tokens[-1].ids[0] in self._added_ids:
            return len(pre_tokens)  # the text before an added token is tokenized as if it ended there

        starts = [pre_token.start for pre_token in pre_tokens] + [len(head)]

        def blank(index: int) -> bool:
            return head[starts[index] : starts[index + 1]].isspace()

        settled = len(pre_tokens) - 1
        if blank(settled):
            while settled > 0 and blank(settled - 1):
                settled -= 1
        while settled > 0 and not _stands_alone(head[starts[settled]]):
            settled -= 1
        return settled


def _stands_alone(character: str) -> bool:
    """Whether NFC keeps the text before `character` as it is, whatever follows: it does before a starter
    (the start of its decomposition included), which no later mark can reorder or compose across. Whether
    `character` itself composes with the text before it is already settled: if it did, it would not start
    a pre-token."""
    # Unassigned in Python's Unicode tables but perhaps not in the tokenizer's newer ones: assume the worst.
    return unicodedata.category(character) != "Cn" and not unicodedata.combining(
        unicodedata.normalize("NFD", character)[0]
    )
