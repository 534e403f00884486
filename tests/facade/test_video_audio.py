"""Video and audio on every API (issue 34.2), as the wire carries them: raw JSON (and the openai
SDK where it has the shape) into the app, the contract request the scripted engine received out.
Chat user and tool messages, Responses parts and tool outputs, replays (previous_response_id,
conversations, stored input items), /v1/files, sampling (per part and `mm_processor_kwargs`)
into generation and token counting, and every refusal OpenAI- or Anthropic-shaped."""

from __future__ import annotations

import json
from typing import Any, cast

import httpx
import openai
import pytest
import websockets.asyncio.client

from tests._clips import MP4_HEAD, WEBM_HEAD, b64, gif_bytes, video_data_url, wav_bytes
from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import png_data_url, until_done
from vlmserve.engine.request_errors import invalid_argument
from vlmserve.engine.v1 import engine_pb2 as pb

WAV = wav_bytes()
VIDEO = video_data_url()
TOOL: Any = {
    "type": "function",
    "function": {"name": "record", "parameters": {"type": "object", "properties": {}}},
}


def audio(data: bytes = WAV, format: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": b64(data), "format": format}}


def kinds(parts: Any) -> list[str | None]:
    return [part.WhichOneof("kind") for part in parts]


def clip_of(part: pb.Part) -> pb.VideoPart | pb.AudioPart:
    return part.video if part.WhichOneof("kind") == "video" else part.audio


# ---- chat completions ----------------------------------------------------------------------------


async def test_chat_user_message_carries_every_video_and_audio_shape(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    content = [
        {"type": "text", "text": "What happens?"},
        {"type": "video_url", "video_url": {"url": VIDEO}, "fps": 1.0},
        {"type": "input_video", "video_url": video_data_url(WEBM_HEAD, "video/webm"), "max_frames": 4},
        {"type": "video", "video": [png_data_url(), png_data_url((0, 0, 255))], "fps": 2},
        audio(),
        {"type": "audio_url", "audio_url": {"url": "data:audio/wav;base64," + b64(WAV)}},
    ]
    answer = await http.post(
        "/v1/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": content}],
            "mm_processor_kwargs": {"max_frames": 8},
        },
    )
    assert answer.status_code == 200, answer.text
    (message,) = engine.requests[0].messages
    assert kinds(message.parts) == ["text", "video", "video", "video", "audio", "audio"]
    first, second, frames, voice, vllm_voice = message.parts[1:]
    assert (vllm_voice.audio.data, vllm_voice.audio.media_type) == (WAV, "audio/wav")
    assert (first.video.data, first.video.media_type) == (MP4_HEAD, "video/mp4")
    assert (first.video.sampling.fps, first.video.sampling.max_frames) == (1.0, 8)
    assert (second.video.media_type, second.video.sampling.max_frames) == ("video/webm", 4)
    assert len(frames.video.frames.frames) == 2 and frames.video.frames.fps == 2.0
    assert (voice.audio.data, voice.audio.media_type) == (WAV, "audio/wav")


async def test_chat_tool_message_keeps_its_clips_in_the_tool_output(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    messages = [
        {"role": "user", "content": "Record the screen and the microphone."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "record", "arguments": "{}"}}
            ],
        },
        {
            "role": "tool",
            "tool_call_id": "call_1",
            "content": [
                {"type": "text", "text": "recorded"},
                {"type": "video_url", "video_url": {"url": VIDEO}, "max_frames": 6},
                audio(),
            ],
        },
    ]
    answer = await http.post(
        "/v1/chat/completions", json={"model": "default", "messages": messages, "tools": [TOOL]}
    )
    assert answer.status_code == 200, answer.text
    tool = engine.requests[0].messages[-1]
    assert tool.role == pb.ROLE_TOOL and tool.tool_output.call_id == "call_1"
    parts = tool.tool_output.parts.parts
    assert kinds(parts) == ["text", "video", "audio"]
    assert (parts[1].video.data, parts[1].video.sampling.max_frames) == (MP4_HEAD, 6)
    assert parts[2].audio.data == WAV


