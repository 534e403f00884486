"""Clip rendering's pure parts (prep/clip_inputs.py, qwen2_video.py, prompt.py): no model loaded."""

from __future__ import annotations

import numpy as np
import pytest
from mlx_vlm.models.qwen3_vl.processing_qwen3_vl import Qwen3VLImageProcessor

from tests.engine._clips import frames
from vlmserve.engine.prep.clip_inputs import DecodedClip, clip_hash, clip_spans, frames_budget
from vlmserve.engine.prep.prompt import PromptClip, to_template_conversation
from vlmserve.engine.prep.qwen2_video import Qwen2VideoProcessor
from vlmserve.engine.v1 import engine_pb2 as pb

# Qwen2-VL's real image processor constants (patch 14, merge 2), with small pixel bounds.
IMAGE_PROCESSOR = dict(
    patch_size=14,
    merge_size=2,
    temporal_patch_size=2,
    image_mean=[0.48145466, 0.4578275, 0.40821073],
    image_std=[0.26862954, 0.26130258, 0.27577711],
)


def qwen2(min_pixels: int, max_pixels: int) -> tuple[Qwen3VLImageProcessor, Qwen2VideoProcessor]:
    images = Qwen3VLImageProcessor(min_pixels=min_pixels, max_pixels=max_pixels, **IMAGE_PROCESSOR)
    return images, Qwen2VideoProcessor(images, min_pixels=min_pixels, max_pixels=max_pixels)


@pytest.mark.parametrize(
    ("width", "height", "min_pixels", "max_pixels"),
    [(64, 48, 3136, 12544), (200, 120, 3136, 50176), (56, 300, 12544, 12544), (640, 360, 3136, 100352)],
)
def test_a_two_frame_clip_of_one_picture_is_that_picture(
    width: int, height: int, min_pixels: int, max_pixels: int
) -> None:
    """Qwen2-VL's image processor repeats a picture over the two temporal slots of a patch, so a
    clip of the picture twice must give the same patches and grid (transformers' math)."""
    images, videos = qwen2(min_pixels, max_pixels)
    picture = frames(1, width, height, seed=width)[0]
    image = images(images=[picture.transpose(2, 0, 1)])
    clip = videos(videos=[np.stack([picture, picture]).transpose(0, 3, 1, 2)])
    assert clip["video_grid_thw"].tolist() == image["image_grid_thw"].tolist()
    np.testing.assert_array_equal(clip["pixel_values_videos"], image["pixel_values"])


def test_frames_pair_up_in_time_and_an_odd_last_frame_is_repeated() -> None:
    _, videos = qwen2(3136, 12544)
    clip = frames(3, 64, 48)
    out = videos(videos=[clip.transpose(0, 3, 1, 2)])
    t, h, w = out["video_grid_thw"][0].tolist()
    assert t == 2
    rows = out["pixel_values_videos"]
    assert rows.shape[0] == t * h * w
    # The second temporal patch is frames 2 and 2 (the last one repeated): as a clip of those two.
    last = videos(videos=[np.stack([clip[2], clip[2]]).transpose(0, 3, 1, 2)])["pixel_values_videos"]
    np.testing.assert_array_equal(rows[h * w :], last)
    # The first is frames 0 and 1, which differ: not the picture of frame 0 alone.
    first = videos(videos=[np.stack([clip[0], clip[0]]).transpose(0, 3, 1, 2)])["pixel_values_videos"]
    assert not np.array_equal(rows[: h * w], first)


def decoded(count: int, content_hash: str = "h") -> DecodedClip:
    part = pb.Part(video=pb.VideoPart())
    return DecodedClip(
        clip=PromptClip(part, "messages[0].parts[0]"), content_hash=content_hash, frames=frames(count)
    )


