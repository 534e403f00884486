"""The squares training data is what inference sees (fast: no training, no server).

- the Responses requests the proof sends translate (facade path) to exactly the prompts the
  model was trained on;
- each template has the right image tokens and reply, and the tool-call reply parses;
- the training forward (shared prefix, selected logits) equals mlx-vlm's own forward.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.e2e import squares_requests as req
from tests.e2e.conftest import SQUARES_MODEL
from training.squares import QUESTION, SquaresSample, make_sample
from training.squares_conversations import (
    Conversation,
    agent_first_turn,
    agent_follow_up,
    agent_tool_result,
    image_in_turn,
    png_image_part,
    user_image,
)
from training.squares_eval import is_screenshot_call
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import build_generate_request

MODEL = str(SQUARES_MODEL)


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(MODEL)


def _image(sample: SquaresSample, detail: pb.ImageDetail.ValueType = pb.IMAGE_DETAIL_UNSPECIFIED) -> pb.Part:
    return png_image_part(sample.png_bytes(), detail)


def _follow_up_body(sample: SquaresSample) -> tuple[dict[str, Any], list[Any]]:
    stored_input = req.agent_input(req.captured_with_image(sample))
    stored_output = [
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": sample.answer}]}
    ]
    return req.body(QUESTION, tools=[req.SCREENSHOT_TOOL]), [*stored_input, *stored_output]


TOOLS = {"tools": [req.SCREENSHOT_TOOL]}

# (Responses body and replayed items, the trained conversation it must render like)
CASES: dict[str, Callable[[SquaresSample], tuple[tuple[dict[str, Any], list[Any]], Conversation]]] = {
    "user_input_image": lambda s: (
        (req.body(req.user_image_input(s)), []),
        user_image(_image(s), s.answer, text_first=True),
    ),
    "seed_000": lambda s: (
        (req.body(req.agent_input(req.captured_with_image(s)), **TOOLS), []),
        agent_tool_result(_image(s), s.answer),
    ),
    "seed_003_image_only": lambda s: (
        (req.body(req.agent_input(req.image_only(s)), **TOOLS), []),
        agent_tool_result(_image(s, pb.IMAGE_DETAIL_HIGH), s.answer, with_text=False),
    ),
    "assistant_image": lambda s: (
        (req.body(req.assistant_image_input(s)), []),
        image_in_turn(_image(s), s.answer, with_text=False),
    ),
    "agent_first_turn": lambda s: ((req.body(req.AGENT_PROMPT_INPUT, **TOOLS), []), agent_first_turn()),
    "control_image_removed": lambda s: (
        (req.body(req.agent_input([{"type": "input_text", "text": "captured"}]), **TOOLS), []),
        agent_tool_result(None, s.answer),
    ),
    "control_empty_output": lambda s: (
        (req.body(req.agent_input(""), **TOOLS), []),
        agent_tool_result(None, s.answer, with_text=False),
    ),
    "replayed_follow_up": lambda s: (
        _follow_up_body(s),
        agent_follow_up(_image(s), s.answer, previous_answer=s.answer),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_facade_requests_render_as_trained(case: str, tokenizer: Any) -> None:
    sample = make_sample(11)
    (body, replay), conversation = CASES[case](sample)
    translated = build_generate_request(body, replay=replay).request
    served = render_prompt(translated.messages, template=tokenizer, tools=translated.tools)
    trained = render_prompt(
        lower_messages(conversation.messages), template=tokenizer, tools=conversation.tools
    )
    assert served.text == trained.text
    assert [i.part.data for i in served.images] == [i.part.data for i in trained.images]


@pytest.fixture(scope="module")
def model_float32() -> tuple[Any, Any]:
    import mlx.core as mx
    from mlx.utils import tree_map
    from mlx_vlm.utils import load

    model, processor = load(MODEL)
    # float32 so the comparison below is about the computation, not float16 rounding
    model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    return model, processor


def test_templates_and_forward_match_mlx_vlm(model_float32: tuple[Any, Any]) -> None:
    from training.squares_batches import Tokens, build_templates, image_batch, text_batch
    from training.squares_forward import check_against_model

    model, processor = model_float32
    tokens = Tokens(model, processor)
    image_templates, text_templates = build_templates(tokens)
    assert {t.shape for t in image_templates} >= {
        "user_image",
        "agent_tool_text_image",
        "agent_tool_image_only",
        "assistant_image",
        "agent_follow_up",
    }
    rng = random.Random(5)
    for template in image_templates:
        assert template.n_images == 1
        assert int((template.prompt_ids == tokens.image_token_id).sum()) == 16
        batch, full = image_batch(template, [make_sample(rng.randrange(1000)) for _ in range(2)], tokens)
        check_against_model(model, batch, full)
    for template in text_templates:
        assert template.n_images == 0 and template.target_ids is not None
        reply = processor.tokenizer.decode(list(template.target_ids[:-1]))
        if template.shape == "agent_call":
            assert is_screenshot_call(reply), reply
        else:
            assert reply == "no image"
        batch, full = text_batch(template, tokens)
        check_against_model(model, batch, full)
