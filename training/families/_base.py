"""What every family fixture shares: the small sizes and the shape of a family's files."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from tokenizers import Tokenizer

from .vocab import TokenizerSpec

# Shared small text-model sizes (the real ones are 30-100x larger in every dimension).
HIDDEN = 64
LAYERS = 2
HEADS = 4
KV_HEADS = 2
HEAD_DIM = HIDDEN // HEADS
INTERMEDIATE = 128
# Shrunk like the dimensions: keeps over-long-prompt tests cheap.
CONTEXT = 4096


@dataclass
class FamilyFiles:
    """Everything a family writes besides the tokenizer and weights."""

    config: dict[str, Any]
    tokenizer_config: dict[str, Any]
    special_tokens_map: dict[str, Any]
    generation_config: dict[str, Any]
    chat_template: str
    extra_json: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class Family:
    name: str
    model_type: str
    # What a user would run; for docs and logs.
    stands_for: str
    tokenizer: TokenizerSpec
    files: Callable[[Tokenizer], FamilyFiles]


def added_tokens_decoder(tokenizer: Tokenizer) -> dict[str, dict[str, Any]]:
    decoder: dict[str, dict[str, Any]] = {}
    for token_id, added in sorted(tokenizer.get_added_tokens_decoder().items()):
        decoder[str(token_id)] = {
            "content": added.content,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": added.special,
        }
    return decoder


def tokenizer_config(tokenizer: Tokenizer, template: str, **fields: Any) -> dict[str, Any]:
    return {
        "added_tokens_decoder": added_tokens_decoder(tokenizer),
        "clean_up_tokenization_spaces": False,
        "model_max_length": CONTEXT,
        "chat_template": template,
        **fields,
    }


def text_sizes(vocab_size: int) -> dict[str, Any]:
    return {
        "vocab_size": vocab_size,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "intermediate_size": INTERMEDIATE,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-6,
        "hidden_act": "silu",
    }


# The SentencePiece-era special tokens (Llama 2 / LLaVA / Mistral tokenizers).
SENTENCEPIECE_SPECIALS = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}


def sentencepiece_generation_config(ids: dict[str, int]) -> dict[str, Any]:
    """generation_config.json for a tokenizer with SENTENCEPIECE_SPECIALS (`ids`: token -> id)."""
    return {"bos_token_id": ids["<s>"], "eos_token_id": ids["</s>"], "pad_token_id": ids["<pad>"]}
