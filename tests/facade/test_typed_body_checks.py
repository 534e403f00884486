"""The facade's checks before translation read a typed body (chat completions' and Messages'
translation, `CreateResponseBody`) as they read the JSON it stands for: references counted,
files found, tools counted and measured alike."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.facade import Limits
from vlmserve.facade.documents.pdf_translation import has_file_parts
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.http.limits import check_tools
from vlmserve.facade.responses.item_references import count_references
from vlmserve.responses import parse_body

TEXT = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]}
FILE = {"type": "message", "role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}
OUTPUT_FILE = {
    "type": "function_call_output",
    "call_id": "c",
    "output": [{"type": "input_file", "file_id": "f"}],
}
REFERENCE = {"type": "item_reference", "id": "msg_1"}
TOOL = {"type": "function", "name": "f", "parameters": {"type": "object", "description": "x" * 40}}

# (case, input, references, has files)
INPUTS: list[tuple[str, list[Any], int, bool]] = [
    ("text only", [TEXT], 0, False),
    ("a file in a message", [TEXT, FILE], 0, True),
    ("a file in a tool output", [OUTPUT_FILE], 0, True),
    ("references", [REFERENCE, TEXT, REFERENCE], 2, False),
]


@pytest.mark.parametrize(("case", "items", "references", "files"), INPUTS, ids=[row[0] for row in INPUTS])
def test_input_checks_read_a_typed_body_as_its_json(
    case: str, items: list[Any], references: int, files: bool
) -> None:
    typed = parse_body({"model": "m", "input": items}).input
    assert (count_references(items), count_references(typed)) == (references, references)
    assert (has_file_parts(items), has_file_parts(typed)) == (files, files)


@pytest.mark.parametrize("max_tool_bytes", [10, 200])
def test_a_typed_tool_is_measured_as_its_json(max_tool_bytes: int) -> None:
    limits = Limits(max_tool_bytes=max_tool_bytes)
    typed = parse_body({"model": "m", "input": "x", "tools": [TOOL]}).tools

    def refusal(tools: object) -> str | None:
        try:
            check_tools(tools, limits)
        except APIError as error:
            return error.param
        return None

    assert refusal([TOOL]) == refusal(typed) == ("tools[0]" if max_tool_bytes == 10 else None)
