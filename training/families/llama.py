"""Llama 4 and LLaVA 1.5 fixtures."""

from __future__ import annotations

from tokenizers import Tokenizer

from . import chat_templates as templates
from ._base import (
    HEAD_DIM,
    HIDDEN,
    INTERMEDIATE,
    SENTENCEPIECE_SPECIALS,
    Family,
    FamilyFiles,
    sentencepiece_generation_config,
    text_sizes,
    tokenizer_config,
)
from .vocab import TokenizerSpec, token_ids

_LLAMA4_TRAILING = (
    "<|begin_of_text|>",
    "<|end_of_text|>",
    "<|fim_prefix|>",
    "<|fim_middle|>",
    "<|fim_suffix|>",
    "<|header_start|>",
    "<|header_end|>",
    "<|eom|>",
    "<|eot|>",
    "<|step|>",
    "<|text_post_train_reserved_special_token_0|>",
    "<|python_start|>",
    "<|python_end|>",
    "<|finetune_right_pad|>",
    "<|image_start|>",
    "<|image_end|>",
    "<|vision_reserved_special_token_0|>",
    "<|tile_x_separator|>",
    "<|tile_y_separator|>",
    "<|image|>",
    "<|patch|>",
)
LLAMA4_TILE_SIDE = 56  # patch 14 -> 4 x 4 patches, pixel-shuffled (ratio 0.5) -> 4 tokens a tile


def _llama4(tokenizer: Tokenizer) -> FamilyFiles:
    ids = token_ids(tokenizer, _LLAMA4_TRAILING)
    eos = [ids["<|end_of_text|>"], ids["<|eom|>"], ids["<|eot|>"]]
    pad = ids["<|finetune_right_pad|>"]
    config = {
        "architectures": ["Llama4ForConditionalGeneration"],
        "model_type": "llama4",
        "boi_token_index": ids["<|image_start|>"],
        "eoi_token_index": ids["<|image_end|>"],
        "image_token_index": ids["<|patch|>"],
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "llama4_text",
            **text_sizes(tokenizer.get_vocab_size()),
            # Four layers so the fourth is a global NoPE layer, as every fourth is in Scout.
            "num_hidden_layers": 4,
            "head_dim": HEAD_DIM,
            "intermediate_size": 64,
            "intermediate_size_mlp": INTERMEDIATE,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "interleave_moe_layer_step": 1,
            # Chunked local attention (8192 in Scout) shorter than the test prompts.
            "attention_chunk_size": 32,
            "attention_bias": False,
            "use_qk_norm": True,
            "no_rope_layers": [],
            "rope_theta": 500_000.0,
            "rope_scaling": {
                "factor": 8.0,
                "high_freq_factor": 4.0,
                "low_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
                "rope_type": "llama3",
            },
            "attn_temperature_tuning": True,
            "floor_scale": 8192,
            "attn_scale": 0.1,
            "bos_token_id": ids["<|begin_of_text|>"],
            "eos_token_id": eos,
            "pad_token_id": pad,
            "rms_norm_eps": 1e-5,
        },
        "vision_config": {
            "model_type": "llama4_vision_model",
            "hidden_act": "gelu",
            "hidden_size": 32,
            "image_size": LLAMA4_TILE_SIDE,
            "initializer_range": 0.02,
            "intermediate_size": 128,
            "multi_modal_projector_bias": False,
            "norm_eps": 1e-5,
            "num_attention_heads": 2,
            "num_channels": 3,
            "num_hidden_layers": 2,
            "patch_size": 14,
            "pixel_shuffle_ratio": 0.5,
            "projector_dropout": 0.0,
            "projector_input_dim": HIDDEN,
            "projector_output_dim": HIDDEN,
            "rope_theta": 10000,
            "vision_feature_layer": -1,
            "vision_feature_select_strategy": "default",
            "vision_output_dim": HIDDEN,
        },
    }
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            templates.LLAMA4,
            tokenizer_class="PreTrainedTokenizerFast",
            bos_token="<|begin_of_text|>",
            eos_token="<|eot|>",
            pad_token="<|finetune_right_pad|>",
            processor_class="Llama4Processor",
        ),
        special_tokens_map={
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot|>",
            "pad_token": "<|finetune_right_pad|>",
        },
        generation_config={
            "bos_token_id": ids["<|begin_of_text|>"],
            "eos_token_id": eos,
            "pad_token_id": pad,
        },
        chat_template=templates.LLAMA4,
        extra_json={
            "preprocessor_config.json": {
                "image_processor_type": "Llama4ImageProcessorFast",
                "processor_class": "Llama4Processor",
                "do_convert_rgb": True,
                "do_normalize": True,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "max_patches": 4,
                "resample": 2,
                "rescale_factor": 1 / 255,
                "resize_to_max_canvas": False,
                "size": {"height": LLAMA4_TILE_SIDE, "width": LLAMA4_TILE_SIDE},
            },
            "processor_config.json": {
                "fake_image_token": "<|image|>",
                "image_token": "<|image|>",
                "patch_size": 14,
                "processor_class": "Llama4Processor",
            },
        },
    )


