"""Token logprobs on the real engine (random-weight fixture): sane numbers, aligned with the text.

Every listed token's text is the part of the visible text it produced, so the tokens spell the
visible text exactly, streamed and not, also when a stop sequence cuts the text, when a grammar
constrains it, and when reasoning is split off (logprobs.py).
"""

from __future__ import annotations

import concurrent.futures
import json
import math
from pathlib import Path

import pytest
import regex

from tests.engine._family_engine import running_engine, text, user
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .conftest import InProcessEngine
from .test_engine_grpc import request, status_of, stream, text_part

pytestmark = pytest.mark.needs_model

TOLERANCE = 1e-4


def with_logprobs(top: int, **fields: float | int | list[str]) -> pb.SamplingParams:
    return pb.SamplingParams(logprobs=True, top_logprobs=top, **fields)  # type: ignore[arg-type]


def spelled(entries: list[pb.TokenLogprob]) -> str:
    return "".join(entry.token for entry in entries)


def streamed_logprobs(chunks: list[pb.GenerateChunk]) -> list[pb.TokenLogprob]:
    return [entry for chunk in chunks for entry in chunk.logprobs]


def assert_sane(entries: list[pb.TokenLogprob], top: int, *, greedy: bool) -> None:
    assert entries
    for entry in entries:
        assert entry.logprob <= TOLERANCE and math.isfinite(entry.logprob)
        alternatives = [alternative.logprob for alternative in entry.top_logprobs]
        assert 0 < len(alternatives) <= top
        assert alternatives == sorted(alternatives, reverse=True)
        assert sum(math.exp(value) for value in alternatives) <= 1 + TOLERANCE
        # The chosen token is never more likely than the most likely one; greedy: it is that one.
        assert entry.logprob <= alternatives[0] + TOLERANCE
        if greedy:
            assert abs(entry.logprob - alternatives[0]) <= TOLERANCE


