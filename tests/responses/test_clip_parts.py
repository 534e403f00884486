"""Video and audio parts (issue 34.2) through the one translation: every shape clients send, in
messages and tool outputs, becomes a contract VideoPart / AudioPart with its bytes, media type and
the sampling asked for; every bad one is a 400 naming its field; what went in comes back out."""

from __future__ import annotations

from typing import Any

import pytest

from tests._clips import (
    AVIF_HEAD,
    FLAC_HEAD,
    MOV_HEAD,
    MP3_HEAD,
    MP4_HEAD,
    OGG_HEAD,
    WEBM_HEAD,
    b64,
    gif_bytes,
    video_data_url,
    wav_bytes,
)
from tests._data_urls import data_url
from tests.responses.responses_testkit import (
    RED,
    RED_URL,
    function_call,
    function_output,
    input_text,
    message,
)
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import (
    FileContent,
    InvalidRequestError,
    build_generate_request,
    input_to_messages,
    messages_to_items,
)

WAV = wav_bytes()
GIF = gif_bytes()
FILES = {
    "file-clip": FileContent(MP4_HEAD, "clip.mp4"),
    "file-note": FileContent(WAV, "note.wav"),
    "file-red": FileContent(RED, "red.png"),
}


def files(file_id: str) -> FileContent | None:
    return FILES.get(file_id)


def audio(data: str, format: str = "wav") -> dict[str, Any]:
    return {"type": "input_audio", "input_audio": {"data": data, "format": format}}


def only_part(content: list[Any], **options: Any) -> pb.Part:
    [user] = build_generate_request(
        {"input": [message("user", content)], **options}, file_source=files
    ).request.messages
    [part] = user.parts
    return part


# (case, part, the contract part's kind, its media type, its bytes)
ACCEPTED: list[tuple[str, dict[str, Any], str, str, bytes]] = [
    (
        "input_video data URL",
        {"type": "input_video", "video_url": video_data_url()},
        "video",
        "video/mp4",
        MP4_HEAD,
    ),
    (
        "input_video by file_id",
        {"type": "input_video", "file_id": "file-clip"},
        "video",
        "video/mp4",
        MP4_HEAD,
    ),
    (
        "video_url object",
        {"type": "video_url", "video_url": {"url": video_data_url(WEBM_HEAD, "video/webm")}},
        "video",
        "video/webm",
        WEBM_HEAD,
    ),
    (
        "video_url string",
        {"type": "video_url", "video_url": video_data_url()},
        "video",
        "video/mp4",
        MP4_HEAD,
    ),
    (
        "video_url file reference",
        {"type": "video_url", "video_url": {"url": "file-clip"}},
        "video",
        "video/mp4",
        MP4_HEAD,
    ),
    (
        "video_url file_id",
        {"type": "video_url", "video_url": {"file_id": "file-clip"}},
        "video",
        "video/mp4",
        MP4_HEAD,
    ),
    ("video URL string", {"type": "video", "video": video_data_url()}, "video", "video/mp4", MP4_HEAD),
    # One container, two names: the bytes decide the type sent.
    (
        "mov declared mp4",
        {"type": "input_video", "video_url": video_data_url(MOV_HEAD)},
        "video",
        "video/quicktime",
        MOV_HEAD,
    ),
    # An animated GIF is a clip where a video part holds it (the engine decodes it as one).
    (
        "animated GIF",
        {"type": "input_video", "video_url": data_url(GIF, "image/gif")},
        "video",
        "image/gif",
        GIF,
    ),
    ("wav, bare base64", audio(b64(WAV)), "audio", "audio/wav", WAV),
    ("mp3 data URL", audio(data_url(MP3_HEAD, "audio/mpeg"), "mp3"), "audio", "audio/mpeg", MP3_HEAD),
    ("flac", audio(b64(FLAC_HEAD), "flac"), "audio", "audio/flac", FLAC_HEAD),
    ("ogg", audio(b64(OGG_HEAD), "ogg"), "audio", "audio/ogg", OGG_HEAD),
    (
        "ogg as application/ogg",
        audio(data_url(OGG_HEAD, "application/ogg"), "ogg"),
        "audio",
        "audio/ogg",
        OGG_HEAD,
    ),
    (
        "mkv as video/mkv",
        {"type": "video", "video": data_url(WEBM_HEAD, "video/mkv")},
        "video",
        "video/webm",
        WEBM_HEAD,
    ),
    ("format in capitals", audio(b64(WAV), "WAV"), "audio", "audio/wav", WAV),
    ("audio by file_id", {"type": "input_audio", "file_id": "file-note"}, "audio", "audio/wav", WAV),
    (
        "audio_url object",
        {"type": "audio_url", "audio_url": {"url": data_url(WAV, "audio/wav")}},
        "audio",
        "audio/wav",
        WAV,
    ),
    (
        "audio_url string",
        {"type": "audio_url", "audio_url": data_url(FLAC_HEAD, "audio/x-flac")},
        "audio",
        "audio/flac",
        FLAC_HEAD,
    ),
    (
        "audio_url file reference",
        {"type": "audio_url", "audio_url": {"url": "file-note"}},
        "audio",
        "audio/wav",
        WAV,
    ),
]


