"""Prefix reuse for families whose caches are not plain KV: Gemma 3's sliding-window layers
(`RotatingKVCache`, window 32 in the fixture) and Llama 4's chunked attention (`ChunkedKVCache`,
chunks of 32). Such a cache's state after n tokens is not a prefix of a longer state, so the
prefix cache keeps the whole state and serves it only to a prompt that extends *all* of it —
the agent's case: the next turn resends the conversation so far, the model's own answer
included. Prompts here are longer than the window/chunk, so a wrong restore would show.
Seeded sampling at a high temperature: any difference in the logits shows in the tokens."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.loop.generator import Generator

from ._runs import reusing_engine, run
from .test_batching import prepared
from .test_engine_grpc import text_part

WINDOWED = ["gemma3", "llama4"]


@pytest.fixture(params=WINDOWED)
def windowed(request: pytest.FixtureRequest, family_models: dict[str, Path]) -> Iterator[Generator]:  # noqa: F811
    with reusing_engine(family_models[request.param]) as generator:
        yield generator


def extended(request: PreparedRequest, generated: tuple[int, ...], more: tuple[int, ...]) -> PreparedRequest:
    return dataclasses.replace(request, prompt_ids=(*request.prompt_ids, *generated, *more))


def test_the_next_turn_continues_from_the_kept_state_with_identical_output(windowed: Generator) -> None:
    first = prepared(
        windowed, text_part("Tell me about shelves. " * 6), temperature=1.5, seed=3, max_tokens=10
    )
    assert len(first.prompt_ids) > 40  # past the window / chunk
    turn_one = run(windowed, {"r": first}, "w1")["r"]
    more = first.prompt_ids[-12:]  # the "next user turn": more tokens of the same vocabulary
    follow = extended(first, turn_one.token_ids[:-1], more)
    warm = run(windowed, {"r": follow}, "w2")["r"]
    assert windowed.prefix_cache is not None
    windowed.prefix_cache.clear()
    cold = run(windowed, {"r": follow}, "w2-cold")["r"]
    # The state after the prompt and the answer fed back (the last sampled token never went in).
    assert warm.cached_tokens == len(first.prompt_ids) + len(turn_one.token_ids) - 1
    assert cold.cached_tokens == 0
    assert warm.token_ids == cold.token_ids


def test_a_prompt_that_leaves_the_kept_path_is_computed_not_served(windowed: Generator) -> None:
    first = prepared(windowed, text_part("Count the boxes. " * 8), temperature=1.5, seed=4, max_tokens=6)
    turn_one = run(windowed, {"r": first}, "d1")["r"]
    changed = list(first.prompt_ids)
    changed[len(changed) // 2] = changed[len(changed) // 2 - 1]  # differs inside the kept state
    branch = dataclasses.replace(first, prompt_ids=(*changed, *turn_one.token_ids, *first.prompt_ids[-6:]))
    taken = run(windowed, {"r": branch}, "d2")["r"]
    assert taken.cached_tokens == 0


def test_a_turn_rendered_differently_continues_from_the_end_of_the_prompt(windowed: Generator) -> None:
    """The template may render the model's answer otherwise than it was generated (a tool call it
    never wrote, its thinking dropped): the state at the prompt's end is kept too."""
    first = prepared(windowed, text_part("Stack the crates. " * 8), temperature=1.5, seed=5, max_tokens=6)
    run(windowed, {"r": first}, "e1")
    rendered = tuple(reversed(first.prompt_ids[-9:]))  # not what was generated
    follow = extended(first, rendered, first.prompt_ids[-6:])
    warm = run(windowed, {"r": follow}, "e2")["r"]
    assert warm.cached_tokens == len(first.prompt_ids)
    assert windowed.prefix_cache is not None
    windowed.prefix_cache.clear()
    assert warm.token_ids == run(windowed, {"r": follow}, "e2-cold")["r"].token_ids