async def test_openai_sdk_chat_input_audio_part(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    completion = await sdk.chat.completions.create(
        model="default",
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "How many beeps?"},
                    {"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "wav"}},
                ],
            }
        ],
        extra_body={"mm_processor_kwargs": {"fps": 1}},
    )
    assert completion.choices[0].message.content
    (message,) = engine.requests[0].messages
    assert kinds(message.parts) == ["text", "audio"]
    assert (message.parts[1].audio.data, message.parts[1].audio.media_type) == (WAV, "audio/wav")


# (case, the user content, the chat param, the code)
CHAT_REFUSED: list[tuple[str, list[Any], str, str]] = [
    (
        "image data URL in video_url",
        [{"type": "video_url", "video_url": {"url": png_data_url()}}],
        "messages[0].content[0].video_url.url",
        "invalid_video_url",
    ),
    (
        "malformed base64",
        [{"type": "video_url", "video_url": {"url": "data:video/mp4;base64,A%A"}}],
        "messages[0].content[0].video_url.url",
        "invalid_base64",
    ),
    (
        "unknown audio format",
        [{"type": "input_audio", "input_audio": {"data": b64(WAV), "format": "aiff"}}],
        "messages[0].content[0].input_audio.format",
        "unsupported_value",
    ),
    (
        "Qwen's nframes",
        [{"type": "video", "video": VIDEO, "nframes": 8}],
        "messages[0].content[0].nframes",
        "unsupported_value",
    ),
    (
        "frames not a list of strings",
        [{"type": "video", "video": [1, 2]}],
        "messages[0].content[0].video[0]",
        "invalid_type",
    ),
]


@pytest.mark.parametrize(("case", "content", "param", "code"), CHAT_REFUSED, ids=[r[0] for r in CHAT_REFUSED])
async def test_chat_refusals_name_the_chat_field(
    http: httpx.AsyncClient, engine: FakeEngine, case: str, content: list[Any], param: str, code: str
) -> None:
    answer = await http.post(
        "/v1/chat/completions", json={"model": "default", "messages": [{"role": "user", "content": content}]}
    )
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert f"'{param}'" in error["message"]
    assert engine.requests == []


async def test_chat_mm_processor_kwargs_unknown_key(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    answer = await http.post(
        "/v1/chat/completions",
        json={
            "model": "default",
            "messages": [{"role": "user", "content": "hi"}],
            "mm_processor_kwargs": {"num_frames": 4},
        },
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("mm_processor_kwargs.num_frames", "unknown_parameter")
    assert engine.requests == []


# ---- responses -------------------------------------------------------------------------------------

RESPONSES_INPUT: list[Any] = [
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "Record it."},
            {"type": "input_video", "video_url": VIDEO, "fps": 1.5, "max_frames": 6},
            audio(),
        ],
    },
    {"type": "function_call", "call_id": "c1", "name": "record", "arguments": "{}"},
    {
        "type": "function_call_output",
        "call_id": "c1",
        "output": [{"type": "input_video", "video_url": VIDEO}],
    },
    {"type": "custom_tool_call", "call_id": "c2", "name": "listen", "input": "mic"},
    {"type": "custom_tool_call_output", "call_id": "c2", "output": [audio()]},
]


def assert_responses_clips(messages: Any) -> None:
    """The clips of RESPONSES_INPUT where the engine gets them: the user turn, then each tool output."""
    user = next(message for message in messages if message.role == pb.ROLE_USER)
    assert kinds(user.parts) == ["text", "video", "audio"]
    assert (user.parts[1].video.data, user.parts[1].video.sampling.fps) == (MP4_HEAD, 1.5)
    assert user.parts[1].video.sampling.max_frames == 6
    assert user.parts[2].audio.data == WAV
    outputs = [message.tool_output for message in messages if message.role == pb.ROLE_TOOL]
    assert [kinds(output.parts.parts) for output in outputs] == [["video"], ["audio"]]
    assert outputs[0].parts.parts[0].video.data == MP4_HEAD
    assert outputs[1].parts.parts[0].audio.data == WAV


