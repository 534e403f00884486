"""Gemma 4 fixture: the 26B-A4B shape (sliding-window and global layers, a mixture of experts
beside the dense MLP, Gemma 4's own vision tower with a variable image token count), tiny."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from . import chat_templates as templates
from ._base import (
    CONTEXT,
    HEAD_DIM,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    Family,
    FamilyFiles,
    tokenizer_config,
)
from .gemma import GEMMA_LEADING
from .vocab import TokenizerSpec, token_ids

# Turn, media and thinking markup (special: not shown in the answer).
_SPECIALS = (
    "<|turn>",
    "<turn|>",
    "<|think|>",
    "<|channel>",
    "<channel|>",
    "<|image>",
    "<image|>",
    "<|image|>",
    "<|audio>",
    "<audio|>",
    "<|audio|>",
    "<|video|>",
)
# Tool markup: the call format mlx-vlm's `gemma4` parser reads (kept in the decoded text).
_TOOL_TOKENS = (
    "<|tool>",
    "<tool|>",
    "<|tool_call>",
    "<tool_call|>",
    "<|tool_response>",
    "<tool_response|>",
    '<|"|>',
)
# 16 px patches pooled 2 x 2 would be real-sized; 8 px patches, at most 16 soft tokens an image.
PATCH = 8
POOLING = 2
MAX_SOFT_TOKENS = 16


def _gemma4(tokenizer: Tokenizer) -> FamilyFiles:
    ids = token_ids(tokenizer, (*GEMMA_LEADING, *_SPECIALS, *_TOOL_TOKENS))
    # <eos> and the end of a turn (the published generation_config's may hold more: not seen here).
    eos = [ids["<eos>"], ids["<turn|>"]]
    vocab = tokenizer.get_vocab_size()
    text: dict[str, Any] = {
        "model_type": "gemma4_text",
        "vocab_size": vocab,
        "vocab_size_per_layer_input": vocab,
        "hidden_size": HIDDEN,
        "num_hidden_layers": LAYERS,
        "intermediate_size": INTERMEDIATE,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HEAD_DIM,
        # Global layers: wider heads, fewer of them, partial rotation (as 26B-A4B / 31B).
        "global_head_dim": 2 * HEAD_DIM,
        "num_global_key_value_heads": 1,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-6,
        "hidden_activation": "gelu_pytorch_tanh",
        # Layer 0 local (window 32, shorter than the test prompts: the rotating cache wraps),
        # layer 1 global; the real pattern is 5 local : 1 global, window 1024.
        "layer_types": ["sliding_attention", "full_attention"],
        "sliding_window": 32,
        "sliding_window_pattern": 2,
        "rope_parameters": {
            "full_attention": {
                "partial_rotary_factor": 0.25,
                "rope_theta": 1_000_000.0,
                "rope_type": "proportional",
            },
            "sliding_attention": {"rope_theta": 10_000.0, "rope_type": "default"},
        },
        "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 0,
        "num_kv_shared_layers": 0,
        "use_double_wide_mlp": False,
        # 26B-A4B: 128 experts, top 8, beside each layer's dense MLP.
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": HIDDEN // 2,
        "attention_k_eq_v": False,
        "tie_word_embeddings": True,
        "pad_token_id": ids["<pad>"],
        "bos_token_id": ids["<bos>"],
        "eos_token_id": eos,
    }
    vision = {
        "model_type": "gemma4_vision",
        "hidden_size": 32,
        "intermediate_size": 64,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 16,
        "global_head_dim": 16,
        "patch_size": PATCH,
        "pooling_kernel_size": POOLING,
        "position_embedding_size": 64,
        "default_output_length": MAX_SOFT_TOKENS,
        "rms_norm_eps": 1e-6,
        "standardize": False,
    }
    config = {
        "architectures": ["Gemma4ForConditionalGeneration"],
        "model_type": "gemma4",
        "image_token_id": ids["<|image|>"],
        "boi_token_id": ids["<|image>"],
        "eoi_token_id": ids["<image|>"],
        "audio_token_id": ids["<|audio|>"],
        "boa_token_id": ids["<|audio>"],
        "eoa_token_id": ids["<audio|>"],
        "video_token_id": ids["<|video|>"],
        "vision_soft_tokens_per_image": MAX_SOFT_TOKENS,
        "audio_config": None,
        "eos_token_id": eos,
        "pad_token_id": ids["<pad>"],
        "tie_word_embeddings": True,
        "dtype": "bfloat16",
        "text_config": text,
        "vision_config": vision,
    }
    media = {
        "boi_token": "<|image>",
        "eoi_token": "<image|>",
        "image_token": "<|image|>",
        "boa_token": "<|audio>",
        "eoa_token": "<audio|>",
        "audio_token": "<|audio|>",
        "video_token": "<|video|>",
    }
    image_processor = {
        "image_processor_type": "Gemma4ImageProcessor",
        "patch_size": PATCH,
        "max_soft_tokens": MAX_SOFT_TOKENS,
        "pooling_kernel_size": POOLING,
        "do_resize": True,
        "do_rescale": True,
        "do_normalize": False,
        "rescale_factor": 1 / 255,
        "image_mean": [0.0, 0.0, 0.0],
        "image_std": [1.0, 1.0, 1.0],
    }
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            templates.GEMMA4,
            tokenizer_class="GemmaTokenizer",
            add_bos_token=False,
            add_eos_token=False,
            bos_token="<bos>",
            eos_token="<eos>",
            pad_token="<pad>",
            unk_token="<unk>",
            mask_token="<mask>",
            **media,
            extra_special_tokens=media,
            processor_class="Gemma4Processor",
            padding_side="left",
            spaces_between_special_tokens=False,
        ),
        special_tokens_map={
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            **media,
        },
        generation_config={
            "bos_token_id": ids["<bos>"],
            "eos_token_id": eos,
            "pad_token_id": ids["<pad>"],
            "do_sample": True,
            "temperature": 1.0,
            "top_k": 64,
            "top_p": 0.95,
        },
        chat_template=templates.GEMMA4,
        extra_json={
            "processor_config.json": {
                "processor_class": "Gemma4Processor",
                "image_seq_length": MAX_SOFT_TOKENS,
                "image_processor": image_processor,
            },
            "preprocessor_config.json": {**image_processor, "processor_class": "Gemma4Processor"},
        },
    )


FAMILIES = (
    Family(
        "gemma4",
        "gemma4",
        "google/gemma-4-26B-A4B-it (and the 31B's sliding + global layers)",
        TokenizerSpec(
            style="metaspace",
            leading_specials=GEMMA_LEADING,
            trailing_specials=_SPECIALS,
            added_tokens=_TOOL_TOKENS,
            unk_token="<unk>",
            bos_token="<bos>",
        ),
        _gemma4,
    ),
)
