"""Training batches for the media fixture: conversations rendered as the engine renders them
(training/media_conversations.py), clips put through the model's own mlx-vlm processor, the
answer appended after the generation prompt.

Every row of a batch is the same conversation shape with clips of one size (one frame count,
one audio duration), so the processor's output needs no padding; answers are right-padded and
masked out of the loss.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from training import beeps, squares_video
from training.media_conversations import (
    MISSING_ANSWERS,
    SHAPES,
    MediaConversation,
    MediaKind,
    missing_clip_conversations,
    render,
)

# Share of audio rows that are noise only (-> "no beeps").
SILENT_SHARE = 1 / 6
# Share of video clips seen through an MP4 round trip, as clients' clips arrive (trained on
# clean frames only, the model missed 1 of 48 MP4 clips it answered right clean).
MP4_SHARE = 0.5


@dataclass(frozen=True)
class Batch:
    """Token ids (B, L + A): prompt then answer (A = longest answer, right-padded); media inputs
    for the model's forward; targets (B, A) and their 0/1 weights."""

    input_ids: mx.array
    media: dict[str, mx.array]
    targets: mx.array
    weights: mx.array

    @property
    def answer_width(self) -> int:
        return int(self.targets.shape[1])


def end_of_turn(tokenizer: Any) -> str:
    """What the chat template writes after an assistant's text (`<|im_end|>`, `<turn|>`): the
    token that ends a reply (an eos of the model's generation_config.json)."""
    marker = "ANSWER-END-PROBE"
    messages = [{"role": "user", "content": "q"}, {"role": "assistant", "content": marker}]
    text: str = tokenizer.apply_chat_template(messages, tokenize=False)
    return text[text.index(marker) + len(marker) :].split("\n", 1)[0]


def answer_tokens(tokenizer: Any, answer: str) -> list[int]:
    ids: list[int] = tokenizer.encode(answer + end_of_turn(tokenizer), add_special_tokens=False)
    return ids


def build_batch(
    processor: Any,
    prompt: str,
    answers: list[str],
    videos: list[np.ndarray] | None = None,
    audio: list[np.ndarray] | None = None,
) -> Batch:
    """Rows of `prompt` with their clips (in row order, a row's clips together) and answers."""
    rows = len(answers)
    kwargs: dict[str, Any] = {}
    if videos:
        kwargs["videos"] = videos
        kwargs["fps"] = [squares_video.FPS] * len(videos)
    if audio:
        kwargs["audio"] = audio
    inputs = processor(text=[prompt] * rows, **kwargs)
    prompt_ids = np.array(inputs["input_ids"])
    tokenizer = processor.tokenizer
    answer_ids = [answer_tokens(tokenizer, answer) for answer in answers]
    width = max(len(ids) for ids in answer_ids)
    pad = tokenizer.pad_token_id
    targets = np.full((rows, width), pad, dtype=np.int32)
    weights = np.zeros((rows, width), dtype=np.float32)
    for row, ids in enumerate(answer_ids):
        targets[row, : len(ids)] = ids
        weights[row, : len(ids)] = 1.0
    media = {
        name: value
        for name, value in inputs.items()
        if name in ("pixel_values_videos", "video_grid_thw", "input_features", "input_features_mask")
    }
    return Batch(
        input_ids=mx.array(np.concatenate([prompt_ids, targets], axis=1)),
        media=media,
        targets=mx.array(targets),
        weights=mx.array(weights),
    )


def answer_logits(model: Any, batch: Batch) -> mx.array:
    """(B, A, vocab): the logits that predict each answer token."""
    width = batch.answer_width
    language_model = model.language_model
    if hasattr(language_model, "_position_ids"):  # Qwen's M-RoPE state, kept between calls
        language_model._position_ids = None
        language_model._rope_deltas = None
    media = dict(batch.media)
    pixel_values = media.pop("pixel_values", None)
    output = model(batch.input_ids, pixel_values, **media)
    logits: mx.array = output.logits[:, -(width + 1) : -1, :]
    return logits


def loss_fn(model: Any, batch: Batch) -> mx.array:
    """Mean cross-entropy over the answer tokens (the end of turn included)."""
    logits = answer_logits(model, batch).astype(mx.float32)
    losses = nn.losses.cross_entropy(logits, batch.targets, reduction="none")
    loss: mx.array = (losses * batch.weights).sum() / batch.weights.sum()
    return loss


def row_exact_match(model: Any, batch: Batch) -> np.ndarray:
    """Per row: every answer token is the argmax (= greedy decoding gives the answer and stops)."""
    predicted = np.array(mx.argmax(answer_logits(model, batch), axis=-1))
    correct = (predicted == np.array(batch.targets)) | (np.array(batch.weights) == 0)
    ok: np.ndarray = correct.all(axis=1)
    return ok


