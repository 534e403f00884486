"""The media fixtures were trained on what inference sees (fast: no weights, no server).

Each request the end-to-end proof sends (tests/e2e/media_requests.py), translated by the
facade's own translation and rendered by the engine's `render_prompt`, is exactly the prompt the
training rendered for that conversation shape (training/media_conversations.py), and the clips
are handed over in the same order.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests.e2e import media_requests as req
from training import beeps, squares_video
from training.media_conversations import MediaConversation, follow_up_clip, render, tool_clip, user_clip
from training.media_model import build_audio_base, build_video_base
from vlmserve.chat import chat_request
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.responses import build_generate_request

Case = Callable[[req.Kind, Any, Any], tuple[dict[str, Any], list[Any], MediaConversation]]


def _chat_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "default", "messages": messages, **extra}


def _responses_body(items: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "default", "input": items, **extra}


def _replay(kind: req.Kind, earlier: Any, clip: Any) -> tuple[dict[str, Any], list[Any], MediaConversation]:
    stored = [
        *req.responses_user_input(kind, earlier),
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": earlier.answer}],
        },
    ]
    return _responses_body(req.responses_user_input(kind, clip)), stored, follow_up_clip(kind, earlier.answer)


CASES: dict[str, Case] = {
    "chat_user_part": lambda kind, _, clip: (
        {"chat": _chat_body(req.chat_user_messages(kind, req.chat_clip_part(clip)))},
        [],
        user_clip(kind),
    ),
    "chat_tool_message": lambda kind, _, clip: (
        {
            "chat": _chat_body(
                req.chat_tool_messages(kind, req.chat_clip_part(clip)), tools=[req.chat_tool(kind)]
            )
        },
        [],
        tool_clip(kind, with_text=False),
    ),
    "responses_input_part": lambda kind, _, clip: (
        _responses_body(req.responses_user_input(kind, clip)),
        [],
        user_clip(kind),
    ),
    "function_call_output": lambda kind, _, clip: (
        _responses_body(req.function_call_output_input(kind, clip), tools=[req.responses_tool(kind)]),
        [],
        tool_clip(kind, with_text=False),
    ),
    "replayed_follow_up": _replay,
}


def _clips(kind: req.Kind) -> tuple[Any, Any]:
    clips: list[Any] = squares_video.make_clips(3, 2) if kind == "video" else beeps.make_clips(3, 2)
    return clips[0], clips[1]


@pytest.fixture(scope="module")
def tokenizers(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The fixtures' tokenizers and chat templates (training copies them from these untrained
    builds into models/squares-video and models/beeps-audio)."""
    folder = tmp_path_factory.mktemp("media-bases")
    built = {"video": build_video_base(folder / "video"), "audio": build_audio_base(folder / "audio")}
    return {kind: AutoTokenizer.from_pretrained(path) for kind, path in built.items()}


@pytest.mark.parametrize("kind", ["video", "audio"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_requests_render_as_trained(kind: req.Kind, case: str, tokenizers: dict[str, Any]) -> None:
    tokenizer = tokenizers[kind]
    earlier, clip = _clips(kind)
    body, replay, conversation = CASES[case](kind, earlier, clip)
    if "chat" in body:
        translated = build_generate_request(chat_request(body["chat"]).request).request
    else:
        translated = build_generate_request(body, replay=replay).request
    served = render_prompt(translated.messages, template=tokenizer, tools=translated.tools)
    assert served.text == render(conversation, tokenizer)
    parts = [
        part for message in translated.messages for part in (*message.parts, *message.tool_output.parts.parts)
    ]
    sent = [part.WhichOneof("kind") for part in parts]
    assert [sent_kind for sent_kind in sent if sent_kind in ("video", "audio")] == list(conversation.media)
