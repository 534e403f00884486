"""The public surface, pinned (as httpx pins its `__all__`): what a client user may import from
`vlmserve.responses` and `vlmserve.client`, and the engine contract's service. A change here is a
change to what users build on: make it on purpose, here and in the docs (docs/responses-api.md,
docs/engine-contract.md), never as a side effect of moving code. The contract's messages and
fields are pinned against its released descriptor by `make buf-breaking` (scripts/contract_breaking.py)."""

from __future__ import annotations

import inspect
import types

import pytest

import vlmserve.client
import vlmserve.responses
from vlmserve.engine.v1 import engine_pb2

RESPONSES = {
    # request: translation of a Responses body into a contract request
    "CreateRequest", "CreateResponseBody", "EngineExtras", "IncludeValue", "InputItemParam", "ItemResolver",
    "OfferedTool", "RequestModel", "TranslatedRequest", "build_generate_request", "input_to_messages",
    "is_item_reference", "parse_as", "parse_body", "parse_create_request", "parse_metadata",
    "InvalidRequestError",
    # for APIs translated to Responses (chat completions, Anthropic Messages): where each field of
    # the body came from, and the validation pieces their request models share
    "PathMap", "translated_body", "Count", "MAX_COUNT", "ServiceTier", "OTHER", "by_json_type", "by_type",
    # video and audio parts, one shape on every API that has them (docs/video-audio.md)
    "AudioURLPartParam", "ChatVideoURLPartParam", "InputAudioPartParam", "InputVideoPartParam",
    "VideoPartParam",
    # media the translation reads through the caller's sources
    "FileContent", "FileSource", "IMAGE_PART_TYPES", "ImageFetchError", "ImageSource", "PdfRenderer",
    # output: items, the response resource and its parts
    "ConversationRef", "ConversationResource", "CustomToolCallItem", "DeletedObject", "ErrorPayload",
    "ComputerCallItem", "FunctionCallItem", "IncompleteDetails", "IncompleteReason", "InputTokensCount",
    "ItemList",
    "ItemStatus", "LogProb", "OutboundModel", "OutputItem", "OutputMessage", "OutputTextContent",
    "ReasoningItem", "ReasoningTextContent", "RequestEcho", "ResponseError", "ResponseResource",
    "ResponseStatus", "ToolCallItem", "Usage", "logprobs_from_contract", "message_output_item",
    "messages_to_items", "output_text_part", "reasoning_output_item", "result_to_output_items",
    "tool_call_output_item", "usage_from_contract",
    # compaction (POST /v1/responses/compact, compaction_trigger): the summarising turn, the
    # compacted list, the sealed state and who opens it
    "SUMMARY_INSTRUCTION", "compacted_output", "kept_items", "CompactionState", "KeptImage",
    "clean_summary", "compaction_item", "opening_compactions", "summary_body",
    "summarising_body",
    # streaming events
    "ContentPartEvent", "CustomToolCallInputDeltaEvent", "CustomToolCallInputDoneEvent", "ErrorEvent",
    "FunctionCallArgumentsDeltaEvent", "FunctionCallArgumentsDoneEvent", "LifecycleEventType",
    "OutputItemEvent", "OutputTextDeltaEvent", "OutputTextDoneEvent", "ReasoningTextDeltaEvent",
    "ReasoningTextDoneEvent", "ResponseLifecycleEvent", "ResponseStreamEvent",
}  # fmt: skip

CLIENT = {
    "AsyncEngineClient", "EngineClient", "Deadlines", "ENGINE_SERVICE_NAME", "MAX_MESSAGE_BYTES",
    "channel_options", "server_options", "text_of", "from_rpc_error", "FieldViolation",
    # one error class per gRPC status a call can end with
    "EngineError", "CancelledError", "AbortedError", "DeadlineExceededError", "FailedPreconditionError",
    "InternalError", "InvalidArgumentError", "NotFoundError", "OutOfRangeError", "PermissionDeniedError",
    "ResourceExhaustedError", "UnauthenticatedError", "UnavailableError", "UnimplementedError",
}  # fmt: skip

# The calls of both clients (`EngineClient` blocking, `AsyncEngineClient` awaited): the same names
# and parameters, from one shared base.
CLIENT_CALLS = {"generate", "generate_unary", "count_tokens", "model_info", "abort", "health", "close"}

# (method, request, response, server streaming)
ENGINE_SERVICE = {
    ("Generate", "GenerateRequest", "GenerateResponse", True),
    ("GenerateUnary", "GenerateUnaryRequest", "GenerateUnaryResponse", False),
    ("CountTokens", "CountTokensRequest", "CountTokensResponse", False),
    ("GetModelInfo", "GetModelInfoRequest", "GetModelInfoResponse", False),
    ("Abort", "AbortRequest", "AbortResponse", False),
}


@pytest.mark.parametrize(
    ("module", "pinned"),
    [(vlmserve.responses, RESPONSES), (vlmserve.client, CLIENT)],
    ids=["responses", "client"],
)
def test_all_is_the_pinned_surface(module: types.ModuleType, pinned: set[str]) -> None:
    exported = list(module.__all__)
    assert len(exported) == len(set(exported)), "a name is exported twice"
    assert set(exported) - pinned == set(), "new public names: pin them here on purpose"
    assert pinned - set(exported) == set(), "public names gone: a breaking change for users"


@pytest.mark.parametrize("module", [vlmserve.responses, vlmserve.client], ids=["responses", "client"])
def test_every_public_attribute_is_exported(module: types.ModuleType) -> None:
    """Nothing public by accident: a name without an underscore is in `__all__` (submodules aside)."""
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType) and name != "annotations"
    }
    assert public == set(module.__all__)
    for name in module.__all__:
        assert getattr(module, name) is not None


def test_the_engine_service_is_the_pinned_contract() -> None:
    service = engine_pb2.DESCRIPTOR.services_by_name["EngineService"]
    assert service.full_name == "vlmserve.engine.v1.EngineService"
    methods = {
        (method.name, method.input_type.name, method.output_type.name, method.server_streaming)
        for method in service.methods
    }
    assert methods == ENGINE_SERVICE
    assert not any(method.client_streaming for method in service.methods)
    assert service.full_name == vlmserve.client.ENGINE_SERVICE_NAME


@pytest.mark.parametrize(
    "client", [vlmserve.client.EngineClient, vlmserve.client.AsyncEngineClient], ids=["sync", "async"]
)
def test_the_client_calls_are_pinned(client: type) -> None:
    assert {name for name in dir(client) if not name.startswith("_")} == CLIENT_CALLS


def test_the_two_clients_take_the_same_arguments() -> None:
    sync, aio = vlmserve.client.EngineClient, vlmserve.client.AsyncEngineClient
    for name in [*sorted(CLIENT_CALLS - {"close"}), "__init__"]:
        ours, theirs = inspect.signature(getattr(sync, name)), inspect.signature(getattr(aio, name))
        assert list(ours.parameters.values()) == list(theirs.parameters.values()), name
    for name in CLIENT_CALLS - {"generate", "close"}:
        assert inspect.iscoroutinefunction(getattr(aio, name)), name
    assert inspect.isasyncgenfunction(aio.generate) and inspect.isgeneratorfunction(sync.generate)