async def test_responses_clips_reach_the_engine_and_replay(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    created = await http.post(
        "/v1/responses", json={"model": "default", "input": RESPONSES_INPUT, "store": True}
    )
    assert created.status_code == 200, created.text
    assert_responses_clips(engine.requests[0].messages)

    # Stored input items come back as they were sent.
    listed = (
        await http.get(f"/v1/responses/{created.json()['id']}/input_items", params={"order": "asc"})
    ).json()
    sent = [
        {key: value for key, value in item.items() if key not in ("id", "status")} for item in listed["data"]
    ]
    for item in sent:
        item.setdefault("type", "message")
    assert sent[0]["content"] == RESPONSES_INPUT[0]["content"]
    assert sent[2]["output"] == RESPONSES_INPUT[2]["output"]
    assert sent[4]["output"] == RESPONSES_INPUT[4]["output"]

    # And replayed through previous_response_id: the same clips, the same sampling.
    follow = await http.post(
        "/v1/responses",
        json={"model": "default", "input": "And then?", "previous_response_id": created.json()["id"]},
    )
    assert follow.status_code == 200, follow.text
    assert_responses_clips(engine.requests[1].messages)
    assert engine.requests[1].messages[-1].parts[0].text.text == "And then?"


async def test_conversation_items_keep_their_clips(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    created = await http.post("/v1/conversations", json={"items": RESPONSES_INPUT})
    assert created.status_code == 200, created.text
    conversation = created.json()["id"]
    listed = (await http.get(f"/v1/conversations/{conversation}/items", params={"order": "asc"})).json()[
        "data"
    ]
    assert listed[0]["content"] == RESPONSES_INPUT[0]["content"]
    assert listed[4]["output"] == RESPONSES_INPUT[4]["output"]
    answer = await http.post(
        "/v1/responses", json={"model": "default", "input": "Describe both.", "conversation": conversation}
    )
    assert answer.status_code == 200, answer.text
    assert_responses_clips(engine.requests[0].messages)


async def test_openai_sdk_responses_input_audio(sdk: openai.AsyncOpenAI, engine: FakeEngine) -> None:
    # The SDK has the part's type (ResponseInputAudioParam), not yet in its message content union.
    content = cast(Any, [{"type": "input_text", "text": "How many beeps?"}, audio()])
    response = await sdk.responses.create(model="default", input=[{"role": "user", "content": content}])
    assert response.output_text
    (message,) = engine.requests[0].messages
    assert kinds(message.parts) == ["text", "audio"]
    assert message.parts[1].audio.data == WAV


async def test_sampling_reaches_token_counting(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    body = {
        "model": "default",
        "input": [
            {"role": "user", "content": [{"type": "input_video", "video_url": VIDEO, "max_frames": 3}]}
        ],
        "mm_processor_kwargs": {"fps": 0.5, "max_pixels": 65536},
    }
    counted = await http.post("/v1/responses/input_tokens", json=body)
    assert counted.status_code == 200, counted.text
    (request,) = engine.count_requests
    sampling = request.messages[0].parts[0].video.sampling
    assert (sampling.fps, sampling.max_frames, sampling.max_pixels) == (0.5, 3, 65536)


# (case, the input, the param, the code)
RESPONSES_REFUSED: list[tuple[str, list[Any], str, str]] = [
    (
        "non-video data URI in a video part",
        [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "x"},
                    {"type": "input_video", "video_url": png_data_url()},
                ],
            }
        ],
        "input[0].content[1].video_url",
        "invalid_video_url",
    ),
    (
        "bad audio in a function_call_output",
        [
            {"type": "function_call", "call_id": "c1", "name": "record", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": [audio(format="mp3")]},
        ],
        "input[1].output[0].input_audio.format",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(
    ("case", "given", "param", "code"), RESPONSES_REFUSED, ids=[r[0] for r in RESPONSES_REFUSED]
)
async def test_responses_refusals_name_the_field(
    http: httpx.AsyncClient, engine: FakeEngine, case: str, given: list[Any], param: str, code: str
) -> None:
    answer = await http.post("/v1/responses", json={"model": "default", "input": given})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert engine.requests == []


async def test_a_clip_past_the_body_limit_is_413(client_for: Any, engine: FakeEngine) -> None:
    small = client_for(max_request_bytes=64 * 1024)
    big = video_data_url(MP4_HEAD + bytes(100 * 1024))
    answer = await small.post(
        "/v1/responses",
        json={
            "model": "default",
            "input": [{"role": "user", "content": [{"type": "input_video", "video_url": big}]}],
        },
    )
    assert answer.status_code == 413
    assert answer.json()["error"]["type"] == "invalid_request_error"
    assert engine.requests == []


# ---- files -----------------------------------------------------------------------------------------


async def upload(
    http: httpx.AsyncClient, content: bytes, name: str, purpose: str = "user_data"
) -> httpx.Response:
    return await http.post(
        "/v1/files", files={"file": (name, content, "application/octet-stream")}, data={"purpose": purpose}
    )


async def test_uploaded_clips_are_used_by_id(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    clip = await upload(http, MP4_HEAD, "clip.mp4")
    note = await upload(http, WAV, "note.wav")
    assert clip.status_code == 200 and note.status_code == 200, (clip.text, note.text)
    content = await http.get(f"/v1/files/{clip.json()['id']}/content")
    assert content.headers["content-type"] == "video/mp4"
    answer = await http.post(
        "/v1/responses",
        json={
            "model": "default",
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_video", "file_id": clip.json()["id"], "fps": 1},
                        {"type": "input_audio", "file_id": note.json()["id"]},
                    ],
                }
            ],
        },
    )
    assert answer.status_code == 200, answer.text
    parts = engine.requests[0].messages[0].parts
    # The engine never reads storage: the bytes travel, not the id.
    assert [(clip_of(part).WhichOneof("source"), clip_of(part).data) for part in parts] == [
        ("data", MP4_HEAD),
        ("data", WAV),
    ]
    chat = await http.post(
        "/v1/chat/completions",
        json={
            "model": "default",
            "messages": [
                {"role": "user", "content": [{"type": "video_url", "video_url": {"url": clip.json()["id"]}}]}
            ],
        },
    )
    assert chat.status_code == 200, chat.text
    assert engine.requests[1].messages[0].parts[0].video.data == MP4_HEAD


async def test_a_clip_is_no_vision_file_and_no_input_file(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    refused = await upload(http, MP4_HEAD, "clip.mp4", purpose="vision")
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "file"
    clip = (await upload(http, MP4_HEAD, "clip.mp4")).json()["id"]
    answer = await http.post(
        "/v1/responses",
        json={
            "model": "default",
            "input": [{"role": "user", "content": [{"type": "input_file", "file_id": clip}]}],
        },
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("input[0].content[0]", "unsupported_file")
    assert "input_video" in error["message"]


# ---- anthropic ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "block",
    [
        {"type": "video", "source": {"type": "base64", "media_type": "video/mp4", "data": b64(MP4_HEAD)}},
        {"type": "audio", "source": {"type": "base64", "media_type": "audio/wav", "data": b64(WAV)}},
    ],
    ids=["video", "audio"],
)
async def test_anthropic_has_no_video_or_audio_block(
    http: httpx.AsyncClient, engine: FakeEngine, block: dict[str, Any]
) -> None:
    body = {"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": [block]}]}
    for route in ("/v1/messages", "/v1/messages/count_tokens"):
        answer = await http.post(route, json=body, headers={"anthropic-version": "2023-06-01"})
        assert answer.status_code == 400, route
        payload = answer.json()
        assert (payload["type"], payload["error"]["type"]) == ("error", "invalid_request_error")
        assert payload["error"]["message"].startswith(
            f"Invalid value for 'messages[0].content[0].type': '{block['type']}'"
        )
        assert "/v1/chat/completions" in payload["error"]["message"]
    assert engine.requests == [] and engine.count_requests == []


