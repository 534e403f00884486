"""Video and audio on the real engine, per family: rendered by the family's own processor, seen by
the model exactly as mlx-vlm shows it the same frames and samples, counted, cached and batched.

Parity is on the chosen tokens and their logprobs (random weights make greedy text repetitive,
so the logprobs are what would show a frame or a sample out of place), against mlx-vlm's
`prepare_inputs` + `stream_generate` fed the same decoded frames as arrays (never a path).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import numpy as np
import pytest

from tests.engine._clips import (
    FPS,
    audio,
    build_gemma4_with_audio,
    frames,
    mp4_bytes,
    png_bytes,
    reference_clip_tokens,
    tones,
    video,
    wav_samples,
)
from tests.engine._family_engine import (
    SYSTEM,
    RunningEngine,
    image,
    reference_model,
    running_engine,
    text,
    user,
)
from training.families import FAMILIES, build_family
from vlmserve.engine.model import FIXTURE_MODELS_DIR, LoadedModel
from vlmserve.engine.prep.qwen2_video import Qwen2VideoProcessor
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]

MAX_TOKENS = 8
LOGPROB_TOLERANCE = 1e-3


@dataclass
class ClipEngine:
    name: str
    stub: pb_grpc.EngineServiceStub
    reference: LoadedModel
    engine: RunningEngine

    def token_ids(self, request_id: str) -> list[int]:
        """The tokens the engine generated for a finished request (its report)."""
        generator = self.engine.server.generator
        assert generator.wait_idle(30)
        return next(list(r.token_ids) for r in reversed(generator.reports) if r.request_id == request_id)


def _model_dir(name: str, root: Path) -> Path:
    if name == "qwen2_vl":
        return FIXTURE_MODELS_DIR / "qwen2-vl-tiny"
    if name == "gemma4_audio":
        return build_gemma4_with_audio(root / name)
    return build_family(FAMILIES[name], root / name)


# Native video: Qwen3-VL and Qwen3.5 (mlx-vlm's processor), Qwen2-VL and Qwen2.5-VL (ours), Gemma
# 4 with a video processor of its tower's sizes (and an audio tower); frames as images: Gemma 3,
# LLaVA; the Gemma 4 family fixture, whose processor config has no video processor, refuses video.
FAMILIES_WITH_CLIPS = [
    "qwen3_vl",
    "qwen3_5",
    "qwen2_vl",
    "qwen2_5_vl",
    "gemma4_audio",
    "gemma3",
    "llava",
    "gemma4",
]
FRAMES_AS_IMAGES = frozenset({"gemma3", "llava"})
VIDEO_REFUSED = frozenset({"gemma4"})
QWEN2 = frozenset({"qwen2_vl", "qwen2_5_vl"})


@pytest.fixture(scope="module", params=FAMILIES_WITH_CLIPS)
def clip_engine(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ClipEngine]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    name: str = request.param
    model_dir = _model_dir(name, tmp_path_factory.mktemp("clip-models"))
    with running_engine(model_dir) as (engine, stub):
        yield ClipEngine(name, stub, reference_model(model_dir, engine), engine)


def request(messages: list[pb.Message], max_tokens: int = MAX_TOKENS) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        messages=messages, sampling=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens, logprobs=True)
    )


def generate(stub: pb_grpc.EngineServiceStub, messages: list[pb.Message]) -> pb.GenerateResult:
    return stub.GenerateUnary(pb.GenerateUnaryRequest(request=request(messages)), timeout=180).result


def count(stub: pb_grpc.EngineServiceStub, messages: list[pb.Message]) -> int:
    return stub.CountTokens(pb.CountTokensRequest(request=request(messages)), timeout=60).input_tokens


def assert_same(
    engine: ClipEngine, result: pb.GenerateResult, expected: tuple[list[int], int, list[float]]
) -> None:
    """Greedy tokens identical, the prompt the same length, and each token's logprob the same
    (where the engine reports them: a random-weight model may write only hidden markup)."""
    tokens, prompt_tokens, logprobs = expected
    assert result.usage.input_tokens == prompt_tokens
    assert engine.token_ids(result.request_id) == tokens
    got = [entry.logprob for entry in result.logprobs]
    if len(got) == len(logprobs):
        assert np.allclose(got, logprobs, atol=LOGPROB_TOLERANCE), (got, logprobs)


def watch(clip: np.ndarray, question: str = "What moves?") -> list[pb.Message]:
    return [SYSTEM, user(text("Watch:"), video(clip), text(question))]


def reference_for(
    engine: ClipEngine, messages: list[pb.Message], clip: np.ndarray
) -> tuple[list[int], int, list[float]]:
    """mlx-vlm on the same frames: natively (Qwen2-VL with our video processor, the one the
    engine uses), or, for a family without video, the frames sent as images in their place."""
    loaded = engine.reference
    if engine.name in FRAMES_AS_IMAGES:
        as_images = [
            SYSTEM,
            user(text("Watch:"), *[image(png_bytes(frame)) for frame in clip], *messages[1].parts[2:]),
        ]
        return reference_clip_tokens(loaded, as_images, MAX_TOKENS)
    processor = loaded.processor
    if engine.name in QWEN2:
        import copy

        processor = copy.copy(processor)
        own = loaded.processor.video_processor
        processor.video_processor = Qwen2VideoProcessor(
            loaded.processor.image_processor, min_pixels=own.min_pixels, max_pixels=own.max_pixels
        )
    return reference_clip_tokens(loaded, messages, MAX_TOKENS, videos=[clip], processor=processor)


def takes_video(engine: ClipEngine) -> None:
    if engine.name in VIDEO_REFUSED:
        pytest.skip("this fixture refuses video (test_a_video_is_seen_as_mlx_vlm_shows_it)")


def test_a_video_is_seen_as_mlx_vlm_shows_it(clip_engine: ClipEngine) -> None:
    clip = frames(4)
    messages = watch(clip)
    if clip_engine.name in VIDEO_REFUSED:
        with pytest.raises(grpc.RpcError) as refused:
            generate(clip_engine.stub, messages)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = refused.value.details() or ""
        assert "messages[1].parts[1]" in details and "(gemma4) does not take video" in details
        assert "patch_size 16 where its vision tower takes 8" in details
        return
    result = generate(clip_engine.stub, messages)
    expected = reference_for(clip_engine, messages, clip)
    assert_same(clip_engine, result, expected)
    # The frames matter: another clip of the same size changes what the model sees.
    other_clip = frames(4, seed=7)
    other_expected = reference_for(clip_engine, watch(other_clip), other_clip)
    assert_same(clip_engine, generate(clip_engine.stub, watch(other_clip)), other_expected)
    assert abs(other_expected[2][0] - expected[2][0]) > 1e-4


def test_an_encoded_clip_is_seen_as_mlx_vlm_sees_its_decoded_frames(clip_engine: ClipEngine) -> None:
    """MP4 bytes as a client sends them: decoded in the engine's bounded worker at the default
    sampling (2 fps of a 4 fps clip), then rendered as the frames it decoded."""
    takes_video(clip_engine)
    from vlmserve.engine.media import MediaLimits, decode_video

    part = pb.VideoPart(data=mp4_bytes(frames(8, seed=61), fps=4.0), media_type="video/mp4")
    decoded = decode_video(part, MediaLimits())  # the engine's defaults (the test engine's config)
    assert decoded.frames.shape[0] == 4 and decoded.fps == FPS
    messages = [SYSTEM, user(text("Watch:"), pb.Part(video=part), text("What moves?"))]
    result = generate(clip_engine.stub, messages)
    assert_same(clip_engine, result, reference_for(clip_engine, messages, decoded.frames))


def test_audio_is_heard_as_mlx_vlm_hears_it_or_refused_by_name(clip_engine: ClipEngine) -> None:
    samples = tones(0.8)
    messages = [SYSTEM, user(text("Listen:"), audio(samples), text("What is it?"))]
    if clip_engine.name != "gemma4_audio":
        with pytest.raises(grpc.RpcError) as refused:
            generate(clip_engine.stub, messages)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        details = refused.value.details() or ""
        assert "messages[1].parts[1]" in details and "does not take audio" in details
        assert clip_engine.reference.info.architecture in details
        return
    result = generate(clip_engine.stub, messages)
    expected = reference_clip_tokens(
        clip_engine.reference, messages, MAX_TOKENS, audios=[wav_samples(samples)]
    )
    assert_same(clip_engine, result, expected)
    high = tones(0.8, 1760.0)
    higher = [SYSTEM, user(text("Listen:"), audio(high), text("What is it?"))]
    high_expected = reference_clip_tokens(
        clip_engine.reference, higher, MAX_TOKENS, audios=[wav_samples(high)]
    )
    assert_same(clip_engine, generate(clip_engine.stub, higher), high_expected)
    assert abs(high_expected[2][0] - expected[2][0]) > 1e-4  # the samples matter


def test_token_counts_follow_the_frames(clip_engine: ClipEngine) -> None:
    """CountTokens and usage.input_tokens agree, and more frames cost more tokens."""
    takes_video(clip_engine)
    four, eight = watch(frames(4)), watch(frames(8))
    counted = count(clip_engine.stub, eight)
    assert counted == generate(clip_engine.stub, eight).usage.input_tokens
    assert counted > count(clip_engine.stub, four)
    # The caller's sampling: at most 4 of the 8 frames, or half their rate, cost what 4 frames
    # cost (give or take a timestamp's text: those frames are 1 s apart, not 0.5 s).
    capped = [SYSTEM, user(text("Watch:"), video(frames(8), max_frames=4), text("What moves?"))]
    slower = [
        SYSTEM,
        user(text("Watch:"), video(frames(8), fps=2 * FPS, sample_fps=FPS), text("What moves?")),
    ]
    four_tokens = count(clip_engine.stub, four)
    for sampled in (capped, slower):
        tokens = count(clip_engine.stub, sampled)
        assert abs(tokens - four_tokens) <= 4 and tokens < counted
        assert generate(clip_engine.stub, sampled).usage.input_tokens == tokens


def test_pixel_bounds_reach_qwen_video_processors_and_are_refused_elsewhere(clip_engine: ClipEngine) -> None:
    """min_pixels / max_pixels reach the Qwen video processors (per clip); the request as a whole
    prepares and generates. A family whose processor sizes frames itself refuses them by name
    rather than ignore them."""
    takes_video(clip_engine)
    clip = frames(4, 128, 96, seed=71)
    if clip_engine.name not in ("qwen3_vl", "qwen3_5", *QWEN2):
        bounded = [SYSTEM, user(text("Watch:"), video(clip, max_pixels=3136), text("What moves?"))]
        with pytest.raises(grpc.RpcError) as refused:
            generate(clip_engine.stub, bounded)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "messages[1].parts[1]" in (refused.value.details() or "")
        assert "takes no per-frame pixel bounds" in (refused.value.details() or "")
        return
    plain = watch(clip)
    small = [SYSTEM, user(text("Watch:"), video(clip, min_pixels=3136, max_pixels=3136), text("What moves?"))]
    large = [
        SYSTEM,
        user(text("Watch:"), video(clip, min_pixels=50176, max_pixels=50176), text("What moves?")),
    ]
    counts = [count(clip_engine.stub, messages) for messages in (small, plain, large)]
    assert counts[0] < counts[2] and counts[0] <= counts[1] <= counts[2], counts
    for messages in (small, large):
        assert generate(clip_engine.stub, messages).usage.input_tokens == count(clip_engine.stub, messages)


def test_a_video_returned_by_a_tool_reaches_the_model(clip_engine: ClipEngine) -> None:
    takes_video(clip_engine)
    clip = frames(2)
    messages = [
        SYSTEM,
        user(text("Record the screen.")),
        pb.Message(
            role=pb.ROLE_ASSISTANT, tool_calls=[pb.ToolCall(id="call_rec01", name="record", arguments="{}")]
        ),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_output=pb.ToolOutput(
                call_id="call_rec01", parts=pb.PartList(parts=[text("recorded"), video(clip)])
            ),
        ),
    ]
    result = generate(clip_engine.stub, messages)
    if clip_engine.name in FRAMES_AS_IMAGES:
        from vlmserve.engine.prep.lowering import lower_messages

        lowered = lower_messages(messages)
        follow_up = lowered[-1]
        as_images = [*lowered[:-1], user(*[image(png_bytes(frame)) for frame in clip])]
        assert [p.WhichOneof("kind") for p in follow_up.parts] == ["video"]
        expected = reference_clip_tokens(clip_engine.reference, as_images, MAX_TOKENS)
    else:
        expected = reference_for(clip_engine, messages, clip)
    assert_same(clip_engine, result, expected)


LONG_SYSTEM = pb.Message(
    role=pb.ROLE_SYSTEM,
    parts=[text("You describe screen recordings for a support desk. " * 8 + "Keep every answer short.")],
)


def test_the_prefix_cache_reuses_a_clip_only_where_the_same_clip_sat(clip_engine: ClipEngine) -> None:
    if clip_engine.name not in ("qwen2_vl", "qwen2_5_vl", "qwen3_vl"):
        pytest.skip("sliding-window caches reuse at turn boundaries only (test_families)")
    clip = frames(4, seed=21)

    def ask(pixels: np.ndarray, question: str) -> list[pb.Message]:
        return [LONG_SYSTEM, user(text("Watch:"), video(pixels), text(question))]

    # Where the clip ends and starts, as counted (a few template tokens close the user turn; Qwen3-VL
    # writes a timestamp and a vision-start token before the clip's first placeholder).
    through_clip = count(clip_engine.stub, [LONG_SYSTEM, user(text("Watch:"), video(clip))]) - 8
    before_clip = count(clip_engine.stub, [LONG_SYSTEM, user(text("Watch:"))]) + 8
    generate(clip_engine.stub, ask(clip, "What moves first?"))
    again = ask(clip, "Where does it stop?")
    result = generate(clip_engine.stub, again)
    assert result.usage.cached_tokens >= through_clip
    assert_same(clip_engine, result, reference_for(clip_engine, again, clip))
    # Another clip at the same place (the same placeholder tokens): nothing from its first
    # placeholder on.
    other = ask(frames(4, seed=22), "Where does it stop?")
    changed = generate(clip_engine.stub, other)
    assert 16 < changed.usage.cached_tokens <= before_clip
    assert_same(clip_engine, changed, reference_for(clip_engine, other, frames(4, seed=22)))


def test_clips_are_encoded_once_by_content(clip_engine: ClipEngine) -> None:
    """The vision cache keeps a clip's features by its hash (Qwen2-VL, Qwen2.5-VL, Qwen3.5): the
    same clip behind other text (no shared prefix) runs no vision tower; another sampling does."""
    if clip_engine.name not in (*QWEN2, "qwen3_5"):
        pytest.skip("the vision cache serves these towers' clips (loop/vision_cache.py)")
    cache = clip_engine.engine.server.generator.vision_cache
    assert cache is not None
    clip = frames(4, seed=81)
    generate(clip_engine.stub, [SYSTEM, user(text("Watch:"), video(clip), text("What moves?"))])
    encoded, hits = cache.encoded, cache.hits
    other_text = [user(text("A different opening. Watch:"), video(clip), text("What moves?"))]
    result = generate(clip_engine.stub, other_text)
    assert (cache.encoded, cache.hits) == (encoded, hits + 1)
    assert_same(clip_engine, result, reference_for(clip_engine, other_text, clip))
    generate(clip_engine.stub, [user(text("A different opening. Watch:"), video(clip, max_frames=2))])
    assert cache.encoded == encoded + 1


def test_a_clip_row_batched_with_image_and_text_rows_matches_each_alone(clip_engine: ClipEngine) -> None:
    takes_video(clip_engine)
    clip = frames(4, seed=31)
    conversations = {
        "text": [SYSTEM, user(text("Name three colours of the sea at dusk."))],
        "image": [SYSTEM, user(image(png_bytes(frames(1, 56, 84, seed=32)[0])), text("What is this?"))],
        "video": watch(clip),
    }
    alone = {name: generate(clip_engine.stub, messages) for name, messages in conversations.items()}
    futures = {
        name: clip_engine.stub.GenerateUnary.future(
            pb.GenerateUnaryRequest(request=request(messages)), timeout=180
        )
        for name, messages in conversations.items()
    }
    for name, future in futures.items():
        together = future.result().result
        assert (name, together.text, together.usage.input_tokens) == (
            name,
            alone[name].text,
            alone[name].usage.input_tokens,
        )
        assert np.allclose(
            [e.logprob for e in together.logprobs],
            [e.logprob for e in alone[name].logprobs],
            atol=LOGPROB_TOLERANCE,
        )


def test_images_video_and_audio_in_one_request(clip_engine: ClipEngine) -> None:
    """Every kind of media in one prompt, interleaved with text, as mlx-vlm renders them together."""
    if clip_engine.name not in ("qwen3_vl", "qwen3_5", "gemma4_audio"):
        pytest.skip("Qwen2-VL: test_qwen2_images_and_clips_in_one_request; the others refuse video or audio")
    clip, picture = frames(4, seed=91), frames(1, 56, 84, seed=92)[0]
    samples = tones(0.6, 880.0)
    parts = [image(png_bytes(picture)), text("then"), video(clip)]
    if clip_engine.name == "gemma4_audio":
        parts += [text("and"), audio(samples)]
    messages = [SYSTEM, user(*parts, text("What changed?"))]
    result = generate(clip_engine.stub, messages)
    if clip_engine.name == "qwen3_5":
        # mlx-vlm's Qwen3.5 encodes the images and drops the clip when a request has both (it
        # fails on the features' count): no reference. Both are seen: changing either changes
        # what the model reads.
        other_picture = [
            SYSTEM,
            user(image(png_bytes(frames(1, 56, 84, seed=93)[0])), *parts[1:], text("What changed?")),
        ]
        other_clip = [SYSTEM, user(*parts[:2], video(frames(4, seed=94)), text("What changed?"))]
        for other in (other_picture, other_clip):
            changed = generate(clip_engine.stub, other)
            assert changed.usage.input_tokens == result.usage.input_tokens
            assert abs(changed.logprobs[0].logprob - result.logprobs[0].logprob) > 1e-4
        return
    expected = reference_clip_tokens(
        clip_engine.reference,
        messages,
        MAX_TOKENS,
        videos=[clip],
        audios=[wav_samples(samples)] if clip_engine.name == "gemma4_audio" else (),
    )
    assert_same(clip_engine, result, expected)


def test_qwen2_images_and_clips_in_one_request(clip_engine: ClipEngine) -> None:
    """mlx-vlm's Qwen2-VL takes images or videos, not both: the engine takes both. A clip of one
    picture twice is that picture (same patches, same M-RoPE grid), so [image A, clip(B, B)] must
    read exactly as [image A, image B]."""
    if clip_engine.name not in QWEN2:
        pytest.skip("Qwen2-VL's merge only")
    a, b = frames(1, seed=41)[0], frames(1, seed=42)[0]
    both = [SYSTEM, user(image(png_bytes(a)), text("then"), video(np.stack([b, b])), text("Compare."))]
    images = [SYSTEM, user(image(png_bytes(a)), text("then"), image(png_bytes(b)), text("Compare."))]
    mixed, still = generate(clip_engine.stub, both), generate(clip_engine.stub, images)
    assert mixed.usage.input_tokens == still.usage.input_tokens
    assert np.allclose(
        [e.logprob for e in mixed.logprobs], [e.logprob for e in still.logprobs], atol=LOGPROB_TOLERANCE
    )
