"""The family fixture builder: hub-shaped directories that mlx-vlm loads with the real classes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests._family_models import FAMILY_NAMES
from training.families import FAMILIES, build_family
from training.families import chat_templates as templates

pytestmark = pytest.mark.needs_model

# What mlx-vlm 0.7.10 + transformers 5 give each family: (processor, image processor).
EXPECTED_CLASSES = {
    "qwen2_5_vl": ("Qwen2_5_VLProcessor", "Qwen3VLImageProcessor"),
    "qwen3_vl": ("Qwen3VLProcessor", "Qwen3VLImageProcessor"),
    "qwen3_vl_thinking": ("Qwen3VLProcessor", "Qwen3VLImageProcessor"),
    "qwen3_vl_moe": ("Qwen3VLProcessor", "Qwen3VLImageProcessor"),
    "qwen3_5": ("Qwen3VLProcessor", "Qwen3VLImageProcessor"),
    "qwen3_5_moe": ("Qwen3VLProcessor", "Qwen3VLImageProcessor"),
    "gemma3": ("Gemma3Processor", "Gemma3ImageProcessorPil"),
    "gemma4": ("Gemma4Processor", "Gemma4ImageProcessor"),
    "idefics3": ("Idefics3Processor", "Idefics3ImageProcessorPil"),
    "mistral3": ("Mistral3Processor", "PixtralImageProcessor"),
    "llama4": ("Llama4Processor", "Llama4ImageProcessor"),
    "llava": ("LlavaProcessor", "CLIPImageProcessorPil"),
    # transformers' GLM-4V image processor without torchvision: its PIL backend (no torch needed).
    "glm4v": ("Glm46VProcessor", "Glm4vImageProcessorPil"),
    "glm4v_moe": ("Glm46VMoEProcessor", "Glm4vImageProcessorPil"),
}
TEMPLATES = {
    "qwen2_5_vl": templates.QWEN2_5_VL,
    "qwen3_vl": templates.QWEN3_VL,
    "qwen3_vl_thinking": templates.QWEN3_VL_THINKING,
    "qwen3_vl_moe": templates.QWEN3_VL,
    "qwen3_5": templates.QWEN3_VL,
    "qwen3_5_moe": templates.QWEN3_VL,
    "gemma3": templates.GEMMA3,
    "gemma4": templates.GEMMA4,
    "idefics3": templates.IDEFICS3,
    "mistral3": templates.MISTRAL3,
    "llama4": templates.LLAMA4,
    "llava": templates.LLAVA,
    "glm4v": templates.GLM4V,
    "glm4v_moe": templates.GLM4V,
}
HUB_FILES = {
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "chat_template.json",
    "preprocessor_config.json",
    "processor_config.json",
    "model.safetensors",
}


def test_every_family_is_covered() -> None:
    assert set(EXPECTED_CLASSES) == set(FAMILY_NAMES) == set(TEMPLATES)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_directory_is_hub_shaped_and_small(name: str, family_models: dict[str, Path]) -> None:
    model_dir = family_models[name]
    assert {p.name for p in model_dir.iterdir()} >= HUB_FILES
    config = json.loads((model_dir / "config.json").read_text())
    assert config["model_type"] == FAMILIES[name].model_type
    assert config["architectures"][0].endswith("ForConditionalGeneration")
    assert sum(p.stat().st_size for p in model_dir.iterdir()) < 2_000_000


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_loads_with_the_family_classes_and_template(name: str, family_models: dict[str, Path]) -> None:
    from mlx_vlm.utils import load

    model, processor = load(str(family_models[name]))  # strict: every weight matches the model
    tokenizer: Any = processor.tokenizer
    assert (type(processor).__name__, type(processor.image_processor).__name__) == EXPECTED_CLASSES[name]
    assert tokenizer.chat_template == TEMPLATES[name]
    assert model.config.model_type == FAMILIES[name].model_type
    # The processor's image placeholder is one token of the tokenizer (not split into pieces).
    image_token = processor.image_token
    assert tokenizer.convert_tokens_to_ids(image_token) != tokenizer.unk_token_id
    assert len(tokenizer.encode(image_token, add_special_tokens=False)) == 1
    # The configured eos ids are the real set: the end-of-turn token always among them.
    eos_ids = set(tokenizer.stopping_criteria.eos_token_ids)
    end_of_turn = {
        "gemma3": "<end_of_turn>",
        "gemma4": "<turn|>",
        "idefics3": "<end_of_utterance>",
        "mistral3": "</s>",
        "llama4": "<|eot|>",
        "llava": "</s>",
        "glm4v": "<|user|>",  # GLM ends its turn by starting the next one's role
        "glm4v_moe": "<|user|>",
    }.get(name, "<|im_end|>")
    assert tokenizer.convert_tokens_to_ids(end_of_turn) in eos_ids


def test_the_command_writes_the_named_family_and_is_deterministic(
    tmp_path: Path, family_models: dict[str, Path]
) -> None:
    subprocess.run(
        [sys.executable, "-m", "training.make_family_fixtures", "--out", str(tmp_path), "--family", "gemma3"],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert [p.name for p in tmp_path.iterdir()] == ["gemma3"]
    for path in family_models["gemma3"].iterdir():
        assert (tmp_path / "gemma3" / path.name).read_bytes() == path.read_bytes(), path.name


def test_rebuilding_replaces_the_directory(tmp_path: Path) -> None:
    out = tmp_path / "qwen2_5_vl"
    out.mkdir()
    (out / "stale.txt").write_text("left over")
    build_family(FAMILIES["qwen2_5_vl"], out)
    assert not (out / "stale.txt").exists()
