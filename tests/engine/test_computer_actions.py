"""Computer use in the engine (issue 35, docs/computer-use.md): each family's coordinate
convention, the action conversions, the request adapter and the grammar it yields (no action
that does not parse, no point off the screen)."""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from llguidance import LLMatcher
from PIL import Image
from transformers import AutoTokenizer

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.computer.actions import ActionError, model_schema, to_contract, to_model
from vlmserve.engine.computer.adapter import adapt_request
from vlmserve.engine.computer.conventions import Convention, convention_for
from vlmserve.engine.grammar.compiler import GrammarCompiler, constraint_for
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb

RELATIVE = convention_for("qwen2_vl")
RESIZED = Convention("resized_pixels", factor=28, min_pixels=56 * 56, max_pixels=28 * 28 * 100)


def png(width: int, height: int) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", (width, height), (255, 255, 255)).save(buffer, format="PNG")
    return buffer.getvalue()


def image_size(part: pb.ImagePart) -> tuple[int, int]:
    with Image.open(io.BytesIO(part.data)) as image:
        return image.size


@pytest.mark.parametrize(
    ("architecture", "kind"),
    [
        ("qwen2_vl", "relative"),
        ("qwen3_vl", "relative"),
        ("qwen2_5_vl", "resized_pixels"),
        ("gemma3", "relative"),
        ("glm4v", "relative"),  # GLM-4.5V/4.6V's grounding boxes: 0-1000 across the image
        ("glm4v_moe", "relative"),
    ],
)
def test_each_family_has_its_convention(architecture: str, kind: str) -> None:
    assert convention_for(architecture).kind == kind


@pytest.mark.parametrize(
    ("convention", "size", "model_point", "screen_point"),
    [
        (RELATIVE, (112, 112), (125, 375), (14, 42)),  # the squares-click cell centres
        (RELATIVE, (336, 336), (125, 875), (42, 294)),
        (RELATIVE, (1920, 1080), (1000, 1000), (1919, 1079)),  # the far edge is the last pixel
        (RELATIVE, (1920, 1080), (500, 500), (960, 540)),
        # 1920x1080 resized within 78,400 px: 364x196 (factor 28); pixel 182 of 364 is the middle
        (RESIZED, (1920, 1080), (182, 98), (960, 540)),
    ],
)
def test_model_points_map_to_the_screen_and_back(
    convention: Convention, size: tuple[int, int], model_point: tuple[int, int], screen_point: tuple[int, int]
) -> None:
    space = convention.space(*size)
    assert space.to_screen(*model_point) == screen_point
    # Back to the model and out again: exact up to the model scale's step (1000 steps across
    # 1920 pixels: 2 pixels).
    again = space.to_screen(*space.to_model(*screen_point))
    assert abs(again[0] - screen_point[0]) <= size[0] / space.model_width
    assert abs(again[1] - screen_point[1]) <= size[1] / space.model_height


def test_the_resized_convention_uses_the_processors_resize() -> None:
    space = RESIZED.space(1920, 1080)
    assert (space.model_width, space.model_height) == (364, 196)


@pytest.mark.parametrize(
    ("contract", "model"),
    [
        (
            {"type": "click", "button": "left", "x": 14, "y": 42},
            {"action": "left_click", "coordinate": [125, 375]},
        ),
        (
            {"type": "click", "button": "right", "x": 14, "y": 42},
            {"action": "right_click", "coordinate": [125, 375]},
        ),
        (
            {"type": "click", "button": "wheel", "x": 14, "y": 42},
            {"action": "middle_click", "coordinate": [125, 375]},
        ),
        ({"type": "double_click", "x": 14, "y": 42}, {"action": "double_click", "coordinate": [125, 375]}),
        ({"type": "move", "x": 14, "y": 42}, {"action": "mouse_move", "coordinate": [125, 375]}),
        (
            {"type": "scroll", "x": 14, "y": 42, "scroll_x": 0, "scroll_y": -120},
            {"action": "scroll", "coordinate": [125, 375], "scroll_x": 0, "scroll_y": -120},
        ),
        (
            {"type": "drag", "path": [{"x": 14, "y": 42}, {"x": 42, "y": 14}]},
            {"action": "left_click_drag", "path": [[125, 375], [375, 125]]},
        ),
        ({"type": "type", "text": "hello"}, {"action": "type", "text": "hello"}),
        ({"type": "keypress", "keys": ["CTRL", "C"]}, {"action": "key", "keys": ["CTRL", "C"]}),
        ({"type": "wait"}, {"action": "wait"}),
        ({"type": "screenshot"}, {"action": "screenshot"}),
    ],
)
def test_actions_convert_both_ways(contract: dict[str, Any], model: dict[str, Any]) -> None:
    space = RELATIVE.space(112, 112)
    assert to_model(contract, space) == model
    assert to_contract(json.dumps(model), space) == contract


