"""The vision-feature cache on the families (issue 33): features kept per image (the partition, the
model and the image's content hash), so an agent's history of screenshots is encoded once, and the
output is token-identical with and without the cache where the family's tower runs each image on
its own (Qwen, Gemma 4's images of different sizes). Where mlx-vlm runs a request's images
together (Gemma 3, Gemma 4's of one size), the images still to encode run together too, so a
request with nothing cached computes what mlx-vlm computes; with some cached, the rounding of the
smaller run may differ (Gemma 3's random-weight fixture shows it: its features are ~1e-8)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.v1 import engine_pb2 as pb

from ._family_engine import SYSTEM, greedy, image, png, running_engine, text, user

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]

CACHED_FAMILIES = [
    "qwen3_vl",
    "qwen3_vl_moe",
    "qwen3_5",
    "qwen3_5_moe",
    "gemma3",
    "gemma4",
    "llava",
    "mistral3",
    "idefics3",
    "llama4",
    "glm4v",
    "glm4v_moe",
]
RUN_TOGETHER_VISIBLY = {"gemma3"}
# An agent's turns: the screen, then the screen and a new screenshot, then a third one; the
# second image at another size (a tool's crop), the first and third of one size.
SCREENS = [png(64, 48, seed=71), png(40, 72, seed=72), png(64, 48, seed=73)]
SAME_SIZE = [png(64, 48, seed=74), png(64, 48, seed=75), png(64, 48, seed=76)]


def turns(model: Path, screens: list[bytes], *, cache_mib: int) -> tuple[list[str], int, int]:
    """Each turn's text, and the images the vision tower encoded and the cache served. The
    prefix cache is off, so every turn's images are run (none lie in a reused prefix)."""
    texts = []
    with running_engine(model, vision_cache_mib=cache_mib, prefix_cache_min_tokens=0) as (engine, stub):
        for count in range(1, len(screens) + 1):
            images = [image(screen) for screen in screens[:count]]
            request = greedy([SYSTEM, user(text("What changed on the screen?"), *images)], max_tokens=8)
            result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=300).result
            texts.append(result.text)
        vision = engine.server.generator.vision_cache
        assert vision is not None
        return texts, vision.encoded, vision.hits


@pytest.mark.parametrize(
    ("name", "screens"),
    [*((name, SCREENS) for name in CACHED_FAMILIES), ("gemma4", SAME_SIZE)],  # one array, not a list
)
def test_each_screenshot_is_encoded_once_with_the_same_output(
    name: str,
    screens: list[bytes],
    family_models: dict[str, Path],  # noqa: F811
) -> None:
    cached, encoded, hits = turns(family_models[name], screens, cache_mib=64)
    uncached, encoded_without, hits_without = turns(family_models[name], screens, cache_mib=0)
    assert (encoded, hits) == (3, 3), "each image once; turns 2 and 3 take the earlier ones"
    assert (encoded_without, hits_without) == (6, 0)
    if name in RUN_TOGETHER_VISIBLY:
        assert cached[0] == uncached[0]  # nothing cached yet: the same run
    else:
        assert cached == uncached


@pytest.mark.parametrize("name", ["qwen3_vl", "qwen3_5", "gemma3", "gemma4", "idefics3", "llama4", "glm4v"])
def test_a_restarted_engine_does_not_encode_a_screenshot_it_has_seen(
    name: str,
    tmp_path: Path,
    family_models: dict[str, Path],  # noqa: F811
) -> None:
    """The disk tier: the same screenshot after a restart, behind another prompt (the prefix cache
    cannot serve it), comes from disk: the vision tower does not run; the output is the same."""
    settings = {"prefix_cache_dir": str(tmp_path), "prefix_cache_min_tokens": 0}

    def ask(stub: Any, words: str) -> str:
        request = greedy([SYSTEM, user(text(words), image(SCREENS[0]))], max_tokens=8)
        return str(stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=300).result.text)

    with running_engine(family_models[name], **settings) as (engine, stub):
        ask(stub, "What is on the screen?")
        expected = ask(stub, "Now describe it in other words.")  # from the memory tier
        assert engine.server.generator.vision_cache.encoded == 1  # type: ignore[union-attr]
    with running_engine(family_models[name], **settings) as (engine, stub):
        again = ask(stub, "Now describe it in other words.")
        vision = engine.server.generator.vision_cache
        assert vision is not None and vision.disk is not None
        assert (vision.encoded, vision.disk.hits) == (0, 1)
    assert again == expected
    # Another tenant's restart finds nothing of it.
    with running_engine(family_models[name], **settings) as (engine, stub):
        request = greedy([SYSTEM, user(text("What is on the screen?"), image(SCREENS[0]))], max_tokens=8)
        request.partition_key = "another tenant"
        stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=300)
        assert engine.server.generator.vision_cache.encoded == 1  # type: ignore[union-attr]


