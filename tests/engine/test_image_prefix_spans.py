"""The prefix cache tells images apart on every family: a prompt with another image behind the
same text is not served the first image's KV (tests/engine/test_families.py's engines and
reference, one family at a time)."""

from __future__ import annotations

import pytest

from tests.engine._family_engine import (
    MAX_TOKENS,
    SYSTEM,
    FamilyEngine,
    family,
    greedy,
    image,
    png,
    reference_generate,
    text,
    user,
)
from vlmserve.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.needs_model

__all__ = ["family"]  # the fixture, imported for this module


def test_another_image_behind_the_same_text_is_seen(family: FamilyEngine) -> None:
    """Gemma 3, LLaVA, Mistral 3 and Llama 4 name their image token `image_token_index` (Llama 4
    also keeps a default `image_token_id`): their prompts had no image spans, so the second
    request reused the first one's KV, image positions included, and answered about the first."""
    asks = [
        [SYSTEM, user(image(png(64, 48, seed=seed)), text("What is in this picture?"))] for seed in (51, 52)
    ]
    for messages in asks:
        result = family.stub.GenerateUnary(
            pb.GenerateUnaryRequest(request=greedy(messages)), timeout=120
        ).result
        expected_text, expected_prompt_tokens = reference_generate(family.reference, messages, MAX_TOKENS)
        assert (result.reasoning_text + result.text, result.usage.input_tokens) == (
            expected_text,
            expected_prompt_tokens,
        )