def test_greedy_logprobs_are_the_top_of_the_list_and_spell_the_text(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    req = request(text_part("Count to ten."), max_tokens=24, sampling=with_logprobs(5, temperature=0.0))
    chunks, (result,) = stream(stub, req)
    assert_sane(list(result.logprobs), 5, greedy=True)
    assert spelled(list(result.logprobs)) == result.text
    assert streamed_logprobs(chunks) == list(result.logprobs)
    assert spelled(streamed_logprobs(chunks)) == "".join(chunk.text for chunk in chunks)
    assert len(result.logprobs) <= result.usage.output_tokens
    unary = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result
    assert list(unary.logprobs) == list(result.logprobs)


def test_sampled_logprobs_do_not_change_the_tokens(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    plain = pb.SamplingParams(temperature=1.0, seed=11)
    base = stub.GenerateUnary(
        pb.GenerateUnaryRequest(request=request(max_tokens=32, sampling=plain)), timeout=60
    ).result
    assert not base.logprobs
    req = request(max_tokens=32, sampling=with_logprobs(3, temperature=1.0, seed=11))
    _, (result,) = stream(stub, req)
    assert result.text == base.text
    assert_sane(list(result.logprobs), 3, greedy=False)
    assert spelled(list(result.logprobs)) == result.text
    # Without top_logprobs: the chosen token only.
    only = stub.GenerateUnary(
        pb.GenerateUnaryRequest(
            request=request(max_tokens=32, sampling=with_logprobs(0, temperature=1.0, seed=11))
        ),
        timeout=60,
    ).result
    assert [e.logprob for e in only.logprobs] == [e.logprob for e in result.logprobs]
    assert all(not entry.top_logprobs for entry in only.logprobs)


def test_a_stop_sequence_trims_the_tokens_too(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    def run(*stop: str) -> tuple[list[pb.GenerateChunk], pb.GenerateResult]:
        req = request(max_tokens=40, sampling=with_logprobs(2, temperature=1.0, seed=5, stop=list(stop)))
        chunks, (result,) = stream(stub, req)
        return chunks, result

    _, base = run()
    middle = len(base.text) // 2
    stop = base.text[middle : middle + 3]
    chunks, cut = run(stop)
    assert cut.text == base.text[: base.text.index(stop)]
    assert spelled(list(cut.logprobs)) == cut.text
    assert streamed_logprobs(chunks) == list(cut.logprobs)
    assert [e.logprob for e in cut.logprobs] == [e.logprob for e in base.logprobs][: len(cut.logprobs)]


SURE = {
    "type": "object",
    "properties": {"sure": {"type": "boolean"}},
    "required": ["sure"],
    "additionalProperties": False,
}
SURE_TEXT = regex.compile(r'\{\s*"sure"\s*:\s*(true|false)\s*\}')


def test_under_a_grammar_only_allowed_tokens_are_listed(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    req = request(
        text_part("Sure?"),
        max_tokens=40,
        response_format=pb.ResponseFormat(
            json_schema=pb.JsonSchemaFormat(name="sure", schema_json=json.dumps(SURE), strict=True)
        ),
        sampling=with_logprobs(20, temperature=1.0, seed=2),
    )
    _, (result,) = stream(stub, req)
    assert json.loads(result.text)["sure"] in (True, False)
    assert spelled(list(result.logprobs)) == result.text
    so_far = ""
    for entry in result.logprobs:
        for alternative in entry.top_logprobs:
            # Each alternative keeps the output a prefix of some text the schema allows.
            assert SURE_TEXT.fullmatch(so_far + alternative.token, partial=True), (so_far, alternative.token)
        # Masked tokens are gone: what is listed holds all the probability when fewer than asked.
        if len(entry.top_logprobs) < 20:
            assert abs(sum(math.exp(a.logprob) for a in entry.top_logprobs) - 1) <= 1e-3
        so_far += entry.token


def test_logprobs_only_for_the_answer_not_the_thinking(family_models: dict[str, Path]) -> None:
    req = pb.GenerateRequest(
        messages=[user(text("Think, then answer."))],
        sampling=pb.SamplingParams(temperature=1.0, seed=3, max_tokens=60, logprobs=True, top_logprobs=1),
    )
    with running_engine(family_models["qwen3_vl_thinking"]) as (_engine, thinking_stub):
        responses = list(thinking_stub.Generate(req, timeout=120))
    chunks = [response.chunk for response in responses if response.HasField("chunk")]
    result = responses[-1].complete
    assert result.reasoning_text
    assert spelled(list(result.logprobs)) == result.text
    assert streamed_logprobs(chunks) == list(result.logprobs)
    assert len(result.logprobs) <= result.usage.output_tokens - result.usage.reasoning_tokens


def test_top_logprobs_out_of_range_is_invalid_argument(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    for sampling in (with_logprobs(21), pb.SamplingParams(top_logprobs=1)):
        code, message = status_of(lambda s=sampling: list(stub.Generate(request(sampling=s), timeout=30)))
        assert code.name == "INVALID_ARGUMENT" and "sampling.top_logprobs" in message


def test_batched_rows_score_as_they_would_alone(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    # Two requests decode together (one asks for logprobs, one not, as in a mixed batch); each
    # gets the tokens, and the first its numbers, that it gets alone.
    asking = request(text_part("One"), max_tokens=32, sampling=with_logprobs(4, temperature=1.0, seed=21))
    other = request(text_part("Two"), max_tokens=32, sampling=pb.SamplingParams(temperature=1.0, seed=22))
    alone = [stream(stub, req)[1][0] for req in (asking, other)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        together = list(pool.map(lambda req: stream(stub, req)[1][0], (asking, other)))
    assert [r.text for r in together] == [r.text for r in alone]
    assert not together[1].logprobs
    assert spelled(list(together[0].logprobs)) == together[0].text
    for mine, solo in zip(together[0].logprobs, alone[0].logprobs, strict=True):
        assert mine.logprob == pytest.approx(solo.logprob, abs=1e-3)
        assert [t.token for t in mine.top_logprobs][:1] == [t.token for t in solo.top_logprobs][:1]