async def test_anthropic_refuses_openai_audio_and_a_video_document(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    headers = {"anthropic-version": "2023-06-01"}
    body = {"model": "default", "max_tokens": 5, "messages": [{"role": "user", "content": [audio()]}]}
    answer = await http.post("/v1/messages", json=body, headers=headers)
    assert answer.status_code == 400
    assert "'messages[0].content[0].input_audio'" in answer.json()["error"]["message"]
    document = {
        "type": "document",
        "source": {"type": "base64", "media_type": "video/mp4", "data": b64(MP4_HEAD)},
    }
    body["messages"] = [{"role": "user", "content": [document]}]
    answer = await http.post("/v1/messages", json=body, headers=headers)
    assert answer.status_code == 400
    assert "video/mp4" in answer.json()["error"]["message"]
    assert engine.requests == []


async def test_an_uploaded_gif_is_an_image_and_a_clip_where_a_video_part_names_it(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    gif = gif_bytes()
    uploaded = await upload(http, gif, "anim.gif", purpose="vision")
    assert uploaded.status_code == 200, uploaded.text
    file_id = uploaded.json()["id"]
    content = [{"type": "input_image", "file_id": file_id}, {"type": "input_video", "file_id": file_id}]
    answer = await http.post(
        "/v1/responses", json={"model": "default", "input": [{"role": "user", "content": content}]}
    )
    assert answer.status_code == 200, answer.text
    image, video = engine.requests[0].messages[0].parts
    assert (image.image.data, image.image.media_type) == (gif, "image/gif")
    assert (video.video.data, video.video.media_type) == (gif, "image/gif")


async def test_an_item_reference_brings_its_clips(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    created = await http.post(
        "/v1/responses", json={"model": "default", "input": RESPONSES_INPUT, "store": True}
    )
    assert created.status_code == 200, created.text
    listed = (
        await http.get(f"/v1/responses/{created.json()['id']}/input_items", params={"order": "asc"})
    ).json()
    reference = {"type": "item_reference", "id": listed["data"][0]["id"]}
    answer = await http.post("/v1/responses", json={"model": "default", "input": [reference]})
    assert answer.status_code == 200, answer.text
    (user,) = engine.requests[1].messages
    assert kinds(user.parts) == ["text", "video", "audio"]
    assert (user.parts[1].video.data, user.parts[1].video.sampling.fps) == (MP4_HEAD, 1.5)
    assert user.parts[2].audio.data == WAV


async def test_websocket_mode_carries_clips_and_continues_with_them(
    server_url: str, engine: FakeEngine
) -> None:
    url = server_url.replace("http", "ws") + "/v1/responses"
    async with websockets.asyncio.client.connect(url) as connection:
        first_body = {"type": "response.create", "model": "default", "input": RESPONSES_INPUT, "store": False}
        await connection.send(json.dumps(first_body))
        first = await until_done(connection)
        assert first[-1]["type"] == "response.completed", first[-1]
        follow = {
            "type": "response.create",
            "model": "default",
            "input": "And then?",
            "store": False,
            "previous_response_id": first[-1]["response"]["id"],
        }
        await connection.send(json.dumps(follow))
        second = await until_done(connection)
        assert second[-1]["type"] == "response.completed", second[-1]
    assert_responses_clips(engine.requests[0].messages)
    # Continued from the connection's memory (nothing stored): the same clips, the same sampling.
    assert_responses_clips(engine.requests[1].messages)


# (case, the engine's field, the client's param: Responses, then chat)
ENGINE_REFUSED: list[tuple[str, str, str]] = [
    ("audio in a custom tool output", "messages[5].tool_output.parts.parts[0]", "input[4].output[0]"),
    ("video in a user message", "messages[1].parts[1].video.sampling.max_frames", "input[0].content[1]"),
]


@pytest.mark.parametrize(("case", "field", "param"), ENGINE_REFUSED, ids=[r[0] for r in ENGINE_REFUSED])
async def test_a_part_the_engine_refuses_is_named_as_the_client_wrote_it(
    http: httpx.AsyncClient, engine: FakeEngine, case: str, field: str, param: str
) -> None:
    """The engine names a part by its place in the contract request (instructions first); the
    client gets its own path."""
    where = field.split(".video", 1)[0]
    engine.script = Script(
        error=invalid_argument(f"{where}: model 'm' (gemma3) does not take audio", field=field)
    )
    answer = await http.post(
        "/v1/responses", json={"model": "default", "instructions": "Be brief.", "input": RESPONSES_INPUT}
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == param
    assert error["message"] == f"Invalid value for '{param}': model 'm' (gemma3) does not take audio"


async def test_a_chat_part_the_engine_refuses_names_the_chat_field(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    field = "messages[1].parts[1]"
    engine.script = Script(
        error=invalid_argument(f"{field}: model 'm' (qwen3_vl) does not take audio", field=field)
    )
    answer = await http.post(
        "/v1/chat/completions",
        json={
            "model": "default",
            "messages": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": [{"type": "text", "text": "Listen."}, audio()]},
            ],
        },
    )
    assert answer.status_code == 400
    error = answer.json()["error"]
    assert error["param"] == "messages[1].content[1]"
    assert (
        error["message"]
        == "Invalid value for 'messages[1].content[1]': model 'm' (qwen3_vl) does not take audio"
    )