@pytest.mark.parametrize(
    ("case", "given", "kind", "media_type", "data"), ACCEPTED, ids=[r[0] for r in ACCEPTED]
)
def test_clip_shapes_reach_the_contract(
    case: str, given: dict[str, Any], kind: str, media_type: str, data: bytes
) -> None:
    part = only_part([given])
    assert part.WhichOneof("kind") == kind
    clip = part.video if kind == "video" else part.audio
    # The facade resolves file ids: the engine always gets bytes.
    assert clip.WhichOneof("source") == "data"
    assert (clip.media_type, clip.data) == (media_type, data)


def test_sampling_asked_on_the_part_is_sent() -> None:
    given = {
        "type": "input_video",
        "video_url": video_data_url(),
        "fps": 1.5,
        "max_frames": 6,
        "min_pixels": 3136,
        "max_pixels": 50176,
    }
    sampling = only_part([given]).video.sampling
    assert (sampling.fps, sampling.max_frames, sampling.min_pixels, sampling.max_pixels) == (
        1.5,
        6,
        3136,
        50176,
    )


def test_no_sampling_asked_leaves_the_engine_defaults() -> None:
    sampling = only_part([{"type": "input_video", "video_url": video_data_url()}]).video.sampling
    assert sampling == pb.VideoSampling()


def test_mm_processor_kwargs_sample_every_video_unless_it_says_otherwise() -> None:
    content = [
        {"type": "input_video", "video_url": video_data_url()},
        {"type": "video_url", "video_url": {"url": video_data_url()}, "max_frames": 4},
    ]
    kwargs = {"fps": 1, "max_frames": 8.0, "max_pixels": 200704}
    [user] = build_generate_request(
        {"input": [message("user", content)], "mm_processor_kwargs": kwargs}
    ).request.messages
    first, second = (part.video.sampling for part in user.parts)
    assert (first.fps, first.max_frames, first.max_pixels) == (1.0, 8, 200704)
    assert (second.fps, second.max_frames, second.max_pixels) == (1.0, 4, 200704)


def test_frame_list_is_frames_taken_at_the_part_fps() -> None:
    given = {"type": "video", "video": [RED_URL, RED_URL, RED_URL], "fps": 4, "max_frames": 2}
    video = only_part([given], mm_processor_kwargs={"fps": 1}).video
    assert video.WhichOneof("source") == "frames"
    assert [frame.data for frame in video.frames.frames] == [RED] * 3
    assert all(frame.media_type == "image/png" for frame in video.frames.frames)
    # The part's fps says when the frames were taken; the request's is the rate to sample at.
    assert (video.frames.fps, video.sampling.fps, video.sampling.max_frames) == (4.0, 1.0, 2)


@pytest.mark.parametrize("output_type", ["function_call_output", "custom_tool_call_output"])
def test_clips_in_tool_outputs_stay_in_the_tool_output(output_type: str) -> None:
    output = [
        input_text("recorded"),
        {"type": "input_video", "video_url": video_data_url(), "fps": 2},
        audio(b64(WAV)),
    ]
    call: dict[str, Any] = (
        function_call()
        if output_type == "function_call_output"
        else {"type": "custom_tool_call", "call_id": "c1", "name": "screenshot", "input": "x"}
    )
    items = [message("user", "record it"), call, {**function_output(output), "type": output_type}]
    messages = input_to_messages(items)
    tool = messages[-1]
    assert tool.role == pb.ROLE_TOOL
    parts = tool.tool_output.parts.parts
    assert [part.WhichOneof("kind") for part in parts] == ["text", "video", "audio"]
    assert parts[1].video.data == MP4_HEAD
    assert parts[1].video.sampling.fps == 2.0
    assert parts[2].audio.data == WAV