def video_batch(
    processor: Any, rng: random.Random, shape: str, rows: int, marker: str | None = None
) -> Batch:
    """`rows` fresh squares clips of one frame count in conversation `shape`."""
    frames = rng.choice(squares_video.FRAME_COUNTS)
    if shape == "follow_up":
        return _follow_up_rows(processor, rng, rows, "video", marker, frames)
    clips = [_as_sent(rng, squares_video.draw_clip(rng, frames)) for _ in range(rows)]
    prompt = render(SHAPES[shape]("video", ""), processor.tokenizer, marker)
    return build_batch(
        processor, prompt, [clip.answer for clip in clips], videos=[clip.channels_first() for clip in clips]
    )


def _follow_up_rows(
    processor: Any, rng: random.Random, rows: int, kind: MediaKind, marker: str | None, size: float
) -> Batch:
    """A follow-up batch: every row replays the same earlier answer (the prompt text is shared)
    with its own fresh earlier clip of that answer, then a fresh clip (`size`: frames, seconds)."""
    videos: list[np.ndarray] = []
    audio: list[np.ndarray] = []
    answers: list[str] = []
    if kind == "video":
        earlier = squares_video.draw_clip(rng, int(size))
        for _ in range(rows):
            clip = _as_sent(rng, squares_video.draw_clip(rng, int(size)))
            again = _as_sent(rng, _same_colours(rng, earlier))
            videos += [again.channels_first(), clip.channels_first()]
            answers.append(clip.answer)
        earlier_answer = earlier.answer
    else:
        earlier_beeps = _draw_beeps(rng, size)
        for _ in range(rows):
            sound = _draw_beeps(rng, size)
            audio += [_same_beeps(rng, earlier_beeps, size).samples, sound.samples]
            answers.append(sound.answer)
        earlier_answer = earlier_beeps.answer
    prompt = render(SHAPES["follow_up"](kind, earlier_answer), processor.tokenizer, marker)
    return build_batch(processor, prompt, answers, videos=videos or None, audio=audio or None)


def _as_sent(rng: random.Random, clip: squares_video.SquaresClip) -> squares_video.SquaresClip:
    """`clip`, or (MP4_SHARE of the time) what an MP4 of it decodes to."""
    return clip.through_mp4() if rng.random() < MP4_SHARE else clip


def _same_colours(rng: random.Random, like: squares_video.SquaresClip) -> squares_video.SquaresClip:
    """A fresh clip (new cells and sizes) with `like`'s frame count and colours."""
    frames = len(like.frames)
    colours = [like.first] * (frames // 2) + [like.second] * (frames - frames // 2)
    drawn = np.stack([squares_video.draw_frame(rng, colour) for colour in colours])
    return squares_video.SquaresClip(frames=drawn, first=like.first, second=like.second)


def _same_beeps(rng: random.Random, like: beeps.BeepsClip, seconds: float) -> beeps.BeepsClip:
    """A fresh clip with `like`'s count and pitch."""
    while True:
        clip = beeps.draw_clip(rng, count=like.count, duration=seconds)
        if clip.pitch == like.pitch:
            return clip


def _draw_beeps(rng: random.Random, seconds: float) -> beeps.BeepsClip:
    count = 0 if rng.random() < SILENT_SHARE else None
    return beeps.draw_clip(rng, count=count, duration=seconds)


def audio_batch(
    processor: Any, rng: random.Random, shape: str, rows: int, marker: str | None = None
) -> Batch:
    """`rows` fresh beeps clips (some noise only) of one duration in conversation `shape`."""
    seconds = rng.choice(beeps.DURATIONS)
    if shape == "follow_up":
        return _follow_up_rows(processor, rng, rows, "audio", marker, seconds)
    clips = [_draw_beeps(rng, seconds) for _ in range(rows)]
    prompt = render(SHAPES[shape]("audio", ""), processor.tokenizer, marker)
    return build_batch(processor, prompt, [clip.answer for clip in clips], audio=[c.samples for c in clips])


def controls_batch(processor: Any, kind: MediaKind) -> Batch:
    """The question without its clip (-> `no video` / `no audio`), one row per control shape."""
    conversations: list[MediaConversation] = list(missing_clip_conversations(kind))
    prompts = [render(conversation, processor.tokenizer) for conversation in conversations]
    if len(set(prompts)) != 1:
        raise AssertionError("one control prompt per kind")
    return build_batch(processor, prompts[0], [MISSING_ANSWERS[kind]] * len(prompts))
