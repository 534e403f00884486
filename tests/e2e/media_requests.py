"""Requests the media proof sends (tests/e2e/test_media_e2e.py): clips as clients encode them
(an MP4 or a list of frame images for video, a WAV for audio) in each API's shape."""

from __future__ import annotations

import base64
from typing import Any, Literal

from tests._data_urls import data_url
from training import beeps, squares_video
from training.media_conversations import AGENT_PROMPTS, QUESTIONS, TOOL_CALL_ID, TOOL_DESCRIPTIONS, TOOL_NAMES

Kind = Literal["video", "audio"]
Clip = squares_video.SquaresClip | beeps.BeepsClip
MAX_TOKENS = 16


def mp4_url(clip: squares_video.SquaresClip) -> str:
    return data_url(clip.mp4_bytes(), "video/mp4")


def wav_base64(clip: beeps.BeepsClip) -> str:
    return base64.b64encode(clip.wav_bytes()).decode("ascii")


# -- Chat Completions --------------------------------------------------------------------------


def chat_clip_part(clip: Clip) -> dict[str, Any]:
    if isinstance(clip, squares_video.SquaresClip):
        return {"type": "video_url", "video_url": {"url": mp4_url(clip)}}
    return {"type": "input_audio", "input_audio": {"data": wav_base64(clip), "format": "wav"}}


def chat_frames_part(clip: squares_video.SquaresClip) -> dict[str, Any]:
    """vLLM's `video` part: the frames as image URLs, in order."""
    return {"type": "video", "video": [data_url(png) for png in clip.frame_pngs()]}


def chat_tool(kind: Kind) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {}}
    function = {"name": TOOL_NAMES[kind], "description": TOOL_DESCRIPTIONS[kind], "parameters": parameters}
    return {"type": "function", "function": function}


def chat_user_messages(kind: Kind, part: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [part, {"type": "text", "text": QUESTIONS[kind]}]}]


def chat_tool_messages(kind: Kind, part: dict[str, Any]) -> list[dict[str, Any]]:
    """The agent loop: the question, the recording call, the clip as the tool message."""
    call = {"id": TOOL_CALL_ID, "type": "function", "function": {"name": TOOL_NAMES[kind], "arguments": "{}"}}
    return [
        {"role": "user", "content": AGENT_PROMPTS[kind]},
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": TOOL_CALL_ID, "content": [part]},
    ]


# -- Responses ---------------------------------------------------------------------------------


def input_clip_part(clip: Clip) -> dict[str, Any]:
    if isinstance(clip, squares_video.SquaresClip):
        return {"type": "input_video", "video_url": mp4_url(clip)}
    return {"type": "input_audio", "input_audio": {"data": wav_base64(clip), "format": "wav"}}


def responses_tool(kind: Kind) -> dict[str, Any]:
    parameters = {"type": "object", "properties": {}}
    return {
        "type": "function",
        "name": TOOL_NAMES[kind],
        "description": TOOL_DESCRIPTIONS[kind],
        "parameters": parameters,
    }


def responses_user_input(kind: Kind, clip: Clip) -> list[dict[str, Any]]:
    content = [input_clip_part(clip), {"type": "input_text", "text": QUESTIONS[kind]}]
    return [{"role": "user", "content": content}]


def function_call_output_input(kind: Kind, clip: Clip) -> list[dict[str, Any]]:
    """The agent loop's second request: the recording call and its output, the clip."""
    return [
        {"role": "user", "content": AGENT_PROMPTS[kind]},
        {"type": "function_call", "call_id": TOOL_CALL_ID, "name": TOOL_NAMES[kind], "arguments": "{}"},
        {"type": "function_call_output", "call_id": TOOL_CALL_ID, "output": [input_clip_part(clip)]},
    ]
