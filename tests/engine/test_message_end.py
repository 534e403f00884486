"""Where a prompt's last message ends (loop/message_end.py): which generation prompts a template
renders differently once the turn is answered, and the boundary before them. Tables of fake
templates (a character-level tokenizer), plus the real templates of the family fixtures."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.loop.message_end import message_end, rerendered_generation_prompts

Render = Callable[[list[dict[str, str]], bool, bool | None], str]


class CharTokenizer:
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]


class FakeTemplate:
    def __init__(self, render: Render) -> None:
        self.render = render

    def apply_chat_template(
        self, messages: list[dict[str, str]], *, add_generation_prompt: bool, tokenize: bool, **switch: Any
    ) -> str:
        return self.render(messages, add_generation_prompt, switch.get("enable_thinking"))


def turns(messages: list[dict[str, str]]) -> str:
    return "".join(f"<{m['role']}>{m['content']}</>" for m in messages)


def qwen_like(messages: list[dict[str, str]], generation: bool, thinking: bool | None) -> str:
    # The answer is rendered as `<assistant>...`: the generation prompt is rendered again.
    return turns(messages) + ("<assistant>" if generation else "")


def gemma4_like(messages: list[dict[str, str]], generation: bool, thinking: bool | None) -> str:
    # Thinking off adds an empty thought channel the rendered answer does not have.
    empty_thought = "" if thinking else "[thought][/thought]"
    return turns(messages) + (f"<assistant>{empty_thought}" if generation else "")


def no_clean_suffix(messages: list[dict[str, str]], generation: bool, thinking: bool | None) -> str:
    # The generation prompt changes the text before it (nothing to cut at).
    return turns(messages) + ("!<assistant>[x]" if generation else ".")


def broken(messages: list[dict[str, str]], generation: bool, thinking: bool | None) -> str:
    raise ValueError("this template renders nothing")


def ids(text: str) -> tuple[int, ...]:
    return tuple(ord(c) for c in text)


@pytest.mark.parametrize(
    ("render", "expected"),
    [
        (qwen_like, ()),
        # thinking unset and off: the empty channel; thinking on: rendered again
        (gemma4_like, (ids("<assistant>[thought][/thought]"),)),
        (no_clean_suffix, ()),
        (broken, ()),
    ],
)
def test_generation_prompts_rendered_otherwise_once_answered(
    render: Render, expected: tuple[tuple[int, ...], ...]
) -> None:
    assert rerendered_generation_prompts(FakeTemplate(render), CharTokenizer()) == expected


@pytest.mark.parametrize(
    ("prompt", "suffixes", "expected"),
    [
        ((1, 2, 3, 7, 8), [(7, 8)], 3),
        ((1, 2, 3, 7, 8), [(9, 8)], None),
        ((1, 2, 3, 7, 8), [], None),
        ((1, 2, 3, 7, 8), [(8,), (3, 7, 8)], 2),  # the longest that matches
        ((7, 8), [(7, 8)], None),  # nothing before it: no message to end
        ((), [(7, 8)], None),
    ],
)
def test_message_end(prompt: tuple[int, ...], suffixes: list[tuple[int, ...]], expected: int | None) -> None:
    assert message_end(prompt, suffixes) == expected


@pytest.mark.needs_model
@pytest.mark.parametrize(("name", "rerendered"), [("gemma4", True), ("gemma3", False), ("qwen3_5", False)])
def test_the_family_templates(name: str, rerendered: bool, family_models: dict[str, Path]) -> None:  # noqa: F811
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(family_models[name])
    found = rerendered_generation_prompts(tokenizer, tokenizer)
    assert bool(found) == rerendered
    if rerendered:  # Gemma 4, thinking off: `<|turn>model\n<|channel>thought\n<channel|>`
        assert tokenizer.decode(list(found[0])) == "<|turn>model\n<|channel>thought\n<channel|>"
