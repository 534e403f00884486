"""Prefix reuse for hybrid models (Qwen3.5/3.6: Gated DeltaNet `ArraysCache` layers beside full
attention): the recurrent state has no prefixes, so an entry keeps it at the boundaries an agent's
next turn shares — the end of the prompt and the end of the generated turn — and a prompt takes
the longest one its shared prefix reaches, the attention layers cut to the same position. What
follows a restore must be exactly what a fresh prefill gives: greedy, and seeded sampling at a
high temperature (any difference in the logits shows in the tokens)."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import pytest

from training.families import DRAFTER_FAMILIES, build_family
from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.loop.generator import Generator

from ._runs import reusing_engine, run
from .test_batching import prepared
from .test_engine_grpc import image_part, png, text_part

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Generator]:
    # The qwen3_5 fixture (Gated DeltaNet + full attention, built as the drafters' target).
    model = build_family(DRAFTER_FAMILIES["qwen3_5"], tmp_path_factory.mktemp("hybrid") / "qwen3_5")
    with reusing_engine(model) as generator:
        yield generator


def extended(request: PreparedRequest, *more: tuple[int, ...]) -> PreparedRequest:
    return dataclasses.replace(
        request, prompt_ids=tuple(t for part in (request.prompt_ids, *more) for t in part)
    )


def cold(generator: Generator, request: PreparedRequest, tag: str) -> tuple[int, ...]:
    assert generator.prefix_cache is not None
    generator.prefix_cache.clear()
    report = run(generator, {"r": request}, tag)["r"]
    assert report.cached_tokens == 0
    return tuple(report.token_ids)


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_the_next_turn_restores_the_end_of_the_turn_with_identical_output(
    hybrid: Generator, temperature: float
) -> None:
    first = prepared(
        hybrid,
        image_part(png((64, 64), seed=5)),
        text_part("Tell me about shelves. " * 6),
        temperature=temperature,
        seed=3,
        max_tokens=10,
    )
    turn_one = run(hybrid, {"r": first}, f"h1-{temperature}")["r"]
    more = first.prompt_ids[-12:]  # the "next user turn": more tokens of the same vocabulary
    follow = extended(first, tuple(turn_one.token_ids[:-1]), more)
    warm = run(hybrid, {"r": follow}, f"h2-{temperature}")["r"]
    # The state after the prompt and the answer fed back (the last sampled token never went in).
    assert warm.cached_tokens == len(first.prompt_ids) + len(turn_one.token_ids) - 1
    assert tuple(warm.token_ids) == cold(hybrid, follow, f"h2-cold-{temperature}")


def test_a_turn_rendered_differently_restores_the_end_of_the_prompt(hybrid: Generator) -> None:
    """The template may render the model's answer otherwise than it was generated (thinking
    dropped, tool calls re-serialised): the prompt's end is still shared."""
    first = prepared(hybrid, text_part("Count the boxes. " * 8), temperature=0.0, seed=4, max_tokens=6)
    turn_one = run(hybrid, {"r": first}, "p1")["r"]
    rendered = tuple(reversed(first.prompt_ids[-9:]))  # not what was generated
    follow = extended(first, rendered, first.prompt_ids[-6:])
    warm = run(hybrid, {"r": follow}, "p2")["r"]
    assert turn_one.token_ids[0] != rendered[0] or turn_one.token_ids[:3] != rendered[:3]
    assert warm.cached_tokens == len(first.prompt_ids)
    assert tuple(warm.token_ids) == cold(hybrid, follow, "p2-cold")


def test_a_prompt_that_leaves_before_any_boundary_is_computed(hybrid: Generator) -> None:
    first = prepared(hybrid, text_part("Sort the papers. " * 8), temperature=0.0, seed=6, max_tokens=6)
    run(hybrid, {"r": first}, "b1")
    changed = list(first.prompt_ids)
    changed[len(changed) // 2] = changed[len(changed) // 2 - 1]  # differs before the prompt's end
    branch = dataclasses.replace(first, prompt_ids=(*changed, *first.prompt_ids[-6:]))
    assert run(hybrid, {"r": branch}, "b2")["r"].cached_tokens == 0


def test_restored_rows_decode_in_one_batch_with_a_fresh_one(hybrid: Generator) -> None:
    """Two next turns restored from their entries and an unrelated prompt run together: each gives
    exactly what it gives alone from a fresh prefill."""
    firsts = {
        name: prepared(hybrid, text_part(text * 7), temperature=1.5, seed=seed, max_tokens=8)
        for name, text, seed in (("a", "Open the door. ", 11), ("b", "Close the window please. ", 12))
    }
    turn_one = run(hybrid, firsts, "t1")
    # Each answer whole, as a template renders it (its end token included): a row that left after
    # its last token went into a forward has it in its state, one that left before has not.
    follows = {
        name: extended(req, tuple(turn_one[name].token_ids), req.prompt_ids[-8:])
        for name, req in firsts.items()
    }
    fresh = prepared(
        hybrid, text_part("Something else entirely. " * 5), temperature=1.5, seed=13, max_tokens=8
    )
    together = run(hybrid, {**follows, "fresh": fresh}, "t2")
    for name, req in firsts.items():
        turn = len(req.prompt_ids) + len(turn_one[name].token_ids)
        assert together[name].cached_tokens in (turn - 1, turn)
    alone = {name: cold(hybrid, req, f"t2-cold-{name}") for name, req in {**follows, "fresh": fresh}.items()}
    assert {name: tuple(report.token_ids) for name, report in together.items()} == alone