def test_remote_clip_urls_go_to_the_clip_source_only() -> None:
    fetched: list[str] = []

    def clip_source(url: str) -> bytes:
        fetched.append(url)
        return MP4_HEAD if url.endswith(".mp4") else WAV

    def image_source(url: str) -> bytes:
        raise AssertionError("clips are not images")

    content = [
        {"type": "input_video", "video_url": "https://media.example/clip.mp4"},
        {"type": "video", "video": "https://media.example/clip.mp4"},
    ]
    request = build_generate_request(
        {"input": [message("user", content)]}, image_source=image_source, clip_source=clip_source
    ).request
    assert [part.video.data for part in request.messages[0].parts] == [MP4_HEAD, MP4_HEAD]
    assert fetched == ["https://media.example/clip.mp4"] * 2


def test_what_went_in_comes_back_out() -> None:
    items = [
        message(
            "user",
            [
                {"type": "input_video", "video_url": video_data_url(), "fps": 1.5, "max_frames": 6},
                {"type": "video", "video": [RED_URL, RED_URL], "fps": 4},
                audio(b64(WAV)),
            ],
        ),
        function_call(),
        function_output([audio(data_url(MP3_HEAD, "audio/mpeg"), "mp3")]),
    ]
    messages = input_to_messages(items)
    back = messages_to_items(messages)
    assert back[0]["content"][0] == {
        "type": "input_video",
        "video_url": video_data_url(),
        "fps": 1.5,
        "max_frames": 6,
    }
    assert back[0]["content"][1] == {"type": "video", "video": [RED_URL, RED_URL], "fps": 4.0}
    assert back[0]["content"][2] == audio(b64(WAV))
    assert back[2]["output"] == [audio(b64(MP3_HEAD), "mp3")]
    # And translated again, the same contract messages.
    assert input_to_messages(back) == messages


def user_with(part: Any) -> list[Any]:
    return [message("user", [input_text("look"), part])]


# (case, input, param, code)
REFUSED: list[tuple[str, list[Any], str, str]] = [
    (
        "image data URL in a video part",
        user_with({"type": "input_video", "video_url": RED_URL}),
        "input[0].content[1].video_url",
        "invalid_video_url",
    ),
    (
        "audio bytes in a video part",
        user_with({"type": "input_video", "video_url": video_data_url(WAV)}),
        "input[0].content[1].video_url",
        "unsupported_video_format",
    ),
    (
        "an AVIF still in a video part",
        user_with({"type": "input_video", "video_url": video_data_url(AVIF_HEAD)}),
        "input[0].content[1].video_url",
        "unsupported_video_format",
    ),
    (
        "declared webm, bytes mp4",
        user_with({"type": "video_url", "video_url": {"url": video_data_url(MP4_HEAD, "video/webm")}}),
        "input[0].content[1].video_url.url",
        "invalid_video",
    ),
    (
        "malformed base64",
        user_with({"type": "input_video", "video_url": "data:video/mp4;base64,AAAA%%%"}),
        "input[0].content[1].video_url",
        "invalid_base64",
    ),
    (
        "data URL not base64",
        user_with({"type": "video", "video": "data:video/mp4,abc"}),
        "input[0].content[1].video",
        "invalid_video_url",
    ),
    (
        "file path",
        user_with({"type": "input_video", "video_url": "/etc/passwd"}),
        "input[0].content[1].video_url",
        "invalid_video_url",
    ),
    (
        "file URL",
        user_with({"type": "video_url", "video_url": "file:///tmp/a.mp4"}),
        "input[0].content[1].video_url",
        "invalid_video_url",
    ),
    (
        "remote URL, no remote media",
        user_with({"type": "input_video", "video_url": "https://media.example/a.mp4"}),
        "input[0].content[1].video_url",
        "unsupported_value",
    ),
    (
        "url and file_id",
        user_with({"type": "input_video", "video_url": video_data_url(), "file_id": "file-clip"}),
        "input[0].content[1]",
        "invalid_value",
    ),
    (
        "no source",
        user_with({"type": "input_video"}),
        "input[0].content[1].video_url",
        "missing_required_parameter",
    ),
    (
        "fps zero",
        user_with({"type": "input_video", "video_url": video_data_url(), "fps": 0}),
        "input[0].content[1].fps",
        "invalid_value",
    ),
    (
        "fps a string",
        user_with({"type": "input_video", "video_url": video_data_url(), "fps": "2"}),
        "input[0].content[1].fps",
        "invalid_type",
    ),
    (
        "max_frames fractional",
        user_with({"type": "video_url", "video_url": video_data_url(), "max_frames": 2.5}),
        "input[0].content[1].max_frames",
        "invalid_type",
    ),
    (
        "a sampling key this server does not honour",
        user_with({"type": "video", "video": video_data_url(), "nframes": 8}),
        "input[0].content[1].nframes",
        "unsupported_value",
    ),
    (
        "too many frames",
        user_with({"type": "video", "video": [RED_URL] * 257}),
        "input[0].content[1].video",
        "invalid_value",
    ),
    (
        "a frame that is no image",
        user_with({"type": "video", "video": [RED_URL, video_data_url()]}),
        "input[0].content[1].video[1]",
        "unsupported_image_format",
    ),
    (
        "unknown audio format",
        user_with(audio(b64(WAV), "aac")),
        "input[0].content[1].input_audio.format",
        "unsupported_value",
    ),
    (
        "format says mp3, bytes are wav",
        user_with(audio(b64(WAV), "mp3")),
        "input[0].content[1].input_audio.format",
        "invalid_value",
    ),
    (
        "audio data URL says video",
        user_with(audio(video_data_url(WAV), "wav")),
        "input[0].content[1].input_audio.data",
        "invalid_value",
    ),
    (
        "image bytes in an audio part",
        user_with(audio(b64(RED), "wav")),
        "input[0].content[1].input_audio.data",
        "unsupported_audio_format",
    ),
    (
        "malformed audio base64",
        user_with(audio("UklG!!", "wav")),
        "input[0].content[1].input_audio.data",
        "invalid_base64",
    ),
    (
        "audio without format",
        user_with({"type": "input_audio", "input_audio": {"data": b64(WAV)}}),
        "input[0].content[1].input_audio.format",
        "missing_required_parameter",
    ),
    (
        "video data URL in audio_url",
        user_with({"type": "audio_url", "audio_url": {"url": video_data_url()}}),
        "input[0].content[1].audio_url.url",
        "invalid_audio_url",
    ),
    (
        "audio_url without url",
        user_with({"type": "audio_url", "audio_url": {}}),
        "input[0].content[1].audio_url.url",
        "missing_required_parameter",
    ),
    (
        "image file as a video",
        user_with({"type": "input_video", "file_id": "file-red"}),
        "input[0].content[1].file_id",
        "unsupported_video_format",
    ),
    (
        "unknown file",
        user_with({"type": "input_audio", "file_id": "file-nope"}),
        "input[0].content[1].file_id",
        "file_not_found",
    ),
    (
        "video as an input_file",
        user_with({"type": "input_file", "file_id": "file-clip"}),
        "input[0].content[1]",
        "unsupported_file",
    ),
    (
        "bad audio in a tool output",
        [message("user", "x"), function_call(), function_output([audio(b64(WAV), "m4a")])],
        "input[2].output[0].input_audio.format",
        "unsupported_value",
    ),
    (
        "media in a field nobody reads",
        [{"role": "user", "content": "x", "video_url": video_data_url()}],
        "input[0].video_url",
        "unknown_parameter",
    ),
]


