"""The committed squares model sees: accuracy per conversation shape, by real generation.

In-process (no server): each conversation is lowered, rendered by the engine's `render_prompt`,
its images decoded from PNG bytes, and answered by greedy `mlx_vlm.generate` on the model
loaded by the unchanged `mlx_vlm.load`. Fresh images from a seed the training never used.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import SQUARES_MODEL
from training.squares import NO_IMAGE_ANSWER, make_samples
from training.squares_conversations import agent_first_turn
from training.squares_eval import SHAPES, generate_reply, is_correct, is_screenshot_call

MODEL_TEST_SEED = 31_337
IMAGES_PER_SHAPE = 50
MIN_ACCURACY = 0.95

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


def test_model_is_small_and_loads_with_plain_mlx_vlm(squares_mlx: tuple[Any, Any]) -> None:
    model, _ = squares_mlx
    weights = SQUARES_MODEL / "model.safetensors"
    assert weights.stat().st_size < 5_000_000
    assert model.config.model_type == "qwen2_vl"
    config = json.loads((SQUARES_MODEL / "config.json").read_text())
    assert config["vision_config"]["depth"] == 2 and config["num_hidden_layers"] == 3


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_answers_with_the_image(shape: str, squares_mlx: tuple[Any, Any]) -> None:
    model, processor = squares_mlx
    samples = make_samples(MODEL_TEST_SEED, IMAGES_PER_SHAPE)
    wrong = []
    for sample in samples:
        conversation = SHAPES[shape](sample, True)
        reply = generate_reply(model, processor, conversation)
        if not is_correct(conversation, reply):
            wrong.append((sample.answer, reply))
    accuracy = 1 - len(wrong) / len(samples)
    assert accuracy >= MIN_ACCURACY, f"{shape}: {accuracy:.2f}, wrong: {wrong[:5]}"


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_says_no_image_without_it(shape: str, squares_mlx: tuple[Any, Any]) -> None:
    """The same conversations with the image missing: `no image`, never a confident count."""
    model, processor = squares_mlx
    # Without the image the prompt does not depend on the sample, except for the earlier
    # answer a replayed follow-up carries; a few samples cover that.
    samples = make_samples(MODEL_TEST_SEED + 1, 5)
    replies = [generate_reply(model, processor, SHAPES[shape](sample, False)) for sample in samples]
    assert [reply.strip() for reply in replies] == [NO_IMAGE_ANSWER] * len(samples), replies


def test_agent_first_turn_calls_screenshot(squares_mlx: tuple[Any, Any]) -> None:
    model, processor = squares_mlx
    reply = generate_reply(model, processor, agent_first_turn())
    assert is_screenshot_call(reply), reply
