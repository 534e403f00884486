"""`json_size` counts what `json.dumps` would write, without writing it (store/json_text.py)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from vlmserve.facade.store import json_text
from vlmserve.facade.store.json_text import json_pieces, json_size

CASES: list[Any] = [
    "",
    "plain",
    'quote " and backslash \\ and newline \n tab \t nul \x00',
    "non-ASCII é 漢字 and astral 😀",
    {},
    [],
    {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
    [1, 2.5, -3e-7, True, False, None, "x", [], {}],
    {"nested": {"deeper": [{"a": [1, {"b": None}]}]}, "ünïcode kéy": "välue"},
    (1, "tuple"),
    {1: "non-string keys are json.dumps's own"},
]


@pytest.mark.parametrize("value", CASES)
def test_json_size_is_the_length_of_json_dumps(value: Any) -> None:
    assert json_size(value) == len(json.dumps(value))


@pytest.mark.parametrize(
    "text",
    [
        "x" * 10,
        # Escapes and multi-character escapes on both sides of every slice boundary.
        ('"é\n😀\\\x01' * 5)[:-1] + "y" * 3,
        "😀" * 17,
    ],
)
def test_long_strings_are_measured_in_slices(text: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_text, "SLICE_CHARS", 4)
    assert json_size(text) == len(json.dumps(text))
    assert json_size({"input": [text, text]}) == len(json.dumps({"input": [text, text]}))


@pytest.mark.parametrize("value", CASES)
def test_json_pieces_join_to_json_dumps(value: Any) -> None:
    assert "".join(json_pieces(value)) == json.dumps(value)


def test_long_strings_are_written_in_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(json_text, "SLICE_CHARS", 4)
    monkeypatch.setattr(json_text, "_PIECE_CHARS", 8)
    text = ('"é\n😀\\\x01' * 5)[:-1] + "y" * 3
    value = {"input": [{"type": "input_text", "text": text}, text]}
    pieces = list(json_pieces(value))
    assert "".join(pieces) == json.dumps(value)
    assert len(pieces) > 3
    # Each piece is a few slices' escapes at most, never the whole text.
    assert max(len(piece) for piece in pieces) < len(json.dumps(text))