@pytest.mark.parametrize(("case", "given", "param", "code"), REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_clips_name_their_field(case: str, given: list[Any], param: str, code: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        build_generate_request({"input": given}, file_source=files)
    error = caught.value
    assert (error.param, error.code, error.status) == (param, code, 400), error.message
    assert f"'{param}'" in error.message or error.code == "file_not_found"


def test_a_clip_over_the_limit_is_refused_before_its_base64_is_decoded() -> None:
    big = "A" * 1_000_000  # would decode to 750,000 bytes
    with pytest.raises(InvalidRequestError) as caught:
        build_generate_request(
            {"input": user_with({"type": "input_video", "video_url": "data:video/mp4;base64," + big})},
            clip_max_bytes=1000,
        )
    assert (caught.value.param, caught.value.code) == ("input[0].content[1].video_url", "video_too_large")
    assert "1000 bytes" in caught.value.message


# (case, mm_processor_kwargs, param, code)
BAD_KWARGS: list[tuple[str, Any, str, str]] = [
    ("unknown key", {"fps": 1, "num_frames": 8}, "mm_processor_kwargs.num_frames", "unknown_parameter"),
    ("fps not a number", {"fps": "2"}, "mm_processor_kwargs.fps", "invalid_type"),
    ("fps negative", {"fps": -1}, "mm_processor_kwargs.fps", "invalid_value"),
    ("max_frames fractional", {"max_frames": 2.5}, "mm_processor_kwargs.max_frames", "invalid_type"),
    ("max_frames boolean", {"max_frames": True}, "mm_processor_kwargs.max_frames", "invalid_type"),
    ("not an object", [1], "mm_processor_kwargs", "invalid_type"),
]


@pytest.mark.parametrize(("case", "kwargs", "param", "code"), BAD_KWARGS, ids=[r[0] for r in BAD_KWARGS])
def test_mm_processor_kwargs_refusals_name_the_key(case: str, kwargs: Any, param: str, code: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        build_generate_request({"input": "hi", "mm_processor_kwargs": kwargs})
    assert (caught.value.param, caught.value.code) == (param, code), caught.value.message