@pytest.mark.parametrize(
    ("action", "field"),
    [
        ({"type": "fly"}, "type"),
        ({"type": "click", "button": "left", "x": 112, "y": 3}, "x"),
        ({"type": "click", "button": "left", "x": -1, "y": 3}, "x"),
        ({"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 500, "y": 2}]}, "path[1].x"),
        ({"type": "click", "button": "thumb", "x": 1, "y": 3}, "button"),
    ],
)
def test_bad_replayed_actions_name_their_field(action: dict[str, Any], field: str) -> None:
    with pytest.raises(ActionError) as raised:
        to_model(action, RELATIVE.space(112, 112))
    assert raised.value.field == field


def request(*messages: pb.Message, display: int = 0) -> pb.GenerateRequest:
    tool = pb.Tool(computer=pb.ComputerTool(display_width=display, display_height=display))
    return pb.GenerateRequest(messages=messages, tools=[tool])


def user(text: str) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=text))])


def call(action: dict[str, Any], call_id: str = "c1") -> pb.Message:
    return pb.Message(
        role=pb.ROLE_ASSISTANT,
        tool_calls=[
            pb.ToolCall(id=call_id, name="computer", arguments=json.dumps(action), kind=pb.TOOL_KIND_COMPUTER)
        ],
    )


def screenshot(width: int, height: int, call_id: str = "c1") -> pb.Message:
    output = pb.ToolOutput(call_id=call_id, kind=pb.TOOL_KIND_COMPUTER)
    output.parts.parts.append(pb.Part(image=pb.ImagePart(data=png(width, height), media_type="image/png")))
    return pb.Message(role=pb.ROLE_TOOL, tool_output=output)


def test_the_adapter_offers_a_strict_function_and_maps_replayed_calls() -> None:
    adapted, calls = adapt_request(
        request(
            user("Click red."),
            call({"type": "screenshot"}),
            screenshot(224, 224),
            call({"type": "click", "button": "left", "x": 28, "y": 84}, "c2"),
            screenshot(224, 224, "c2"),
        ),
        RELATIVE,
        image_size,
    )
    [tool] = adapted.tools
    assert tool.function.name == "computer" and tool.function.strict
    assert "coordinate" in tool.function.parameters_json
    replayed = [json.loads(c.arguments) for m in adapted.messages for c in m.tool_calls]
    assert replayed == [{"action": "screenshot"}, {"action": "left_click", "coordinate": [125, 375]}]
    assert all(c.kind == pb.TOOL_KIND_FUNCTION for m in adapted.messages for c in m.tool_calls)
    assert calls is not None
    out = calls.call(
        pb.ToolCall(id="c3", name="computer", arguments='{"action": "left_click", "coordinate": [875, 125]}')
    )
    assert out.kind == pb.TOOL_KIND_COMPUTER
    assert json.loads(out.arguments) == {"type": "click", "button": "left", "x": 196, "y": 28}
    # A computer call's argument deltas are held back: it streams whole.
    assert calls.delta(pb.ToolCallDelta(id="c3", name="computer", arguments="{")) is None
    assert calls.delta(pb.ToolCallDelta(id="c3", arguments="}")) is None


def test_without_a_screen_only_blind_actions_are_offered() -> None:
    adapted, _ = adapt_request(request(user("Click red.")), RELATIVE, image_size)
    assert "coordinate" not in adapted.tools[0].function.parameters_json
    sized, _ = adapt_request(request(user("Click red."), display=1024), RELATIVE, image_size)
    assert "coordinate" in sized.tools[0].function.parameters_json


