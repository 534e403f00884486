"""Incremental detokenization with the fixture tokenizer: streamed pieces join to the full decode."""

from __future__ import annotations

from typing import Any

import pytest
from transformers import AutoTokenizer

from vlmserve.engine.model import DEFAULT_MODEL_PATH
from vlmserve.engine.output.detokenizer import IncrementalDetokenizer


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(DEFAULT_MODEL_PATH))


@pytest.mark.parametrize(
    "text",
    [
        "Hello world, this is a test.",
        "ftpftpftpftpftp",  # no spaces: must still stream token by token
        "naïve café — 日本語 😀 done",  # multi-byte characters split across byte-level tokens
        'def f(x):\n    return {"a": [1, 2]}\n',
        "<tool_call>\n{}\n</tool_call>",
    ],
)
def test_pieces_join_to_the_full_decode(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    pieces = [detokenizer.add(token) for token in ids]
    pieces.append(detokenizer.flush())
    assert "".join(pieces) == tokenizer.decode(ids) == text
    assert "\ufffd" not in "".join(pieces)


def test_text_without_spaces_streams_before_the_end(tokenizer: Any) -> None:
    ids = tokenizer.encode("ftp" * 10, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    emitted = [detokenizer.add(token) for token in ids]
    assert sum(1 for piece in emitted if piece) >= len(ids) - 1


def test_special_tokens_are_not_text(tokenizer: Any) -> None:
    detokenizer = IncrementalDetokenizer(tokenizer)
    im_start = tokenizer.convert_tokens_to_ids("<|im_start|>")
    assert detokenizer.add(im_start) == ""
    hello = tokenizer.encode("hi", add_special_tokens=False)
    assert "".join(detokenizer.add(t) for t in hello) + detokenizer.flush() == "hi"


def test_kept_special_tokens_are_text_and_others_are_skipped(tokenizer: Any) -> None:
    vision_start = tokenizer.convert_tokens_to_ids("<|vision_start|>")  # special: skipped by default
    box_start = tokenizer.convert_tokens_to_ids("<|box_start|>")
    ids = [*tokenizer.encode("ab", add_special_tokens=False), vision_start, box_start]
    ids += tokenizer.encode("cd", add_special_tokens=False)
    plain = IncrementalDetokenizer(tokenizer)
    kept = IncrementalDetokenizer(tokenizer, keep={vision_start: "<|vision_start|>"})
    assert "".join(plain.add(t) for t in ids) + plain.flush() == "abcd"
    assert "".join(kept.add(t) for t in ids) + kept.flush() == "ab<|vision_start|>cd"


def test_preview_is_what_each_token_would_add_next(tokenizer: Any) -> None:
    # Logprob alternatives: each candidate's text after the same tokens, without adding it.
    text = "naïve 日本"
    ids = tokenizer.encode(text, add_special_tokens=False)
    detokenizer = IncrementalDetokenizer(tokenizer)
    for token in ids:
        (previewed,) = detokenizer.preview([token])
        added = detokenizer.add(token)
        # What the token adds, or (inside a character) the partial text it would leave.
        assert previewed == added or (not added and previewed.endswith("\ufffd"))
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    world = tokenizer.encode(" world", add_special_tokens=False)[0]
    assert detokenizer.preview([world, im_end]) == [" world", "<|im_end|>"]
    assert detokenizer.flush() == ""  # previews add nothing
