"""GLM-4.6V-Flash / GLM-4.1V (`glm4v`, dense) and GLM-4.5V / GLM-4.6V (`glm4v_moe`) fixtures, tiny.

Both take GLM-4V's vision tower (patch 14, 2 x 2 merge, learned positions interpolated to the
image's grid), 3-D rotary positions on half of each head (`partial_rotary_factor` 0.5), the
`[gMASK]<sop>` prompt, `<think>` reasoning and the `<arg_key>`/`<arg_value>` tool calls (mlx-vlm's
`glm47` parser, which our tool-call registry names).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from . import chat_templates as templates
from ._base import (
    CONTEXT,
    HEADS,
    HIDDEN,
    INTERMEDIATE,
    KV_HEADS,
    LAYERS,
    Family,
    FamilyFiles,
    tokenizer_config,
)
from .vocab import TokenizerSpec, token_ids

# GLM-4's special tokens in its own order (after the BPE vocabulary, from <|endoftext|> = 151329),
# the box markers (grounding answers) and the media placeholders last, as in the published vocab.
_SPECIALS = (
    "<|endoftext|>",
    "[MASK]",
    "[gMASK]",
    "[sMASK]",
    "<sop>",
    "<eop>",
    "<|system|>",
    "<|user|>",
    "<|assistant|>",
    "<|observation|>",
    "<|begin_of_image|>",
    "<|end_of_image|>",
    "<|begin_of_video|>",
    "<|end_of_video|>",
    "/nothink",
    "<|begin_of_box|>",
    "<|end_of_box|>",
    "<|image|>",
    "<|video|>",
)
# Reasoning and tool markup: kept in the decoded text (the reasoning splitter and the `glm47`
# tool parser read it), as the published tokenizer decodes them.
_ADDED = (
    "<think>",
    "</think>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<arg_key>",
    "</arg_key>",
    "<arg_value>",
    "</arg_value>",
)
# Real: head_dim 128, rotary on 64 dims split (t, h, w) as [8, 12, 12] pairs; here head_dim 16,
# rotary on 8 dims, 4 pairs.
_MROPE_SECTION = [1, 1, 2]
PATCH = 14
# 56 x 56 .. 112 x 112 pixels (x 2 frames, as the processor counts): 4 to 16 image tokens.
_MIN_PIXELS = 2 * 56 * 56
_MAX_PIXELS = 2 * 112 * 112


def _vision(moe: bool) -> dict[str, Any]:
    return {
        "model_type": "glm4v_moe" if moe else "glm4v",
        "depth": 2,
        "hidden_size": 32,
        "intermediate_size": INTERMEDIATE,  # the merger's (real: the text MLP's 13696 / 10944)
        "num_heads": 2,
        "patch_size": PATCH,
        # Learned positions for a 112 px square (8 x 8), bicubic-interpolated to each image's grid.
        "image_size": 112,
        "out_hidden_size": HIDDEN,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "in_channels": 3,
        "rms_norm_eps": 1e-5,
        "hidden_act": "silu",
        "attention_bias": False,
    }


def _text(vocab: int, eos: list[int], pad: int, moe: bool) -> dict[str, Any]:
    text: dict[str, Any] = {
        "model_type": "glm4v_moe_text" if moe else "glm4v_text",
        "vocab_size": vocab,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "max_position_embeddings": CONTEXT,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10_000.0,
        "partial_rotary_factor": 0.5,
        "attention_bias": True,
        "hidden_act": "silu",
        "rope_scaling": {"rope_type": "default", "mrope_section": _MROPE_SECTION},
        "eos_token_id": eos,
        "pad_token_id": pad,
        "tie_word_embeddings": False,
    }
    if moe:
        # GLM-4.5V (106B-A12B): layer 0 dense, then 128 routed experts (top 8, sigmoid scores,
        # grouped top-k) beside one shared expert; here 4 routed, top 2.
        text.update(
            {
                "moe_intermediate_size": HIDDEN // 2,
                "norm_topk_prob": True,
                "n_group": 1,
                "topk_group": 1,
                "n_shared_experts": 1,
                "n_routed_experts": 4,
                "routed_scaling_factor": 1.0,
                "num_experts_per_tok": 2,
                "first_k_dense_replace": 1,
                "use_qk_norm": False,
                "scoring_func": "sigmoid",
                "topk_method": "noaux_tc",
                "rope_scaling": {"rope_type": "default", "mrope_section": _MROPE_SECTION},
            }
        )
    return text


def _files(tokenizer: Tokenizer, moe: bool) -> FamilyFiles:
    ids = token_ids(tokenizer, _SPECIALS)
    # generation_config's stops: <|endoftext|>, <|user|>, <|observation|> (the published list adds
    # one more id, a token these fixtures do not carry).
    eos = [ids["<|endoftext|>"], ids["<|user|>"], ids["<|observation|>"]]
    pad = ids["<|endoftext|>"]
    config = {
        "architectures": ["Glm4vMoeForConditionalGeneration" if moe else "Glm4vForConditionalGeneration"],
        "model_type": "glm4v_moe" if moe else "glm4v",
        "text_config": _text(tokenizer.get_vocab_size(), eos, pad, moe),
        "vision_config": _vision(moe),
        "image_token_id": ids["<|image|>"],
        "video_token_id": ids["<|video|>"],
        "image_start_token_id": ids["<|begin_of_image|>"],
        "image_end_token_id": ids["<|end_of_image|>"],
        "video_start_token_id": ids["<|begin_of_video|>"],
        "video_end_token_id": ids["<|end_of_video|>"],
        "vision_start_token_id": ids["<|begin_of_image|>"],
        "vision_end_token_id": ids["<|end_of_image|>"],
        "eos_token_id": eos,
        "pad_token_id": pad,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }
    preprocessor = {
        "image_processor_type": "Glm4vImageProcessor",
        "processor_class": "Glm4vProcessor",
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "rescale_factor": 1 / 255,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "size": {"shortest_edge": _MIN_PIXELS, "longest_edge": _MAX_PIXELS},
        "patch_size": PATCH,
        "temporal_patch_size": 2,
        "merge_size": 2,
    }
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            templates.GLM4V,
            tokenizer_class="PreTrainedTokenizerFast",
            eos_token="<|endoftext|>",
            pad_token="<|endoftext|>",
            padding_side="left",
            do_lower_case=False,
            remove_space=False,
            extra_special_tokens={"image_token": "<|image|>", "video_token": "<|video|>"},
        ),
        special_tokens_map={"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"},
        generation_config={
            "eos_token_id": eos,
            "pad_token_id": pad,
            "do_sample": True,
            "temperature": 0.8,
            "top_p": 0.6,
            "top_k": 2,
        },
        chat_template=templates.GLM4V,
        extra_json={
            "preprocessor_config.json": preprocessor,
            "processor_config.json": {"processor_class": "Glm4vProcessor"},
        },
    )


def _spec() -> TokenizerSpec:
    return TokenizerSpec(style="bytelevel", trailing_specials=_SPECIALS, added_tokens=_ADDED)


FAMILIES = (
    Family(
        "glm4v",
        "glm4v",
        "zai-org/GLM-4.6V-Flash (and GLM-4.1V-9B: the same dense architecture)",
        _spec(),
        lambda tokenizer: _files(tokenizer, moe=False),
    ),
    Family(
        "glm4v_moe",
        "glm4v_moe",
        "zai-org/GLM-4.5V / GLM-4.6V (106B-A12B mixture of experts)",
        _spec(),
        lambda tokenizer: _files(tokenizer, moe=True),
    ),
)
