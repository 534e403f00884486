"""Gemma 3 fixture."""

from __future__ import annotations

from tokenizers import Tokenizer

from . import chat_templates as templates
from ._base import (
    HEAD_DIM,
    Family,
    FamilyFiles,
    text_sizes,
    tokenizer_config,
)
from .vocab import TokenizerSpec, token_ids

GEMMA_LEADING = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>")
_GEMMA_TRAILING = (
    "<start_of_turn>",
    "<end_of_turn>",
    "<start_of_image>",
    "<end_of_image>",
    "<image_soft_token>",
)
GEMMA_IMAGE_SIDE = 64
GEMMA_IMAGE_TOKENS = 16  # 64 px / patch 8 = 8 x 8 patches, pooled 2 x 2 -> 4 x 4


def _gemma3(tokenizer: Tokenizer) -> FamilyFiles:
    ids = token_ids(tokenizer, (*GEMMA_LEADING, *_GEMMA_TRAILING))
    eos, end_of_turn = ids["<eos>"], ids["<end_of_turn>"]
    config = {
        "architectures": ["Gemma3ForConditionalGeneration"],
        "model_type": "gemma3",
        "boi_token_index": ids["<start_of_image>"],
        "eoi_token_index": ids["<end_of_image>"],
        "image_token_index": ids["<image_soft_token>"],
        "mm_tokens_per_image": GEMMA_IMAGE_TOKENS,
        "initializer_range": 0.02,
        "eos_token_id": [eos, end_of_turn],
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "gemma3_text",
            **text_sizes(tokenizer.get_vocab_size()),
            "hidden_activation": "gelu_pytorch_tanh",
            "head_dim": HEAD_DIM,
            "query_pre_attn_scalar": HEAD_DIM,
            # Every other layer is local (the real pattern is 5 local : 1 global, window 1024);
            # a window shorter than the test prompts makes the rotating cache wrap.
            "sliding_window": 32,
            "sliding_window_pattern": 2,
            "rope_theta": 1_000_000.0,
            "rope_local_base_freq": 10_000.0,
            "rope_scaling": {"rope_type": "linear", "factor": 8.0},
            "final_logit_softcapping": None,
            "attn_logit_softcapping": None,
            # mlx-vlm reads the image token count here (the real config has it only at the top
            # level, where it equals mlx-vlm's default of 256).
            "mm_tokens_per_image": GEMMA_IMAGE_TOKENS,
        },
        "vision_config": {
            "model_type": "siglip_vision_model",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": GEMMA_IMAGE_SIDE,
            "patch_size": 8,
            "layer_norm_eps": 1e-6,
            "vision_use_head": False,
        },
    }
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            templates.GEMMA3,
            tokenizer_class="GemmaTokenizer",
            add_bos_token=True,
            add_eos_token=False,
            bos_token="<bos>",
            eos_token="<eos>",
            pad_token="<pad>",
            unk_token="<unk>",
            boi_token="<start_of_image>",
            eoi_token="<end_of_image>",
            image_token="<image_soft_token>",
            extra_special_tokens={
                "boi_token": "<start_of_image>",
                "eoi_token": "<end_of_image>",
                "image_token": "<image_soft_token>",
            },
            processor_class="Gemma3Processor",
            padding_side="left",
            spaces_between_special_tokens=False,
        ),
        special_tokens_map={
            "bos_token": "<bos>",
            "eos_token": "<eos>",
            "pad_token": "<pad>",
            "unk_token": "<unk>",
            "boi_token": "<start_of_image>",
            "eoi_token": "<end_of_image>",
            "image_token": "<image_soft_token>",
        },
        generation_config={
            "bos_token_id": ids["<bos>"],
            "eos_token_id": [eos, end_of_turn],
            "pad_token_id": ids["<pad>"],
            "do_sample": True,
            "top_k": 64,
            "top_p": 0.95,
        },
        chat_template=templates.GEMMA3,
        extra_json={
            "preprocessor_config.json": {
                "image_processor_type": "Gemma3ImageProcessor",
                "processor_class": "Gemma3Processor",
                "do_convert_rgb": None,
                "do_normalize": True,
                "do_pan_and_scan": None,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "image_seq_length": GEMMA_IMAGE_TOKENS,
                "pan_and_scan_max_num_crops": None,
                "pan_and_scan_min_crop_size": None,
                "pan_and_scan_min_ratio_to_activate": None,
                "resample": 2,
                "rescale_factor": 1 / 255,
                "size": {"height": GEMMA_IMAGE_SIDE, "width": GEMMA_IMAGE_SIDE},
            },
            "processor_config.json": {
                "image_seq_length": GEMMA_IMAGE_TOKENS,
                "processor_class": "Gemma3Processor",
            },
        },
    )


FAMILIES = (
    Family(
        "gemma3",
        "gemma3",
        "google/gemma-3-4b-it",
        TokenizerSpec(
            style="metaspace",
            leading_specials=GEMMA_LEADING,
            trailing_specials=_GEMMA_TRAILING,
            unk_token="<unk>",
            bos_token="<bos>",
        ),
        _gemma3,
    ),
)