@pytest.mark.parametrize("name", ["glm4v", "mistral3", "idefics3"])
def test_a_screenshot_at_low_detail_is_not_served_its_high_detail_features(
    name: str,
    family_models: dict[str, Path],  # noqa: F811
) -> None:
    """The processor's cheaper view of the same bytes (`detail: low`) is another image to the
    cache: its features were served from the full view's entry (GLM-4V: 17 image tokens read
    from 29 features), so the output differed from a fresh request's."""
    screen = png(400, 100, seed=3)

    def ask(stub: Any, detail: pb.ImageDetail.ValueType) -> pb.GenerateResult:
        part = pb.Part(image=pb.ImagePart(data=screen, media_type="image/png", detail=detail))
        request = greedy([SYSTEM, user(part, text("What is this?"))], max_tokens=8)
        return stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=300).result

    settings = {"vision_cache_mib": 64, "prefix_cache_min_tokens": 0}
    with running_engine(family_models[name], **settings) as (engine, stub):
        ask(stub, pb.IMAGE_DETAIL_HIGH)
        low = ask(stub, pb.IMAGE_DETAIL_LOW)
        assert engine.server.generator.vision_cache.hits == 0  # type: ignore[union-attr]
    with running_engine(family_models[name], vision_cache_mib=0) as (_, stub):
        fresh = ask(stub, pb.IMAGE_DETAIL_LOW)
    assert (low.text, low.usage.input_tokens) == (fresh.text, fresh.usage.input_tokens)


@dataclass
class Conversation:
    texts: list[str]
    encoded: int  # images the vision tower encoded, all turns
    input_tokens: list[int]
    cached_tokens: list[int]


def conversation(model: Path, *, prefix_cache: bool) -> Conversation:
    """An agent's three turns, each resending the history (the answers too) with a new
    screenshot; the vision cache off."""
    texts: list[str] = []
    inputs: list[int] = []
    cached: list[int] = []
    messages = [SYSTEM]
    settings = {"vision_cache_mib": 0, "prefix_cache_min_tokens": 8 if prefix_cache else 0}
    with running_engine(model, **settings) as (engine, stub):
        for screen in SCREENS:
            messages.append(user(text("What changed on the screen?"), image(screen)))
            request = greedy(messages, max_tokens=8)
            result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=300).result
            texts.append(result.text)
            inputs.append(result.usage.input_tokens)
            cached.append(result.usage.cached_tokens)
            messages.append(pb.Message(role=pb.ROLE_ASSISTANT, parts=[text(result.text or "ok")]))
        vision = engine.server.generator.vision_cache
        assert vision is not None
        return Conversation(texts, vision.encoded, inputs, cached)


@pytest.mark.parametrize("name", ["idefics3", "llama4"])
def test_tiled_screenshots_inside_a_reused_prefix_are_not_encoded(
    name: str,
    family_models: dict[str, Path],  # noqa: F811
) -> None:
    """Idefics3's and Llama 4's images come in several placeholder runs (a run a tile): an image
    whose whole block the prefix cache serves is covered all the same, its tiles never encoded."""
    reused = conversation(family_models[name], prefix_cache=True)
    fresh = conversation(family_models[name], prefix_cache=False)
    assert (reused.encoded, fresh.encoded) == (3, 6), "the new screenshot only; without reuse, every one"
    assert reused.texts == fresh.texts


@pytest.mark.parametrize("name", ["idefics3", "llama4", "mistral3"])
def test_each_turn_reuses_the_previous_prompt_past_its_images(
    name: str,
    family_models: dict[str, Path],  # noqa: F811
) -> None:
    """An image of several placeholder runs (tiles, Mistral 3's rows) is one span for the prefix
    cache: the next turn, which adds an image after it, reuses the whole previous prompt (it
    stopped at the first image's second run, where the next image's span was taken to be)."""
    turns = conversation(family_models[name], prefix_cache=True)
    for turn in (1, 2):
        assert turns.cached_tokens[turn] >= turns.input_tokens[turn - 1], (
            turns.input_tokens,
            turns.cached_tokens,
        )


def test_llama4_keeps_the_global_view_its_prompt_places(family_models: dict[str, Path]) -> None:  # noqa: F811
    """mlx-vlm's Llama 4 image processor dropped the global view of an image of several tiles
    while its prompt kept the view's placeholders, so they read features past the image's (NaN
    or noise, run to run): every placeholder run has its tile, and two runs embed alike."""
    import mlx.core as mx

    from vlmserve.engine.config import EngineConfig
    from vlmserve.engine.jobs import JobKind
    from vlmserve.engine.loop.model_inputs import build_model_inputs, prompt_image_spans
    from vlmserve.engine.model import load_model
    from vlmserve.engine.prep.clip_inputs import token_runs
    from vlmserve.engine.prep.preparer import RequestPreparer

    config = EngineConfig(model=str(family_models["llama4"]))
    loaded = load_model(
        config.model, max_output_tokens=16, image_limits=config.image_limits, max_images_per_request=4
    )
    preparer = RequestPreparer(loaded, max_request_pixels=1 << 24, decode_slots=1)
    wide = png(900, 300, seed=77)  # a 1 x 3 grid: three tiles and the global view
    request = preparer.prepare(
        greedy([SYSTEM, user(text("What?"), image(wide), image(SCREENS[1]))]), kind=JobKind.GENERATE
    )
    runs = list(token_runs(request.prompt_ids, loaded.model.config.image_token_index))
    assert request.image_arrays()["pixel_values"].shape[0] == len(runs) == 4 + 3
    spans = prompt_image_spans(loaded, request)
    first, second = (build_model_inputs(loaded, request, spans, vision_cache=None).embeds for _ in range(2))
    assert not mx.isnan(first).any().item()
    assert mx.array_equal(first, second).item()
