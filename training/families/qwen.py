"""Qwen2.5-VL and Qwen3-VL (instruct, thinking, mixture-of-experts) fixtures."""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from training.make_fixture_model import NON_SPECIAL_ADDED_TOKENS, SPECIAL_TOKENS

from . import chat_templates as templates
from ._base import (
    CONTEXT,
    HEAD_DIM,
    HIDDEN,
    INTERMEDIATE,
    LAYERS,
    Family,
    FamilyFiles,
    text_sizes,
    tokenizer_config,
)
from .vocab import TokenizerSpec, token_ids

# The same added tokens as the qwen2-vl fixtures, in the same order (one declaration).
_QWEN_SPECIALS = SPECIAL_TOKENS
_QWEN_ADDED = NON_SPECIAL_ADDED_TOKENS
_QWEN3_ADDED = (*_QWEN_ADDED, "<tool_response>", "</tool_response>", "<think>", "</think>")

# -- Qwen2.5-VL --------------------------------------------------------------------------------


def _qwen_vision_processor(patch: int, min_side: int, max_side: int, processor: str) -> dict[str, Any]:
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": processor,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "rescale_factor": 1 / 255,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "min_pixels": min_side * min_side,
        "max_pixels": max_side * max_side,
        "size": {"shortest_edge": min_side * min_side, "longest_edge": max_side * max_side},
        "patch_size": patch,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }


def _qwen2_5_vl(tokenizer: Tokenizer) -> FamilyFiles:
    ids = token_ids(tokenizer, _QWEN_SPECIALS)
    im_end, endoftext = ids["<|im_end|>"], ids["<|endoftext|>"]
    config = {
        "architectures": ["Qwen2_5_VLForConditionalGeneration"],
        "model_type": "qwen2_5_vl",
        **text_sizes(tokenizer.get_vocab_size()),
        "max_window_layers": LAYERS,
        "rope_theta": 1_000_000.0,
        # head_dim 16 -> 8 rotary pairs split (temporal, height, width) as the real [16, 24, 24].
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]},
        "sliding_window": CONTEXT,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "torch_dtype": "bfloat16",
        "bos_token_id": endoftext,
        "eos_token_id": im_end,
        "pad_token_id": endoftext,
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "vision_token_id": ids["<|vision_pad|>"],
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_config": {
            "model_type": "qwen2_5_vl",
            "depth": 2,
            "hidden_act": "silu",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_heads": 2,
            "in_chans": 3,
            "out_hidden_size": HIDDEN,
            "patch_size": 14,
            "spatial_merge_size": 2,
            "spatial_patch_size": 14,
            "window_size": 56,
            "fullatt_block_indexes": [1],
            "tokens_per_second": 2,
            "temporal_patch_size": 2,
        },
    }
    preprocessor = _qwen_vision_processor(14, 56, 112, "Qwen2_5_VLProcessor")
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            templates.QWEN2_5_VL,
            tokenizer_class="Qwen2Tokenizer",
            bos_token=None,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            unk_token=None,
            errors="replace",
            split_special_tokens=False,
            add_prefix_space=False,
        ),
        special_tokens_map={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        generation_config={
            "bos_token_id": endoftext,
            "eos_token_id": [im_end, endoftext],
            "pad_token_id": endoftext,
            "do_sample": True,
            "temperature": 1e-6,
            "repetition_penalty": 1.05,
        },
        chat_template=templates.QWEN2_5_VL,
        extra_json={
            "preprocessor_config.json": preprocessor,
            "video_preprocessor_config.json": preprocessor,
            "processor_config.json": {"processor_class": "Qwen2_5_VLProcessor"},
        },
    )


# -- Qwen3-VL ----------------------------------------------------------------------------------


