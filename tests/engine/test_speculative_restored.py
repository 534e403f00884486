"""Speculation on rows restored from a prefix snapshot (issue 33 item 5): on the hybrid Qwen3.5
fixture (Gated DeltaNet + attention, whose recurrent state an entry keeps at turn boundaries), an
agent's next turn restored from the snapshot at the end of its previous turn and then decoded
with prompt lookup, or with a model drafter (the checkpoint's MTP head, a DFlash drafter, an
EAGLE-3 drafter on the deeper target), takes exactly the tokens it takes with
`--speculative off` from a fresh prefill: greedy and seeded (a high temperature, so any
difference in the logits shows), alone and with a fresh row in the same batch. A rejected draft
rolls the recurrent state back (speculation/rollback.py) from a state that was restored, not
computed, and the drafter starts over a prompt whose prefix it never saw run."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._family_models import drafter_models  # noqa: F401  (fixture)
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import JobReport, PreparedRequest
from vlmserve.engine.loop.generator import Generator

from . import _drafter_scenarios as scenarios
from ._runs import run
from ._step_gate import verify_every_step
from .test_batching import prepared
from .test_engine_grpc import image_part, png, text_part

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]

MODES = ("off", "lookup", "draft")


@pytest.fixture(autouse=True)
def verifying(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step verifies (the step gate decides from measured costs otherwise, which vary with
    the machine's load), as in test_speculative_drafters.py."""
    verify_every_step(monkeypatch)


@pytest.fixture(
    scope="module", params=["qwen3_5", "qwen3_5_dflash", "qwen3_5_eagle3"], ids=["mtp", "dflash", "eagle3"]
)
def engines(
    request: pytest.FixtureRequest,
    drafter_models: dict[str, tuple[Path, Path]],  # noqa: F811
) -> Iterator[dict[str, Generator]]:
    """`off`, `lookup` and `draft` (the drafter of the param) on its qwen3_5 target, each with
    the prefix cache of the prefix-reuse tests (tests/engine/_runs.py `reusing_engine`)."""
    target, drafter = drafter_models[request.param]
    generators = {}
    for mode in MODES:
        generator = Generator(
            EngineConfig(
                model=str(target),
                warmup=False,
                speculative=mode,
                draft_model=str(drafter) if mode == "draft" else None,
                prefix_cache_min_tokens=8,
                prefill_chunk_tokens=16,
                step_tokens=24,
                max_output_tokens=64,
            )
        )
        generator.start()
        assert generator.ready.wait(120), generator.load_error
        generators[mode] = generator
    yield generators
    for generator in generators.values():
        generator.stop()


def extended(request: PreparedRequest, *more: tuple[int, ...]) -> PreparedRequest:
    return dataclasses.replace(
        request, prompt_ids=tuple(t for part in (request.prompt_ids, *more) for t in part)
    )


def turns(
    generator: Generator, firsts: dict[str, PreparedRequest], fresh: PreparedRequest, tag: str
) -> tuple[dict[str, JobReport], dict[str, JobReport]]:
    """Each first turn, then its next turn (the answer fed back and more of the prompt's words,
    which prompt lookup finds) restored from the first turn's snapshot, with `fresh` beside them."""
    assert generator.prefix_cache is not None
    generator.prefix_cache.clear()
    first = run(generator, firsts, f"{tag}-1")
    follows = {
        name: extended(request, tuple(first[name].token_ids), request.prompt_ids[-10:])
        for name, request in firsts.items()
    }
    return first, run(generator, {**follows, "fresh": fresh}, f"{tag}-2")


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_restored_rows_speculate_to_the_tokens_they_take_without_speculation(
    engines: dict[str, Generator], temperature: float
) -> None:
    plain = engines["off"]
    words = "Copy this list: red box, blue box, green box, red box, blue box. "
    firsts = {
        "image": prepared(
            plain,
            image_part(png((64, 64), seed=21)),
            text_part(words * 3),
            temperature=temperature,
            seed=31,
            max_tokens=12,
        ),
        "text": prepared(plain, text_part(words * 4), temperature=temperature, seed=32, max_tokens=12),
    }
    fresh = prepared(plain, text_part("Something else entirely. " * 5), temperature=temperature, seed=33)
    before = scenarios.draft_counts(engines["draft"])
    lookups_before = scenarios.count(engines["lookup"], "drafted_tokens", "lookup")
    results = {mode: turns(engines[mode], firsts, fresh, f"{mode}-{temperature}") for mode in MODES}
    # Off, from a fresh prefill: what every engine's restored rows must take.
    plain.prefix_cache.clear()  # type: ignore[union-attr]
    follows = {
        name: extended(request, tuple(results["off"][0][name].token_ids), request.prompt_ids[-10:])
        for name, request in firsts.items()
    }
    cold = {
        name: tuple(run(plain, {name: request}, f"cold-{temperature}-{name}")[name].token_ids)
        for name, request in {**follows, "fresh": fresh}.items()
    }
    for mode, (first, second) in results.items():
        for name, request in firsts.items():
            assert first[name].token_ids == results["off"][0][name].token_ids, (mode, name)
            turn = len(request.prompt_ids) + len(first[name].token_ids)
            if mode == "off":
                assert second[name].cached_tokens in (turn - 1, turn), name  # the end of the turn
            else:
                # From a snapshot: the end of the turn, or, for a row that left while a verify of
                # drafts was in flight (its recurrent state then runs past its tokens), the end
                # of its prompt (the template renders the generation prompt again).
                assert second[name].cached_tokens in (len(request.prompt_ids), turn - 1, turn), (mode, name)
        assert {name: tuple(report.token_ids) for name, report in second.items()} == cold, mode
    drafted, _ = scenarios.drafted_since(engines["draft"], before)
    assert drafted > 0
    assert scenarios.count(engines["lookup"], "drafted_tokens", "lookup") > lookups_before
