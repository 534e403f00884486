"""Small local tokenizers in each family's style, for the family fixtures (no downloads).

Two styles cover the families:

- byte-level BPE (Qwen, SmolVLM's GPT-2 lineage, Mistral's Tekken): a regex split, then bytes
  mapped to printable characters; decoding reverses the byte map;
- SentencePiece-style BPE (Gemma, Llama 2 / LLaVA 1.5): spaces become "▁", unknown characters
  fall back to ``<0xNN>`` byte tokens.

Each tokenizer is trained with the ``tokenizers`` library on a fixed slice of the Python
standard library (deterministic), then laid out in the family's order: the family's leading
special tokens get the first ids (as in Gemma, Llama, Mistral, SmolVLM), the trained pieces
follow, and trailing specials come last (as in Qwen, where they follow the BPE vocabulary).
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Literal

from tokenizers import (
    AddedToken,
    Regex,
    Tokenizer,
    decoders,
    models,
    normalizers,
    pre_tokenizers,
    processors,
    trainers,
)

__all__ = ["TokenizerSpec", "build_tokenizer"]

Style = Literal["bytelevel", "metaspace"]

# Qwen2's split regex (also close to GPT-2's and Tekken's: words, numbers, punctuation runs).
_BYTELEVEL_SPLIT = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)
_TRAINING_FILES = ("pydoc_data/topics.py", "json/__init__.py", "textwrap.py", "argparse.py")
_SPACE = "\u2581"  # "▁"


@dataclass(frozen=True)
class TokenizerSpec:
    style: Style
    # Special tokens that take the first ids, in order (e.g. Gemma's <pad>, <eos>, <bos>, <unk>).
    leading_specials: tuple[str, ...] = ()
    # Special tokens appended after the trained vocabulary, in order.
    trailing_specials: tuple[str, ...] = ()
    # Added tokens that are not special (survive decoding), e.g. Qwen's <tool_call>.
    added_tokens: tuple[str, ...] = ()
    # Trained pieces (byte alphabet and merges included).
    trained_size: int = 1536
    # SentencePiece style: prepend "▁" to the text (Llama 2) or not (Gemma).
    prefix_space: bool = False
    unk_token: str | None = None
    # The token the real tokenizer.json prepends to every encoding (its TemplateProcessing
    # post-processor), e.g. Gemma's <bos>; None when it adds nothing (Qwen, SmolVLM).
    bos_token: str | None = None


def _training_lines() -> Iterator[str]:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in _TRAINING_FILES:
        text = (stdlib / name).read_text(encoding="utf-8", errors="replace")
        yield from text.splitlines(keepends=True)


@lru_cache(maxsize=4)
def _trained(style: Style, size: int) -> tuple[tuple[str, ...], tuple[tuple[str, str], ...]]:
    """(pieces in id order, merges) of a BPE trained in `style` (cached: families share it)."""
    tokenizer = Tokenizer(models.BPE())
    if style == "bytelevel":
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_BYTELEVEL_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        alphabet = pre_tokenizers.ByteLevel.alphabet()
    else:
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme="never")
        alphabet = []
    trainer = trainers.BpeTrainer(
        vocab_size=size, min_frequency=2, show_progress=False, initial_alphabet=alphabet, special_tokens=[]
    )
    tokenizer.train_from_iterator(_training_lines(), trainer=trainer)
    model = json.loads(tokenizer.to_str())["model"]
    pieces = tuple(sorted(model["vocab"], key=model["vocab"].__getitem__))
    merges = tuple(tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in model["merges"])
    return pieces, merges  # type: ignore[return-value]


def build_tokenizer(spec: TokenizerSpec) -> Tokenizer:
    """A tokenizer in the family's layout; deterministic for a given Python standard library."""
    pieces, merges = _trained(spec.style, spec.trained_size)
    vocab: dict[str, int] = {}
    for token in spec.leading_specials:
        vocab[token] = len(vocab)
    if spec.style == "metaspace":
        for byte in range(256):
            vocab.setdefault(f"<0x{byte:02X}>", len(vocab))
    for piece in pieces:
        vocab.setdefault(piece, len(vocab))
    for token in spec.trailing_specials:
        vocab.setdefault(token, len(vocab))
    if spec.style == "bytelevel":
        tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=list(merges), fuse_unk=False))
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(_BYTELEVEL_SPLIT), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
    else:
        tokenizer = Tokenizer(
            models.BPE(
                vocab=vocab, merges=list(merges), unk_token=spec.unk_token, byte_fallback=True, fuse_unk=True
            )
        )
        scheme = "first" if spec.prefix_space else "never"
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement=_SPACE, prepend_scheme=scheme)
        tokenizer.decoder = decoders.Sequence(
            [
                decoders.Replace(_SPACE, " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                *([decoders.Strip(" ", 1, 0)] if spec.prefix_space else []),
            ]
        )
    specials = [*spec.leading_specials, *spec.trailing_specials]
    tokenizer.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
    tokenizer.add_tokens([AddedToken(t, special=False, normalized=False) for t in spec.added_tokens])
    if spec.bos_token is not None:
        bos = spec.bos_token
        tokenizer.post_processor = processors.TemplateProcessing(
            single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, vocab[bos])]
        )
    return tokenizer


def token_ids(tokenizer: Tokenizer, tokens: Sequence[str]) -> dict[str, int]:
    ids: dict[str, int] = {}
    for token in tokens:
        token_id = tokenizer.token_to_id(token)
        if token_id is None:
            raise KeyError(f"{token!r} is not in the tokenizer")
        ids[token] = token_id
    return ids
