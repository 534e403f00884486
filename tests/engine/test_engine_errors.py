"""Every engine error is a proper gRPC status with structured details, read here with the generated
stub and grpcio-status only (no client library): what any gRPC caller gets
(docs/engine-contract.md, "Errors").

- a client-caused error names its field in a google.rpc.BadRequest field violation;
- nothing escapes as UNKNOWN with an exception's text (13.6: JSON nested 5,000 levels in a tool
  call's arguments raised RecursionError through the handler).
"""

from __future__ import annotations

import logging
from typing import Any

import grpc
import pytest
from grpc_status import rpc_status

from vlmserve.engine.loop import prompt_batch as prompt_batch_module
from vlmserve.engine.prep.prompt import MAX_JSON_DEPTH
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from ._rpc_details import field_violations
from .conftest import InProcessEngine


def text_part(value: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=value))


def user(*parts: pb.Part) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, parts=list(parts) or [text_part("hi")])


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def with_call(arguments: str) -> list[pb.Message]:
    return [
        user(),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c1", name="f", arguments=arguments)]),
        pb.Message(role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id="c1", text="ok")),
    ]


def tool(parameters_json: str = "{}", name: str = "f") -> pb.Tool:
    return pb.Tool(function=pb.FunctionTool(name=name, parameters_json=parameters_json))


def failure(stub: pb_grpc.EngineServiceStub, request: pb.GenerateRequest) -> tuple[grpc.StatusCode, str, Any]:
    """Generate's status code, message and google.rpc.Status (None when the call had no details)."""
    request.sampling.max_tokens = 2
    with pytest.raises(grpc.RpcError) as caught:
        list(stub.Generate(request, timeout=60))
    error: Any = caught.value
    return error.code(), error.details(), rpc_status.from_call(error)


def request(messages: list[pb.Message] | None = None, **fields: Any) -> pb.GenerateRequest:
    return pb.GenerateRequest(messages=messages if messages is not None else [user()], **fields)


# Each row: a request the engine refuses as INVALID_ARGUMENT, and the field it must name.
INVALID = [
    ("no messages", request([]), "messages"),
    (
        "unknown role",
        request([pb.Message(role=pb.ROLE_UNSPECIFIED, parts=[text_part("x")])]),
        "messages[0].role",
    ),
    ("empty part", request([user(pb.Part())]), "messages[0].parts[0]"),
    (
        "corrupt image",
        request([user(pb.Part(image=pb.ImagePart(data=b"\x89PNG\r\n\x1a\nxx", media_type="image/png")))]),
        "messages[0].parts[0].image.data",
    ),
    (
        "file part",
        request([user(pb.Part(file=pb.FilePart(filename="a.pdf", data=b"%PDF")))]),
        "messages[0].parts[0]",
    ),
    (
        "tool call without a name",
        request([user(), pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="c")])]),
        "messages[1].tool_calls[0].name",
    ),
    ("tool turn without output", request([user(), pb.Message(role=pb.ROLE_TOOL)]), "messages[1].tool_output"),
    (
        "tool output on a user turn",
        request([pb.Message(role=pb.ROLE_USER, tool_output=pb.ToolOutput(text="x"))]),
        "messages[0].tool_output",
    ),
    ("bad top_p", request(sampling=pb.SamplingParams(top_p=2.0)), "sampling.top_p"),
    ("empty stop", request(sampling=pb.SamplingParams(stop=["a", ""])), "sampling.stop[1]"),
    ("unnamed tool", request(tools=[tool(name="")]), "tools[0].function.name"),
    ("duplicate tool", request(tools=[tool(), tool()]), "tools[1].function.name"),
    ("parameters not JSON", request(tools=[tool("{nope")]), "tools[0].function.parameters_json"),
    (
        "unknown forced tool",
        request(tools=[tool()], tool_choice=pb.ToolChoice(function_name="g")),
        "tool_choice.function_name",
    ),
    (
        "required without tools",
        request(tool_choice=pb.ToolChoice(mode=pb.TOOL_CHOICE_MODE_REQUIRED)),
        "tool_choice.mode",
    ),
    (
        "schema not JSON",
        request(response_format=pb.ResponseFormat(json_schema=pb.JsonSchemaFormat(schema_json="{"))),
        "response_format.json_schema.schema_json",
    ),
    ("request id too long", request(request_id="x" * 300), "request_id"),
    # 13.6: nesting deep enough to exhaust Python's stack in json.loads (5,000) or in the chat
    # template's rendering of the parsed value (900), and just over the engine's limit.
    ("arguments nested 5000 deep", request(with_call(nested(5000))), "messages[1].tool_calls[0].arguments"),
    ("arguments nested 900 deep", request(with_call(nested(900))), "messages[1].tool_calls[0].arguments"),
    (
        "arguments nested past the limit",
        request(with_call(nested(MAX_JSON_DEPTH + 1))),
        "messages[1].tool_calls[0].arguments",
    ),
    ("parameters nested 5000 deep", request(tools=[tool(nested(5000))]), "tools[0].function.parameters_json"),
    (
        "schema nested 5000 deep",
        request(response_format=pb.ResponseFormat(json_schema=pb.JsonSchemaFormat(schema_json=nested(5000)))),
        "response_format.json_schema.schema_json",
    ),
]


