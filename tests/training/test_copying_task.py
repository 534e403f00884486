"""The copying task (training/copying.py) asks for exactly one edit, and its answer is that edit."""

from __future__ import annotations

import json
import random

import pytest

from training.copying import (
    code_case,
    copy_case,
    json_case,
    repeat_case,
    unchanged_case,
    vocabulary_words,
    word,
)


@pytest.mark.parametrize("seed", range(50))
def test_json_answer_is_the_object_with_one_field_set(seed: int) -> None:
    case = json_case(random.Random(seed))
    instruction, _, original_text = case.prompt.partition(":\n")
    original, answer = json.loads(original_text), json.loads(case.answer)
    changed = [key for key in original if original[key] != answer[key]]
    assert list(answer) == list(original) and len(changed) == 1
    assert (
        instruction
        == f"Return this JSON with {json.dumps(changed[0])} set to {json.dumps(answer[changed[0]])}"
    )


@pytest.mark.parametrize("seed", range(50))
def test_code_answer_replaces_exactly_the_named_line(seed: int) -> None:
    case = code_case(random.Random(seed))
    header, _, block = case.prompt.partition(":\n")
    old, new = header.split("`")[1], header.split("`")[3]
    before = block.removeprefix("```python\n").removesuffix("\n```").split("\n")
    after = case.answer.removeprefix("```python\n").removesuffix("\n```").split("\n")
    differing = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    assert len(differing) == 1
    assert before[differing[0]].strip() == old and after[differing[0]].strip() == new


def test_cases_are_seeded_and_varied() -> None:
    first = [copy_case(random.Random(seed)) for seed in range(20)]
    assert first == [copy_case(random.Random(seed)) for seed in range(20)]
    assert len({case.prompt for case in first}) == 20


@pytest.mark.parametrize("seed", range(20))
def test_unchanged_answer_is_the_prompts_block_verbatim(seed: int) -> None:
    case = unchanged_case(random.Random(seed))
    instruction, _, block = case.prompt.partition(":\n")
    assert instruction in ("Return this JSON unchanged", "Return this function unchanged")
    assert case.answer == block


def test_pure_copies_come_only_when_asked() -> None:
    assert [copy_case(random.Random(seed), 0.0) for seed in range(20)] == [
        copy_case(random.Random(seed)) for seed in range(20)
    ]
    assert all("unchanged" in copy_case(random.Random(seed), 1.0).prompt for seed in range(20))


@pytest.mark.parametrize("seed", range(20))
def test_repeat_answer_is_the_prompts_text_verbatim(seed: int) -> None:
    case = repeat_case(random.Random(seed))
    instruction, _, text = case.prompt.partition(":\n")
    assert instruction == "Return this text unchanged" and case.answer == text
    assert 8 <= len(text.split(" ")) <= 40


def test_names_are_one_or_two_whole_word_pieces_of_the_tokenizer() -> None:
    pieces = set(vocabulary_words())
    assert len(pieces) > 1500 and all(piece.isalpha() and piece.islower() for piece in pieces)
    rng = random.Random(0)
    for _ in range(200):
        name = word(rng)
        assert any(name == a or (name.startswith(a) and name[len(a) :] in pieces) for a in pieces)
