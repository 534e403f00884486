"""Speculative decoding in the batched engine is lossless: every request generates exactly the
tokens it generates with `--speculative off` — greedy and seeded sampling, alone and in a mixed
batch (rows with and without drafts, a constrained row, a logprobs row, a row that joins late),
on the random fixture, whose loops give prompt lookup plenty to draft — and the drafts really
were verified (the engine's speculation metrics)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import JobKind, JobReport, PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.drafter import SOURCES
from vlmserve.engine.v1 import engine_pb2 as pb

from ._runs import run, run_each_alone
from ._step_gate import verify_every_step
from .test_engine_grpc import text_part

MAX_TOKENS = 40
RECORD = {"name": "alpha", "count": 42, "tags": ["x", "y"], "owner": {"id": 7, "role": "admin"}}
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "count": {"type": "integer"}, "ok": {"type": "boolean"}},
    "required": ["name", "count", "ok"],
    "additionalProperties": False,
}


def _generator(speculative: str, model: Path = RANDOM_MODEL_PATH, **settings: Any) -> Generator:
    """A started engine on `model` (no prefix cache, no warm-up); `settings`: more EngineConfig."""
    config = EngineConfig(
        **{
            "max_active": 8,
            "max_queue": 16,
            **settings,
            "model": str(model),
            "max_output_tokens": 64,
            "prefix_cache_min_tokens": 0,
            "speculative": speculative,
            "warmup": False,
        }
    )
    generator = Generator(config)
    generator.start()
    assert generator.ready.wait(120), generator.load_error
    return generator


@pytest.fixture(scope="module")
def generators() -> Iterator[tuple[Generator, Generator]]:
    plain, speculative = _generator("off"), _generator("lookup")
    yield plain, speculative
    plain.stop()
    speculative.stop()


def _requests(generator: Generator, temperature: float) -> dict[str, PreparedRequest]:
    assert generator.preparer is not None
    copy = f"Return this JSON unchanged: {json.dumps(RECORD)} and again {json.dumps(RECORD)}"

    def prepare(name: str, text: str, seed: int, **fields: object) -> PreparedRequest:
        request = pb.GenerateRequest(
            request_id=name,
            messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part(text)])],
            sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=seed),
            **fields,  # type: ignore[arg-type]
        )
        assert generator.preparer is not None
        return generator.preparer.prepare(request, kind=JobKind.GENERATE)

    return {
        "copy": prepare("copy", copy, 1),
        "short": prepare("short", "Hi.", 2),
        "list": prepare("list", " ".join(f"item {i % 5} is on the list;" for i in range(20)), 3),
        "schema": prepare(
            "schema",
            "Describe a person as JSON.",
            4,
            response_format=pb.ResponseFormat(
                json_schema=pb.JsonSchemaFormat(name="p", schema_json=json.dumps(SCHEMA), strict=True)
            ),
        ),
        "logprobs": dataclasses.replace(
            prepare("logprobs", copy, 5),
            settings=dataclasses.replace(
                prepare("logprobs", copy, 5).settings, logprobs=True, top_logprobs=2
            ),
        ),
    }


def _counter(generator: Generator, name: str) -> float:
    """A speculation counter summed over its draft sources."""
    registry = generator.metrics.registry
    values = (
        registry.get_sample_value(f"vlmserve_engine_{name}_total", {"source": source}) for source in SOURCES
    )
    return sum(value or 0.0 for value in values)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculation_changes_no_token_alone_or_in_a_mixed_batch(
    generators: tuple[Generator, Generator], temperature: float
) -> None:
    plain, speculative = generators
    requests = _requests(plain, temperature)
    drafted = _counter(speculative, "speculative_drafted_tokens")
    accepted = _counter(speculative, "speculative_accepted_tokens")
    expected = run_each_alone(plain, requests, f"alone-{temperature}")
    alone = run_each_alone(speculative, requests, f"alone-{temperature}")
    together = run(speculative, requests, f"mixed-{temperature}")
    for name in requests:
        assert alone[name].token_ids == expected[name].token_ids, name
        assert together[name].token_ids == expected[name].token_ids, name
        assert together[name].output_tokens == expected[name].output_tokens, name  # usage unchanged
    assert _counter(speculative, "speculative_drafted_tokens") > drafted
    assert _counter(speculative, "speculative_accepted_tokens") > accepted
    json.loads(bytes_text(speculative, together["schema"]))  # the constrained row still validates


def bytes_text(generator: Generator, report: JobReport) -> str:
    assert generator.loaded is not None
    text: str = generator.loaded.tokenizer.decode(
        [t for t in report.token_ids if t not in generator.loaded.eos_token_ids]
    )
    return text


def test_speculation_verifies_several_tokens_per_forward(
    generators: tuple[Generator, Generator], monkeypatch: pytest.MonkeyPatch
) -> None:
    # What a verify of a copy keeps, whatever the step gate (speculation/step_cost.py) would
    # choose from this machine's measured costs and the tests before: every step may verify,
    # widths and a new row's rate from the priors.
    verify_every_step(monkeypatch)
    _, speculative = generators
    rows = _counter(speculative, "speculative_verified_rows")
    accepted = _counter(speculative, "speculative_accepted_tokens")
    requests = _requests(speculative, 0.0)
    run(speculative, {"copy": requests["copy"]}, "per-forward")
    rows = _counter(speculative, "speculative_verified_rows") - rows
    accepted = _counter(speculative, "speculative_accepted_tokens") - accepted
    assert rows > 0 and accepted / rows > 1.0  # more than two tokens per verify on average
