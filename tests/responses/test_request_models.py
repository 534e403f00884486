"""The request models: liberal about what clients add, exact about where an error is."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from vlmserve.responses import InvalidRequestError, parse_body
from vlmserve.responses._input_models import (
    FunctionCallOutputParam,
    FunctionCallParam,
    InputImagePartParam,
    ItemReferenceParam,
    MessageParam,
    ReasoningParam,
)
from vlmserve.responses._tool_models import CustomToolParam, HostedToolParam, NamespaceToolParam

CODEX_DATA = Path(__file__).resolve().parents[1] / "codex" / "data"


@pytest.mark.parametrize("name", ["codex_request_turn2.json", "codex_request_known_model_turn1.json"])
def test_what_codex_sends_validates_as_it_is(name: str) -> None:
    recorded = json.loads((CODEX_DATA / name).read_text())
    body = parse_body(recorded)
    assert isinstance(body.input, list) and len(body.input) == len(recorded["input"])
    kinds = {type(tool) for tool in body.tools or []}
    assert HostedToolParam in kinds and (NamespaceToolParam in kinds or CustomToolParam in kinds)
    # Unknown fields are kept, not dropped: ids, statuses, client_metadata.
    assert body.model_extra is not None and "client_metadata" in body.model_extra
    first = body.input[0]
    assert isinstance(first, MessageParam) and first.model_extra == {"id": recorded["input"][0]["id"]}
    if name == "codex_request_turn2.json":
        output = next(item for item in body.input if isinstance(item, FunctionCallOutputParam))
        assert isinstance(output.output, list) and isinstance(output.output[0], InputImagePartParam)
        assert any(isinstance(item, FunctionCallParam) for item in body.input)


def test_items_without_type_are_messages_or_references() -> None:
    body = parse_body(
        {
            "input": [
                {"role": "user", "content": "hi", "phase": "x"},
                {"id": "msg_1"},
                {"type": "reasoning", "summary": [], "encrypted_content": "..."},
            ]
        }
    )
    assert isinstance(body.input, list)
    assert [type(item) for item in body.input] == [MessageParam, ItemReferenceParam, ReasoningParam]


@pytest.mark.parametrize(
    ("given", "param", "code"),
    [
        (
            [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
                {"role": "user", "content": [{"type": "image_url", "image_url": 7}]},
            ],
            "input[2].content[0].image_url",
            "invalid_type",
        ),
        (
            [{"type": "function_call_output", "call_id": "c", "output": [{"type": "input_text", "text": 1}]}],
            "input[0].output[0].text",
            "invalid_type",
        ),
        (
            [{"role": "user", "content": [{"type": "input_image", "detail": "max"}]}],
            "input[0].content[0].detail",
            "invalid_value",
        ),
    ],
)
def test_param_is_the_json_path_of_the_error(given: Any, param: str, code: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        parse_body({"input": given})
    assert (caught.value.param, caught.value.code) == (param, code)
    assert "#" not in caught.value.message  # union tags never leak into messages


def test_types_are_strict_not_coerced() -> None:
    for field, value in (("max_output_tokens", "5"), ("temperature", "1"), ("stream", 1), ("store", "true")):
        with pytest.raises(InvalidRequestError) as caught:
            parse_body({"input": "hi", field: value})
        assert (caught.value.param, caught.value.code) == (field, "invalid_type")
