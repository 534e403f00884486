"""The lowering rules (docs/responses-api.md, "The image follow-up lowering") on contract messages,
one table row per rule."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
import pytest

from tests.responses.responses_testkit import BLUE, GREEN, RED, image_part, images_of, json_part, text_part
from vlmserve.engine.prep.lowering import (
    AUDIO_FOLLOW_UP_MARKER,
    IMAGE_FOLLOW_UP_MARKER,
    VIDEO_FOLLOW_UP_MARKER,
    lower_messages,
    tool_output_text,
)
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb

M = IMAGE_FOLLOW_UP_MARKER


def tool(parts: list[pb.Part] | str, call_id: str = "c1") -> pb.Message:
    if isinstance(parts, str):
        return pb.Message(role=pb.ROLE_TOOL, tool_output=pb.ToolOutput(call_id=call_id, text=parts))
    output = pb.ToolOutput(call_id=call_id, parts=pb.PartList(parts=parts))
    return pb.Message(role=pb.ROLE_TOOL, tool_output=output)


def turn(role: pb.Role.ValueType, *parts: pb.Part) -> pb.Message:
    return pb.Message(role=role, parts=list(parts))


def lowered_tool(text: str, call_id: str = "c1") -> pb.Message:
    return tool(text, call_id)


@dataclass(frozen=True)
class Case:
    name: str
    given: list[pb.Message]
    expected: list[pb.Message]


CASES = [
    Case("string tool output unchanged", [tool("as is")], [lowered_tool("as is")]),
    Case("empty part list becomes empty text", [tool([])], [lowered_tool("")]),
    Case(
        "text parts joined by newline",
        [tool([text_part("a"), text_part("b"), text_part("c")])],
        [lowered_tool("a\nb\nc")],
    ),
    Case(
        "leftovers as one JSON array line after the text",
        [tool([json_part('{"type": "x"}'), text_part("a"), json_part('{"type": "y", "n": 1}')])],
        [lowered_tool('a\n[{"type": "x"}, {"type": "y", "n": 1}]')],
    ),
    Case(
        "image-only output: marker alone, then the image",
        [tool([image_part(RED)])],
        [lowered_tool(M), turn(pb.ROLE_USER, image_part(RED))],
    ),
    Case(
        "text, leftovers, marker in that order; images in output order with detail",
        [
            tool(
                [
                    image_part(GREEN, pb.IMAGE_DETAIL_HIGH),
                    text_part("t"),
                    json_part('{"k": 1}'),
                    image_part(RED, pb.IMAGE_DETAIL_LOW),
                ]
            )
        ],
        [
            lowered_tool(f't\n[{{"k": 1}}]\n{M}'),
            turn(pb.ROLE_USER, image_part(GREEN, pb.IMAGE_DETAIL_HIGH), image_part(RED, pb.IMAGE_DETAIL_LOW)),
        ],
    ),
    Case(
        "each tool output gets its own follow-up right after it",
        [tool([image_part(RED)], "a"), tool([image_part(GREEN)], "b")],
        [
            lowered_tool(M, "a"),
            turn(pb.ROLE_USER, image_part(RED)),
            lowered_tool(M, "b"),
            turn(pb.ROLE_USER, image_part(GREEN)),
        ],
    ),
    Case(
        "user images stay in place, interleaved",
        [turn(pb.ROLE_USER, text_part("a"), image_part(RED), text_part("b"), image_part(GREEN))],
        [turn(pb.ROLE_USER, text_part("a"), image_part(RED), text_part("b"), image_part(GREEN))],
    ),
    Case(
        "assistant images move after it, no marker, tool calls kept",
        [
            pb.Message(
                role=pb.ROLE_ASSISTANT,
                parts=[image_part(RED), text_part("look")],
                tool_calls=[pb.ToolCall(id="c1", name="f", arguments="{}")],
            )
        ],
        [
            pb.Message(
                role=pb.ROLE_ASSISTANT,
                parts=[text_part("look")],
                tool_calls=[pb.ToolCall(id="c1", name="f", arguments="{}")],
            ),
            turn(pb.ROLE_USER, image_part(RED)),
        ],
    ),
    Case(
        "system images move after it",
        [turn(pb.ROLE_SYSTEM, text_part("s"), image_part(BLUE)), turn(pb.ROLE_USER, text_part("u"))],
        [
            turn(pb.ROLE_SYSTEM, text_part("s")),
            turn(pb.ROLE_USER, image_part(BLUE)),
            turn(pb.ROLE_USER, text_part("u")),
        ],
    ),
    Case(
        "developer images move after it",
        [turn(pb.ROLE_DEVELOPER, image_part(RED), image_part(GREEN))],
        [turn(pb.ROLE_DEVELOPER), turn(pb.ROLE_USER, image_part(RED), image_part(GREEN))],
    ),
    Case(
        "file parts are placed like images, never turned into text",
        [tool([text_part("t"), pb.Part(file=pb.FilePart(file_id="f1"))])],
        [lowered_tool("t"), turn(pb.ROLE_USER, pb.Part(file=pb.FilePart(file_id="f1")))],
    ),
]


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_lowering_rule(case: Case) -> None:
    assert lower_messages(case.given) == case.expected


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_lowering_is_idempotent(case: Case) -> None:
    once = lower_messages(case.given)
    assert lower_messages(once) == once


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_lowering_does_not_modify_its_input(case: Case) -> None:
    before = [pb.Message.FromString(message.SerializeToString()) for message in case.given]
    lower_messages(case.given)
    assert case.given == before


def test_tool_kind_and_call_id_survive() -> None:
    message = tool([image_part(RED)], "call_9")
    message.tool_output.kind = pb.TOOL_KIND_CUSTOM
    [lowered, follow_up] = lower_messages([message])
    assert lowered.tool_output.call_id == "call_9"
    assert lowered.tool_output.kind == pb.TOOL_KIND_CUSTOM
    assert images_of(follow_up) == [RED]


def test_tool_output_text_matches_lowering() -> None:
    parts = [text_part("a"), json_part("[1]"), image_part(RED)]
    assert tool_output_text(parts) == f"a\n[[1]]\n{M}"


VIDEO = pb.Part(video=pb.VideoPart(data=b"\x00\x00\x00\x18ftypmp42", media_type="video/mp4"))
AUDIO = pb.Part(audio=pb.AudioPart(data=b"RIFF", media_type="audio/wav"))


@pytest.mark.parametrize(
    ("parts", "text"),
    [
        ([text_part("recorded"), VIDEO], f"recorded\n{VIDEO_FOLLOW_UP_MARKER}"),
        ([AUDIO], AUDIO_FOLLOW_UP_MARKER),
        # One line per kind, images first, whatever the parts' order; none for a second clip.
        ([AUDIO, VIDEO, image_part(RED), VIDEO], f"{M}\n{VIDEO_FOLLOW_UP_MARKER}\n{AUDIO_FOLLOW_UP_MARKER}"),
    ],
)
def test_a_tool_output_says_which_media_follow(parts: list[pb.Part], text: str) -> None:
    [lowered, follow_up] = lower_messages([tool(parts, "call_7")])
    assert lowered.tool_output.text == tool_output_text(parts) == text
    assert [part.WhichOneof("kind") for part in follow_up.parts] == [
        part.WhichOneof("kind") for part in parts if part.WhichOneof("kind") != "text"
    ]


@pytest.mark.parametrize(
    ("message", "param"),
    [
        (pb.Message(parts=[text_part("no role")]), "messages[1].role"),
        (pb.Message(role=pb.ROLE_TOOL, parts=[text_part("misplaced")]), "messages[1].parts"),
    ],
)
def test_malformed_contract_messages_are_named(message: pb.Message, param: str) -> None:
    with pytest.raises(RequestError) as caught:
        lower_messages([turn(pb.ROLE_USER, text_part("ok")), message])
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.field == param