@pytest.mark.parametrize(
    ("counts", "budget", "kept"),
    [
        ([4], 16, [[0, 1, 2, 3]]),  # under budget: every frame
        ([20], 4, [[0, 6, 13, 19]]),  # evenly across the clip, first and last kept
        ([10, 10], 4, [[0, 6], [3, 9]]),  # one budget for the request, across its clips in order
        ([3], 1, [[0, 2]]),  # at least two frames, as mlx-vlm keeps
    ],
)
def test_frames_taken_as_images_share_one_budget(
    counts: list[int], budget: int, kept: list[list[int]]
) -> None:
    assert frames_budget([decoded(n) for n in counts], budget) == kept


P = 7  # a placeholder token


@pytest.mark.parametrize(
    ("ids", "clips", "arrays", "spans"),
    [
        # One run per clip (Qwen2-VL video, audio).
        ([1, P, P, 2, P, P, P, 3], 2, {}, [((1, 2),), ((4, 3),)]),
        # Qwen3-VL: a run per two frames (timestamps between), told apart by the grids.
        (
            [1, P, P, 9, P, P, 9, P, P, 2],
            2,
            {"video_grid_thw": np.array([[2, 2, 2], [1, 2, 2]])},
            [((1, 2), (4, 2)), ((7, 2),)],
        ),
        # Gemma 4: a run per frame.
        ([P, 9, P, 9, P, 1], 2, {"num_frames_per_video": np.array([1, 2])}, [((0, 1),), ((2, 1), (4, 1))]),
    ],
)
def test_each_clip_owns_its_placeholder_runs(
    ids: list[int], clips: int, arrays: dict[str, np.ndarray], spans: list[tuple[tuple[int, int], ...]]
) -> None:
    prepared = clip_spans(ids, P, [decoded(2, f"clip{n}") for n in range(clips)], arrays)
    assert [clip.spans for clip in prepared] == spans
    assert [clip.content_hash for clip in prepared] == [f"clip{n}" for n in range(clips)]


def test_runs_that_cannot_be_told_apart_share_one_combined_hash() -> None:
    """Still exact for the prefix cache: the clips are reused only all together."""
    ids = [P, 1, P, 1, P]
    prepared = clip_spans(ids, P, [decoded(2, "a"), decoded(2, "b")], {})
    assert prepared[0].spans == ((0, 1), (2, 1), (4, 1)) and prepared[1].spans == ()
    assert prepared[0].content_hash == prepared[1].content_hash not in ("a", "b")


def test_a_clip_hash_covers_the_frames_and_the_sampling() -> None:
    image = pb.ImagePart(data=b"png", media_type="image/png")
    base = pb.Part(video=pb.VideoPart(frames=pb.VideoFrames(frames=[image], fps=2.0)))
    slower = pb.Part(video=pb.VideoPart(frames=pb.VideoFrames(frames=[image], fps=1.0)))
    fewer = pb.Part(
        video=pb.VideoPart(
            frames=pb.VideoFrames(frames=[image], fps=2.0), sampling=pb.VideoSampling(max_frames=4)
        )
    )
    same = pb.Part()
    same.CopyFrom(base)
    assert clip_hash(base) == clip_hash(same)
    assert len({clip_hash(base), clip_hash(slower), clip_hash(fewer)}) == 3


def test_clips_keep_their_place_and_path_through_the_lowering() -> None:
    clip = pb.Part(video=pb.VideoPart(data=b"\x00\x00\x00\x18ftypmp42", media_type="video/mp4"))
    sound = pb.Part(audio=pb.AudioPart(data=b"RIFF", media_type="audio/wav"))
    messages = [
        pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="Look")), clip]),
        pb.Message(
            role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="call_1", name="listen", arguments="{}")]
        ),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_output=pb.ToolOutput(
                call_id="call_1", parts=pb.PartList(parts=[pb.Part(text=pb.TextPart(text="ok")), sound])
            ),
        ),
    ]
    conversation = to_template_conversation(messages)
    assert [(c.kind, c.where) for c in conversation.clips] == [
        ("video", "messages[0].parts[1]"),
        ("audio", "messages[2].tool_output.parts.parts[1]"),
    ]
    assert conversation.messages[0]["content"][1] == {"type": "video"}
    assert conversation.messages[-1] == {"role": "user", "content": [{"type": "audio"}]}
