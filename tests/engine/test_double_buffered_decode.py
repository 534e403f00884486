"""Double-buffered decode (batch.py): step n+1's forward is built and started before step n's
tokens are accepted, so the accept work (detokenizing, stops, events) runs while the model
computes; sampling still waits for the accept, so logits processors see every token first.

Shown on the random fixture model by the order of the engine's own calls: the forwards launched
before each token is accepted, and no forward launched for a request whose last token is in
flight. (Token identity with the request alone and with mlx-vlm is test_batching.py's.)
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind
from vlmserve.engine.loop.batch import DecodeBatch
from vlmserve.engine.loop.decode import ActiveGeneration
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.v1 import engine_pb2 as pb

from ._logits_hooks import with_hooks
from .test_engine_grpc import text_part

pytestmark = pytest.mark.needs_model


@pytest.fixture(scope="module")
def generator() -> Iterator[Generator]:
    generator = Generator(
        EngineConfig(
            model=str(RANDOM_MODEL_PATH), max_output_tokens=64, prefix_cache_min_tokens=0, warmup=False
        )
    )
    generator.start()
    assert generator.ready.wait(60), generator.load_error
    yield generator
    generator.stop()


def job(generator: Generator, name: str, *, max_tokens: int, processors: tuple[Any, ...] = ()) -> Job:
    assert generator.preparer is not None
    request = generator.preparer.prepare(
        pb.GenerateRequest(
            messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part(f"Count to ten, {name}.")])],
            sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0),
        ),
        kind=JobKind.GENERATE,
    )
    return Job(with_hooks(request, *processors, request_id=name), None)


def record_calls(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, str]]:
    """('launch', '') for each decode forward started, ('accept', request id) for each token."""
    calls: list[tuple[str, str]] = []
    launch, accept = DecodeBatch.launch, ActiveGeneration.accept

    def recorded_launch(self: DecodeBatch[ActiveGeneration]) -> None:
        launch(self)
        if self._logits is not None:
            calls.append(("launch", ""))

    def recorded_accept(self: ActiveGeneration, token: int, score: Any = None) -> None:
        calls.append(("accept", self.job.request_id))
        accept(self, token, score)

    monkeypatch.setattr(DecodeBatch, "launch", recorded_launch)
    monkeypatch.setattr(ActiveGeneration, "accept", recorded_accept)
    return calls


def test_the_next_forward_is_running_before_a_token_is_accepted(
    generator: Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_calls(monkeypatch)
    seen: list[int] = []

    def sees_every_token(tokens: Any, logits: Any) -> Any:
        seen.append(int(tokens.size))
        return logits

    generator.submit(job(generator, "alone", max_tokens=6, processors=(sees_every_token,)))
    assert generator.wait_idle(60)
    report = generator.reports[-1]
    assert report.output_tokens == 6
    # Token 1 comes from the prefill; token k >= 2 is accepted after the forward that feeds it
    # back has been launched (k - 1 forwards before it: a step that waited for its own tokens
    # would have launched k - 2), then the last token needs no forward at all.
    order = [kind for kind, _ in calls]
    expected = ["accept", "launch", "launch", "accept", "launch", "accept", "launch", "accept"]
    assert order == [*expected, "launch", "accept", "accept"], order
    # The logits processor saw each token before the next was sampled (prompt + 0 ... 5 generated).
    assert seen == [seen[0] + k for k in range(6)]


def test_a_row_that_ends_early_leaves_before_the_next_token_is_sampled(
    generator: Generator, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = record_calls(monkeypatch)
    sampled: dict[str, int] = {"short": 0, "long": 0}

    def counting(name: str) -> Any:
        def processor(tokens: Any, logits: Any) -> Any:
            sampled[name] += 1
            return logits

        return processor

    short = job(generator, "short", max_tokens=3, processors=(counting("short"),))
    long = job(generator, "long", max_tokens=8, processors=(counting("long"),))
    generator.submit(short)
    generator.submit(long)
    assert generator.wait_idle(60)
    reports = {r.request_id: r for r in list(generator.reports)[-2:]}
    assert reports["short"].output_tokens == 3 and reports["long"].output_tokens == 8
    # Each request's processor ran once per token it got: none for a token never accepted.
    assert sampled == {"short": 3, "long": 8}
    assert [c for c in calls if c[0] == "accept"].count(("accept", "long")) == 8
