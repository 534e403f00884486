"""The vision-feature cache on the families (issue 33): features kept per image (the partition, the
model and the image's content hash), so an agent's history of screenshots is encoded once, and the
output is token-identical with and without the cache where the family's tower runs each image on
its own (Qwen, Gemma 4's images of different sizes). Where mlx-vlm runs a request's images
together (Gemma 3, Gemma 4's of one size), the images still to encode run together too, so a
request with nothing cached computes what mlx-vlm computes; with some cached, the rounding of the
smaller run may differ (Gemma 3's random-weight fixture shows it: its features are ~1e-8)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.v1 import engine_pb2 as pb

from ._family_engine import SYSTEM, greedy, image, png, running_engine, text, user

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]

CACHED_FAMILIES = ["qwen3_5", "qwen3_5_moe", "gemma3", "gemma4"]
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