def test_a_display_size_is_the_screen_the_coordinates_are_in() -> None:
    _, calls = adapt_request(
        request(user("x"), call({"type": "screenshot"}), screenshot(112, 112), display=1000),
        RELATIVE,
        image_size,
    )
    assert calls is not None
    out = calls.call(
        pb.ToolCall(id="c", name="computer", arguments='{"action": "mouse_move", "coordinate": [500, 250]}')
    )
    assert json.loads(out.arguments) == {"type": "move", "x": 500, "y": 250}


@pytest.mark.parametrize(
    ("action", "field"),
    [
        ({"type": "click", "button": "left", "x": 300, "y": 3}, "messages[3].tool_calls[0].arguments.x"),
        ({"type": "teleport"}, "messages[3].tool_calls[0].arguments.type"),
    ],
)
def test_a_bad_replayed_call_is_invalid_argument_naming_it(action: dict[str, Any], field: str) -> None:
    with pytest.raises(RequestError) as raised:
        adapt_request(
            request(user("x"), call({"type": "screenshot"}), screenshot(224, 224), call(action, "c2")),
            RELATIVE,
            image_size,
        )
    assert raised.value.field == field


def test_a_request_without_computer_use_is_left_alone() -> None:
    plain = pb.GenerateRequest(messages=[user("hi")])
    assert adapt_request(plain, RELATIVE, image_size) == (plain, None)


@pytest.fixture(scope="module")
def compiler() -> GrammarCompiler:
    tokenizer = AutoTokenizer.from_pretrained(RANDOM_MODEL_PATH)
    return GrammarCompiler(tokenizer, [tokenizer.eos_token_id])


def accepts(compiler: GrammarCompiler, tools: Any, arguments: str) -> bool:
    constraint = constraint_for(
        compiler,
        tool_call_format="hermes",
        tools=tools,
        tool_mode="required",
        forced_name=None,
        parallel_tool_calls=False,
        max_tool_calls=None,
        response_format=None,
    )
    assert constraint is not None
    matcher = LLMatcher(compiler.tokenizer, constraint.grammar)
    text = f'<tool_call>\n{{"name": "computer", "arguments": {arguments}}}\n</tool_call>'
    tokenizer = AutoTokenizer.from_pretrained(RANDOM_MODEL_PATH)
    return all(matcher.consume_token(token) for token in tokenizer.encode(text, add_special_tokens=False))


@pytest.mark.parametrize(
    ("arguments", "allowed"),
    [
        ('{"action": "left_click", "coordinate": [1000, 0]}', True),
        ('{"action": "left_click", "coordinate": [1001, 0]}', False),
        ('{"action": "left_click", "coordinate": [5]}', False),
        ('{"action": "left_click"}', False),
        ('{"action": "teleport", "coordinate": [1, 2]}', False),
        ('{"action": "left_click", "coordinate": [1, 2], "extra": 1}', False),
        ('{"action": "key", "keys": ["ctrl", "c"]}', True),
        ('{"action": "scroll", "coordinate": [1, 2], "scroll_x": 0, "scroll_y": -5}', True),
    ],
)
def test_the_grammar_admits_only_actions_on_the_screen(
    compiler: GrammarCompiler, arguments: str, allowed: bool
) -> None:
    adapted, _ = adapt_request(
        request(user("x"), call({"type": "screenshot"}), screenshot(112, 112)), RELATIVE, image_size
    )
    assert accepts(compiler, adapted.tools, arguments) is allowed


def test_the_resized_convention_bounds_the_grammar_to_the_resized_screen(compiler: GrammarCompiler) -> None:
    adapted, _ = adapt_request(
        request(user("x"), call({"type": "screenshot"}), screenshot(1920, 1080)), RESIZED, image_size
    )
    assert accepts(compiler, adapted.tools, '{"action": "left_click", "coordinate": [363, 195]}')
    assert not accepts(compiler, adapted.tools, '{"action": "left_click", "coordinate": [364, 0]}')
    assert not accepts(compiler, adapted.tools, '{"action": "left_click", "coordinate": [0, 196]}')


def test_schema_without_screen_has_no_pointer_actions() -> None:
    assert "left_click" not in json.dumps(model_schema(None))
