"""SmolVLM (idefics3) fixture."""

from __future__ import annotations

from tokenizers import Tokenizer

from . import chat_templates as templates
from ._base import (
    Family,
    FamilyFiles,
    text_sizes,
    tokenizer_config,
)
from .vocab import TokenizerSpec, token_ids

_SMOLVLM_LEADING = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_SMOLVLM_TRAILING = (
    "<fake_token_around_image>",
    "<image>",
    *(f"<row_{r}_col_{c}>" for r in range(1, 7) for c in range(1, 7)),
    "<global-img>",
    "<end_of_utterance>",
)
IDEFICS3_TILE_SIDE = 64
IDEFICS3_TILE_TOKENS = 16  # 64 px / patch 8 = 8 x 8 patches, pixel-shuffled by 2 -> 16


def _idefics3(tokenizer: Tokenizer) -> FamilyFiles:
    ids = token_ids(tokenizer, (*_SMOLVLM_LEADING, *_SMOLVLM_TRAILING))
    end_of_utterance = ids["<end_of_utterance>"]
    config = {
        "architectures": ["Idefics3ForConditionalGeneration"],
        "model_type": "idefics3",
        "image_token_id": ids["<image>"],
        "scale_factor": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
        "pad_token_id": ids["<|im_end|>"],
        "text_config": {
            "model_type": "llama",
            **text_sizes(tokenizer.get_vocab_size()),
            "rope_theta": 273_768.0,
            "tie_word_embeddings": False,
            "bos_token_id": ids["<|im_start|>"],
            "eos_token_id": end_of_utterance,
            "pad_token_id": ids["<|im_end|>"],
        },
        "vision_config": {
            "model_type": "idefics3",
            "hidden_size": 32,
            "intermediate_size": 64,
            "num_hidden_layers": 2,
            "num_attention_heads": 2,
            "image_size": IDEFICS3_TILE_SIDE,
            "patch_size": 8,
        },
    }
    return FamilyFiles(
        config=config,
        tokenizer_config=tokenizer_config(
            tokenizer,
            templates.IDEFICS3,
            tokenizer_class="GPT2Tokenizer",
            add_prefix_space=False,
            bos_token="<|im_start|>",
            eos_token="<end_of_utterance>",
            pad_token="<|im_end|>",
            unk_token="<|endoftext|>",
            additional_special_tokens=["<fake_token_around_image>", "<image>", "<end_of_utterance>"],
            processor_class="Idefics3Processor",
        ),
        special_tokens_map={
            "bos_token": "<|im_start|>",
            "eos_token": "<end_of_utterance>",
            "pad_token": "<|im_end|>",
            "unk_token": "<|endoftext|>",
            "additional_special_tokens": ["<fake_token_around_image>", "<image>", "<end_of_utterance>"],
        },
        generation_config={
            "bos_token_id": ids["<|im_start|>"],
            "eos_token_id": end_of_utterance,
            "pad_token_id": ids["<|im_end|>"],
        },
        chat_template=templates.IDEFICS3,
        extra_json={
            "preprocessor_config.json": {
                "image_processor_type": "Idefics3ImageProcessor",
                "processor_class": "Idefics3Processor",
                "do_convert_rgb": True,
                "do_image_splitting": True,
                "do_normalize": True,
                "do_pad": True,
                "do_rescale": True,
                "do_resize": True,
                "image_mean": [0.5, 0.5, 0.5],
                "image_std": [0.5, 0.5, 0.5],
                "max_image_size": {"longest_edge": IDEFICS3_TILE_SIDE},
                "resample": 1,
                "rescale_factor": 1 / 255,
                "size": {"longest_edge": 2 * IDEFICS3_TILE_SIDE},
            },
            "processor_config.json": {
                "image_seq_len": IDEFICS3_TILE_TOKENS,
                "processor_class": "Idefics3Processor",
            },
        },
    )


FAMILIES = (
    Family(
        "idefics3",
        "idefics3",
        "HuggingFaceTB/SmolVLM-Instruct",
        TokenizerSpec(
            style="bytelevel", leading_specials=_SMOLVLM_LEADING, trailing_specials=_SMOLVLM_TRAILING
        ),
        _idefics3,
    ),
)