@pytest.mark.parametrize(("name", "bad", "field"), INVALID, ids=[row[0] for row in INVALID])
def test_invalid_argument_names_its_field(
    idle_engine: InProcessEngine,
    stub: pb_grpc.EngineServiceStub,
    name: str,
    bad: pb.GenerateRequest,
    field: str,
) -> None:
    code, message, status = failure(stub, bad)
    assert code == grpc.StatusCode.INVALID_ARGUMENT, message
    assert status is not None, "no google.rpc.Status in the trailers"
    assert field_violations(status) == [field]
    assert status.message == message
    for internal in ("Traceback", "RecursionError", "recursion", ".py", "Unexpected"):
        assert internal not in message


def test_json_at_the_depth_limit_is_accepted(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    deep = request(with_call(nested(MAX_JSON_DEPTH)), tools=[tool(nested(MAX_JSON_DEPTH))])
    deep.sampling.max_tokens = 1
    result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=deep), timeout=60).result
    assert result.usage.output_tokens == 1


def test_unparseable_arguments_in_history_are_kept_as_written(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    # Not JSON is history the model wrote; only nesting too deep to handle is refused.
    history = request(with_call("{not json"))
    history.sampling.max_tokens = 1
    assert (
        stub.GenerateUnary(pb.GenerateUnaryRequest(request=history), timeout=60).result.usage.output_tokens
        == 1
    )


def test_wrong_model_is_not_found_naming_the_field(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    code, _, status = failure(stub, request(model="gpt-9"))
    assert code == grpc.StatusCode.NOT_FOUND
    assert field_violations(status) == ["model"]


def test_a_message_quoting_a_huge_client_string_stays_small(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    """Status messages travel in trailers (twice, with the details): a 1 MB model name must not break them."""
    code, message, status = failure(stub, request(model="m" * 1_000_000))
    assert code == grpc.StatusCode.NOT_FOUND
    assert len(message) <= 1000 and field_violations(status) == ["model"]


@pytest.mark.parametrize("rpc", ["Generate", "GenerateUnary", "CountTokens"])
def test_an_unexpected_exception_is_internal_without_its_text(
    idle_engine: InProcessEngine,
    stub: pb_grpc.EngineServiceStub,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    rpc: str,
) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise ValueError("/srv/secret/path/module.py: something internal")

    monkeypatch.setattr(idle_engine.server.generator.preparer, "prepare", broken)
    calls = {
        "Generate": lambda: list(stub.Generate(request(), timeout=30)),
        "GenerateUnary": lambda: stub.GenerateUnary(pb.GenerateUnaryRequest(request=request()), timeout=30),
        "CountTokens": lambda: stub.CountTokens(pb.CountTokensRequest(request=request()), timeout=30),
    }
    with (
        caplog.at_level(logging.ERROR, logger="vlmserve.engine.rpc.server"),
        pytest.raises(grpc.RpcError) as caught,
    ):
        calls[rpc]()
    error: Any = caught.value
    assert error.code() == grpc.StatusCode.INTERNAL
    assert error.details() == "the engine failed to process the request"
    # The text is for the operator's log, with its traceback.
    assert any("something internal" in record.getMessage() or record.exc_info for record in caplog.records)


def test_a_failure_on_the_generation_thread_is_internal_without_its_text(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: Any, **__: Any) -> Any:
        raise RuntimeError("/srv/secret/kernel.metal: out of something")

    monkeypatch.setattr(prompt_batch_module.PromptBatch, "_run_chunk", broken)
    code, message, _ = failure(stub, request())
    assert (code, message) == (grpc.StatusCode.INTERNAL, "the engine failed to process the request")
    monkeypatch.undo()
    # The generation thread lives on.
    ok = request()
    ok.sampling.max_tokens = 1
    assert stub.GenerateUnary(pb.GenerateUnaryRequest(request=ok), timeout=60).result.usage.output_tokens == 1


def test_the_processors_own_words_are_not_echoed(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, monkeypatch: pytest.MonkeyPatch
) -> None:
    import io

    from PIL import Image

    def refusing(*_: Any, **__: Any) -> Any:
        raise ValueError("Mismatch in `image` token count between text and `input_ids`: 17 vs 16")

    preparer = idle_engine.server.generator.preparer
    assert preparer is not None
    monkeypatch.setattr(type(preparer._images), "prepare", refusing)
    png = io.BytesIO()
    Image.new("RGB", (32, 32)).save(png, "PNG")
    image = pb.Part(image=pb.ImagePart(data=png.getvalue(), media_type="image/png"))
    code, message, status = failure(stub, request([user(image, text_part("?"))]))
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert field_violations(status) == ["messages[0].parts[0].image.data"]
    assert "input_ids" not in message and "17 vs 16" not in message
