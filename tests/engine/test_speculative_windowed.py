"""Speculative decoding on a sliding-window family (Gemma 3's fixture: layers with a 32-position
window, mlx-vlm's `BatchRotatingKVCache`, between full-attention layers) is lossless: with
`--speculative lookup` every request generates exactly the tokens and usage it generates with
`--speculative off` — greedy and seeded sampling, alone and in a mixed batch (lookup rows, a plain
row, a json_schema row, a logprobs row). The prompts are longer than the window (or pass it
while they generate), so drafts are
verified and rolled back on wrapped windows (kv/rollback.py `_roll_back_windowed`; unit-tested
against each row alone in test_kv_rollback.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.loop.generator import Generator

from ._runs import run, run_each_alone
from .test_speculative_decoding import _counter, _generator, _requests, bytes_text

pytestmark = pytest.mark.needs_model


@pytest.fixture(scope="module")
def windowed(family_models: dict[str, Path]) -> Iterator[tuple[Generator, Generator]]:  # noqa: F811
    # A low position cost (Apple silicon's): drafts are verified in the mixed batch too.
    settings = {"prefill_chunk_tokens": 32, "step_tokens": 48, "speculative_position_cost": 0.01}
    plain = _generator("off", family_models["gemma3"], **settings)
    speculative = _generator("lookup", family_models["gemma3"], **settings)
    yield plain, speculative
    plain.stop()
    speculative.stop()


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_speculation_on_a_windowed_family_changes_no_token(
    windowed: tuple[Generator, Generator], temperature: float
) -> None:
    plain, speculative = windowed
    requests = _requests(plain, temperature)
    # Every prompt but "short" is past the window before the first draft; "short" (14 tokens)
    # passes it while it generates.
    assert all(len(req.prompt_ids) > 32 for name, req in requests.items() if name != "short")
    rows = _counter(speculative, "speculative_verified_rows")
    accepted = _counter(speculative, "speculative_accepted_tokens")
    expected = run_each_alone(plain, requests, f"w-alone-{temperature}")
    alone = run_each_alone(speculative, requests, f"w-spec-alone-{temperature}")
    together = run(speculative, requests, f"w-mixed-{temperature}")
    for name in requests:
        assert alone[name].token_ids == expected[name].token_ids, name
        assert together[name].token_ids == expected[name].token_ids, name
        assert together[name].output_tokens == expected[name].output_tokens, name
    assert _counter(speculative, "speculative_verified_rows") > rows
    assert _counter(speculative, "speculative_accepted_tokens") > accepted
    json.loads(bytes_text(speculative, together["schema"]))
