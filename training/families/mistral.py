"""Mistral Small 3.1 (mistral3 with Pixtral vision) fixture."""

from __future__ import annotations

from tokenizers import Tokenizer

from . import chat_templates as templates
from ._base import (
    HEAD_DIM,
    SENTENCEPIECE_SPECIALS,
    Family,
    FamilyFiles,
    sentencepiece_generation_config,
    text_sizes,
    tokenizer_config,
)
from .vocab import TokenizerSpec, token_ids

_MISTRAL_LEADING = (
    "<unk>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[TOOL_CALLS]",
    "[IMG]",
    "<pad>",
    "[IMG_BREAK]",
    "[IMG_END]",
    "[PREFIX]",
    "[MIDDLE]",
    "[SUFFIX]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
    "[TOOL_CONTENT]",
)
MISTRAL3_LONGEST_EDGE = 112  # patch 14 -> up to 8 x 8 patches, merged 2 x 2 -> 4 x 4 [IMG] rows


def _mistral3(tokenizer: Tokenizer) -> FamilyFiles:
    ids = token_ids(tokenizer, _MISTRAL_LEADING)
    config = {
        "architectures": ["Mistral3ForConditionalGeneration"],
        "model_type": "mistral3",
        "image_token_index": ids["[IMG]"],
        "multimodal_projector_bias": False,
        "projector_hidden_act": "gelu",
        "spatial_merge_size": 2,
        "vision_feature_layer": -1,
        "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "mistral",
            **text_sizes(tokenizer.get_vocab_size()),
            "head_dim": HEAD_DIM,
            "rope_theta": 1_000_000_000.0,
            "sliding_window": None,
            "tie_word_embeddings": False,
        },
        "vision_config": {
            "model_type": "pixtral",
            "head_dim": 16,
            "hidden_act": "silu",
            "hidden_size": 32,
            "image_size": MISTRAL3_LONGEST_EDGE,
            "intermediate_size": 64,
            "num_attention_heads": 2,
            "num_channels": 3,
            "num_hidden_layers": 2,
            "patch_size": 14,
            "rope_theta": 10_000.0,
        },
    }
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            templates.MISTRAL3,
            tokenizer_class="LlamaTokenizerFast",
            add_bos_token=True,
            add_eos_token=False,
            **SENTENCEPIECE_SPECIALS,
            legacy=True,
            processor_class="PixtralProcessor",
        ),
        special_tokens_map=dict(SENTENCEPIECE_SPECIALS),
        generation_config=sentencepiece_generation_config(ids),
        chat_template=templates.MISTRAL3,
        extra_json={
            "preprocessor_config.json": {
                "image_processor_type": "PixtralImageProcessor",
                "processor_class": "PixtralProcessor",
                "do_convert_rgb": True,
                "do_normalize": True,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": [0.48145466, 0.4578275, 0.40821073],
                "image_std": [0.26862954, 0.26130258, 0.27577711],
                "patch_size": {"height": 14, "width": 14},
                "resample": 3,
                "rescale_factor": 1 / 255,
                "size": {"longest_edge": MISTRAL3_LONGEST_EDGE},
            },
            "processor_config.json": {
                "image_break_token": "[IMG_BREAK]",
                "image_end_token": "[IMG_END]",
                "image_token": "[IMG]",
                "patch_size": 14,
                "processor_class": "PixtralProcessor",
                "spatial_merge_size": 2,
            },
        },
    )


FAMILIES = (
    Family(
        "mistral3",
        "mistral3",
        "mistralai/Mistral-Small-3.1-24B-Instruct-2503",
        TokenizerSpec(style="bytelevel", leading_specials=_MISTRAL_LEADING, bos_token="<s>"),
        _mistral3,
    ),
)