def _qwen3_vl_files(tokenizer: Tokenizer, template: str) -> FamilyFiles:
    ids = token_ids(tokenizer, _QWEN_SPECIALS)
    im_end, endoftext = ids["<|im_end|>"], ids["<|endoftext|>"]
    text_config = {
        "model_type": "qwen3_vl_text",
        **text_sizes(tokenizer.get_vocab_size()),
        "head_dim": HEAD_DIM,
        "rope_theta": 5_000_000.0,
        # Interleaved M-RoPE over 8 rotary pairs (the real [24, 20, 20] over 64).
        "rope_scaling": {"mrope_interleaved": True, "mrope_section": [4, 2, 2], "rope_type": "default"},
        "attention_bias": False,
        "tie_word_embeddings": True,
        "bos_token_id": endoftext,
        "eos_token_id": im_end,
        "dtype": "bfloat16",
    }
    config = {
        "architectures": ["Qwen3VLForConditionalGeneration"],
        "model_type": "qwen3_vl",
        "image_token_id": ids["<|image_pad|>"],
        "video_token_id": ids["<|video_pad|>"],
        "vision_start_token_id": ids["<|vision_start|>"],
        "vision_end_token_id": ids["<|vision_end|>"],
        "tie_word_embeddings": True,
        "text_config": text_config,
        "vision_config": {
            "model_type": "qwen3_vl",
            "depth": 2,
            "deepstack_visual_indexes": [1],
            "hidden_act": "gelu_pytorch_tanh",
            "hidden_size": 32,
            "in_channels": 3,
            "intermediate_size": 64,
            "num_heads": 2,
            # A square grid of learned position embeddings (the real one is 48 x 48).
            "num_position_embeddings": 64,
            "out_hidden_size": HIDDEN,
            "patch_size": 16,
            "spatial_merge_size": 2,
            "temporal_patch_size": 2,
        },
    }
    preprocessor = _qwen_vision_processor(16, 64, 128, "Qwen3VLProcessor")
    preprocessor["image_processor_type"] = "Qwen2VLImageProcessorFast"
    preprocessor["image_mean"] = [0.5, 0.5, 0.5]
    preprocessor["image_std"] = [0.5, 0.5, 0.5]
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            template,
            tokenizer_class="Qwen2Tokenizer",
            bos_token=None,
            eos_token="<|im_end|>",
            pad_token="<|endoftext|>",
            unk_token=None,
            errors="replace",
            split_special_tokens=False,
            add_prefix_space=False,
        ),
        special_tokens_map={"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"},
        generation_config={
            "bos_token_id": endoftext,
            "eos_token_id": [im_end, endoftext],
            "pad_token_id": endoftext,
            "do_sample": True,
            "temperature": 0.7,
            "top_k": 20,
            "top_p": 0.8,
        },
        chat_template=template,
        extra_json={
            "preprocessor_config.json": preprocessor,
            "video_preprocessor_config.json": preprocessor,
            "processor_config.json": {"processor_class": "Qwen3VLProcessor"},
        },
    )


def _qwen3_vl(tokenizer: Tokenizer) -> FamilyFiles:
    return _qwen3_vl_files(tokenizer, templates.QWEN3_VL)


def _qwen3_vl_thinking(tokenizer: Tokenizer) -> FamilyFiles:
    files = _qwen3_vl_files(tokenizer, templates.QWEN3_VL_THINKING)
    files.generation_config.update({"temperature": 1.0, "top_k": 20, "top_p": 0.95})
    return files


def _qwen3_vl_moe(tokenizer: Tokenizer) -> FamilyFiles:
    """Qwen3-VL-30B-A3B: Qwen3-VL with mixture-of-experts MLPs. Its mlx-vlm model can `shard`
    itself over a tensor-parallel group, so it is the fixture of the distributed mode."""
    files = _qwen3_vl_files(tokenizer, templates.QWEN3_VL)
    config = files.config
    config["architectures"] = ["Qwen3VLMoeForConditionalGeneration"]
    config["model_type"] = config["vision_config"]["model_type"] = "qwen3_vl_moe"
    config["text_config"].update(
        {
            "model_type": "qwen3_vl_moe_text",
            # Layer 0 dense, layer 1 sparse: both MLP kinds and both of their shardings.
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": INTERMEDIATE // 2,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [0],
            "norm_topk_prob": True,
        }
    )
    return files


_QWEN_TOKENIZER = TokenizerSpec(style="bytelevel", trailing_specials=_QWEN_SPECIALS, added_tokens=_QWEN_ADDED)
_QWEN3_TOKENIZER = TokenizerSpec(
    style="bytelevel", trailing_specials=_QWEN_SPECIALS, added_tokens=_QWEN3_ADDED
)

FAMILIES = (
    Family("qwen2_5_vl", "qwen2_5_vl", "Qwen/Qwen2.5-VL-7B-Instruct", _QWEN_TOKENIZER, _qwen2_5_vl),
    Family("qwen3_vl", "qwen3_vl", "Qwen/Qwen3-VL-8B-Instruct", _QWEN3_TOKENIZER, _qwen3_vl),
    Family(
        "qwen3_vl_thinking", "qwen3_vl", "Qwen/Qwen3-VL-8B-Thinking", _QWEN3_TOKENIZER, _qwen3_vl_thinking
    ),
    Family("qwen3_vl_moe", "qwen3_vl_moe", "Qwen/Qwen3-VL-30B-A3B-Instruct", _QWEN3_TOKENIZER, _qwen3_vl_moe),
)
