"""An llguidance runtime limit during constrained output (issue 26, finding 13): a required tool
call came back `completed` and empty, with no call. The processor now records why its grammar
could not be followed, and the request fails (gRPC ABORTED, the facade's
`constrained_decoding_failed`) instead of ending as a silent success. Real llguidance with a
small lexer-fuel limit, on the real engine with the random-weight model."""

from __future__ import annotations

from typing import Any

import grpc
import llguidance
import pytest

from vlmserve.engine.grammar.processor import GrammarLogitsProcessor
from vlmserve.engine.loop import draw
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .conftest import InProcessEngine
from .test_constrained_decoding import sampled, tools
from .test_engine_grpc import request, status_of, text_part
from .test_grammar_processor import EOS, generate


def required_call(seed: int) -> pb.GenerateRequest:
    return request(
        text_part("Weather?"),
        tools=tools(),
        tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED),
        sampling=sampled(seed),
        max_tokens=160,
    )


def test_a_runtime_limit_leaves_only_eos_and_says_why(compiler: object) -> None:
    from vlmserve.engine.grammar.compiler import GrammarCompiler

    from .test_grammar_processor import constraint

    assert isinstance(compiler, GrammarCompiler)
    processor = GrammarLogitsProcessor(
        constraint(compiler, tools=[tools()[0]]).grammar,
        compiler.tokenizer,
        eos_token_ids=frozenset([EOS]),
        max_new_tokens=200,
        limits=llguidance.LLParserLimits(step_lexer_fuel=300),
    )
    out = generate(processor, 200, seed=0)
    assert out[-1] == EOS and len(out) < 200
    assert processor.failure is not None and "too many expressions" in processor.failure


@pytest.fixture
def compiler() -> object:
    from transformers import AutoTokenizer

    from tests._fixture_models import RANDOM_MODEL_PATH
    from vlmserve.engine.grammar.compiler import GrammarCompiler

    return GrammarCompiler(AutoTokenizer.from_pretrained(str(RANDOM_MODEL_PATH)), [EOS])


def test_a_required_call_cut_by_a_grammar_limit_fails_with_the_reason(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The engine's own processor, with llguidance's lexer fuel per step cut to 300 (its default
    # is 200,000): a limit the random model's calls reach a few tokens in.
    # A subclass, not a partial: the loop finds a row's grammar by its type (grammar fast-forward).
    class Limited(GrammarLogitsProcessor):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, limits=llguidance.LLParserLimits(step_lexer_fuel=300), **kwargs)

    monkeypatch.setattr(draw, "GrammarLogitsProcessor", Limited)
    code, details = status_of(lambda: list(stub.Generate(required_call(0), timeout=60)))
    assert code == grpc.StatusCode.ABORTED, details
    assert "constrained decoding stopped" in details and "too many expressions" in details
    # Without the limit the same request makes its call, as before.
    monkeypatch.undo()
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=required_call(0)), timeout=60).result
    assert result.tool_calls and result.finish_reason == pb.FINISH_REASON_TOOL_CALLS
