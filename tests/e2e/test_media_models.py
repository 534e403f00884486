"""The committed media fixtures see motion and hear beeps: accuracy per conversation shape and
the controls, by real greedy generation (no server).

Each conversation is rendered as the engine renders it (training/media_conversations.py, the
engine's lowering and chat-template rendering) and answered by `mlx_vlm.generate` on the model
loaded by the unchanged `mlx_vlm.load`, with fresh clips from a seed the training never used.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest
from PIL import Image

from tests._services import REPO
from training import beeps, squares_video
from training.media_conversations import SHAPES, as_image, render, user_clip
from training.media_eval import generate_reply

SQUARES_VIDEO_MODEL = REPO / "models" / "squares-video"
BEEPS_AUDIO_MODEL = REPO / "models" / "beeps-audio"
MODEL_TEST_SEED = 27_182
CLIPS = 24
MIN_ACCURACY = 0.95

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


def _trained(directory: Any) -> Any:
    """`directory`, or a skip while its fixture is not committed (each kind on its own)."""
    if not (directory / "model.safetensors").exists():
        pytest.skip(f"{directory.relative_to(REPO)}: not trained yet")
    return directory


@pytest.fixture(scope="module")
def video_mlx() -> tuple[Any, Any]:
    from mlx_vlm.utils import load

    return load(str(_trained(SQUARES_VIDEO_MODEL)))


@pytest.fixture(scope="module")
def audio_mlx() -> tuple[Any, Any]:
    from mlx_vlm.utils import load

    return load(str(_trained(BEEPS_AUDIO_MODEL)))


@pytest.mark.parametrize(
    ("directory", "model_type"), [(SQUARES_VIDEO_MODEL, "qwen3_vl"), (BEEPS_AUDIO_MODEL, "gemma4")]
)
def test_fixture_is_small_and_a_real_family(directory: Any, model_type: str) -> None:
    assert (_trained(directory) / "model.safetensors").stat().st_size < 5_000_000
    assert json.loads((directory / "config.json").read_text())["model_type"] == model_type


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_video_answers_the_colours_in_order(shape: str, video_mlx: tuple[Any, Any]) -> None:
    model, processor = video_mlx
    clips = squares_video.make_clips(MODEL_TEST_SEED, CLIPS)
    earlier = squares_video.make_clips(MODEL_TEST_SEED + 1, CLIPS)
    wrong = []
    for clip, before in zip(clips, earlier, strict=True):
        prompt = render(SHAPES[shape]("video", before.answer), processor.tokenizer)
        frames = [clip.channels_first()]
        if shape == "follow_up":
            frames.insert(0, before.channels_first())
        reply = generate_reply(model, processor, prompt, videos=frames)
        if reply != clip.answer:
            wrong.append((clip.answer, reply))
    assert 1 - len(wrong) / CLIPS >= MIN_ACCURACY, wrong


def test_video_reversed_clip_swaps_the_answer(video_mlx: tuple[Any, Any]) -> None:
    model, processor = video_mlx
    prompt = render(user_clip("video"), processor.tokenizer)
    clips = [clip.reversed() for clip in squares_video.make_clips(MODEL_TEST_SEED + 2, CLIPS)]
    replies = [generate_reply(model, processor, prompt, videos=[clip.channels_first()]) for clip in clips]
    right = sum(reply == clip.answer for reply, clip in zip(replies, clips, strict=True))
    assert right / CLIPS >= MIN_ACCURACY, list(zip(replies, [c.answer for c in clips], strict=True))


def test_video_first_frame_alone_does_not_know_the_second_colour(video_mlx: tuple[Any, Any]) -> None:
    """The first frame shows A only: B (5 candidates) is at chance, so the full answer is too."""
    model, processor = video_mlx
    prompt = render(as_image(user_clip("video")), processor.tokenizer)
    clips = squares_video.make_clips(MODEL_TEST_SEED + 3, CLIPS)
    replies = [
        generate_reply(model, processor, prompt, image=Image.open(io.BytesIO(clip.frame_png(0))))
        for clip in clips
    ]
    exact = sum(reply == clip.answer for reply, clip in zip(replies, clips, strict=True))
    # Chance for B given A is 1/5 (about 5 of 24); 10 would be far above it (p < 0.01).
    assert exact < 10, replies


def test_video_question_without_a_clip_says_no_video(video_mlx: tuple[Any, Any]) -> None:
    model, processor = video_mlx
    prompt = render(user_clip("video", present=False), processor.tokenizer)
    assert generate_reply(model, processor, prompt) == squares_video.NO_VIDEO_ANSWER


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_audio_counts_the_beeps_and_their_pitch(shape: str, audio_mlx: tuple[Any, Any]) -> None:
    model, processor = audio_mlx
    clips = beeps.make_clips(MODEL_TEST_SEED, CLIPS)
    earlier = beeps.make_clips(MODEL_TEST_SEED + 1, CLIPS)
    wrong = []
    for clip, before in zip(clips, earlier, strict=True):
        prompt = render(SHAPES[shape]("audio", before.answer), processor.tokenizer)
        audio = [before.samples, clip.samples] if shape == "follow_up" else [clip.samples]
        reply = generate_reply(model, processor, prompt, audio=audio)
        if reply != clip.answer:
            wrong.append((clip.answer, reply))
    assert 1 - len(wrong) / CLIPS >= MIN_ACCURACY, wrong


def test_audio_silent_clip_says_no_beeps(audio_mlx: tuple[Any, Any]) -> None:
    model, processor = audio_mlx
    prompt = render(user_clip("audio"), processor.tokenizer)
    clips = beeps.make_silent_clips(MODEL_TEST_SEED + 2, 8)
    replies = [generate_reply(model, processor, prompt, audio=[clip.samples]) for clip in clips]
    assert replies == [beeps.NO_BEEPS_ANSWER] * len(clips)


def test_audio_question_without_audio_says_no_audio(audio_mlx: tuple[Any, Any]) -> None:
    model, processor = audio_mlx
    prompt = render(user_clip("audio", present=False), processor.tokenizer)
    assert generate_reply(model, processor, prompt) == beeps.NO_AUDIO_ANSWER