# -- LLaVA 1.5 ---------------------------------------------------------------------------------

_LLAVA_LEADING = ("<unk>", "<s>", "</s>")
_LLAVA_TRAILING = ("<image>", "<pad>")
LLAVA_IMAGE_SIDE = 56  # patch 14 -> 4 x 4 patches -> 16 image tokens (the class token dropped)


def _llava(tokenizer: Tokenizer) -> FamilyFiles:
    ids = token_ids(tokenizer, (*_LLAVA_LEADING, *_LLAVA_TRAILING))
    config = {
        "architectures": ["LlavaForConditionalGeneration"],
        "model_type": "llava",
        "ignore_index": -100,
        "image_token_index": ids["<image>"],
        "pad_token_id": ids["<pad>"],
        "projector_hidden_act": "gelu",
        "vision_feature_layer": -2,
        "vision_feature_select_strategy": "default",
        "torch_dtype": "float16",
        "tie_word_embeddings": False,
        "text_config": {
            "model_type": "llama",
            **text_sizes(tokenizer.get_vocab_size()),
            "rope_theta": 10_000.0,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "model_type": "clip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 3,
            "num_attention_heads": 2,
            "image_size": LLAVA_IMAGE_SIDE,
            "patch_size": 14,
            "projection_dim": 64,
            "layer_norm_eps": 1e-5,
            "hidden_act": "quick_gelu",
        },
    }
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            templates.LLAVA,
            tokenizer_class="LlamaTokenizerFast",
            add_bos_token=True,
            add_eos_token=False,
            **SENTENCEPIECE_SPECIALS,
            legacy=False,
            padding_side="left",
            processor_class="LlavaProcessor",
        ),
        special_tokens_map=dict(SENTENCEPIECE_SPECIALS),
        generation_config=sentencepiece_generation_config(ids),
        chat_template=templates.LLAVA,
        extra_json={
            "preprocessor_config.json": {
                "image_processor_type": "CLIPImageProcessor",
                "processor_class": "LlavaProcessor",
                "crop_size": {"height": LLAVA_IMAGE_SIDE, "width": LLAVA_IMAGE_SIDE},
                "do_center_crop": True,
                "do_convert_rgb": True,
                "do_normalize": True,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711],
                "resample": 3,
                "rescale_factor": 1 / 255,
                "size": {"shortest_edge": LLAVA_IMAGE_SIDE},
            },
            "processor_config.json": {
                "image_token": "<image>",
                "num_additional_image_tokens": 1,
                "patch_size": 14,
                "processor_class": "LlavaProcessor",
                "vision_feature_select_strategy": "default",
            },
        },
    )


FAMILIES = (
    Family(
        "llama4",
        "llama4",
        "meta-llama/Llama-4-Scout-17B-16E-Instruct",
        TokenizerSpec(style="bytelevel", trailing_specials=_LLAMA4_TRAILING, bos_token="<|begin_of_text|>"),
        _llama4,
    ),
    Family(
        "llava",
        "llava",
        "llava-hf/llava-1.5-7b-hf",
        TokenizerSpec(
            style="metaspace",
            leading_specials=_LLAVA_LEADING,
            trailing_specials=_LLAVA_TRAILING,
            prefix_space=True,
            unk_token="<unk>",
            bos_token="<s>",
        ),
        _llava,
    ),
)
