"""Vision features by content hash: an image sent again is never re-encoded (vision-tower calls
counted on the real engine), the cache stays within its bytes, and cached features give the same
output as fresh ones."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .conftest import InProcessEngine
from .test_engine_grpc import image_part, png, text_part


@pytest.fixture
def tower_calls(idle_engine: InProcessEngine, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[int]]:
    """Images (grid rows) per vision-tower call, counted on the tower's class."""
    loaded = idle_engine.server.generator.loaded
    assert loaded is not None
    tower_class = type(loaded.model.vision_tower)
    original = tower_class.__call__
    calls: list[int] = []

    def counting(self: Any, pixel_values: Any, grid_thw: Any, *args: Any, **kwargs: Any) -> Any:
        calls.append(int(grid_thw.shape[0]))
        return original(self, pixel_values, grid_thw, *args, **kwargs)

    monkeypatch.setattr(tower_class, "__call__", counting)
    yield calls


def ask(
    stub: pb_grpc.EngineServiceStub,
    *images: bytes,
    text: str = "What is new?",
    partition: str = "vision-cache-test",
) -> pb.GenerateResult:
    parts = [image_part(image) for image in images] + [text_part(text)]
    request = pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=parts)],
        sampling=pb.SamplingParams(max_tokens=6, temperature=0.0),
        partition_key=partition,
    )
    result: pb.GenerateResult = stub.GenerateUnary(
        pb.GenerateUnaryRequest(request=request), timeout=60
    ).result
    return result


def test_an_image_sent_again_is_never_re_encoded(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, tower_calls: list[int]
) -> None:
    first, second, third = png((64, 64), seed=31), png((96, 64), seed=32), png((64, 64), seed=33)
    ask(stub, first)
    assert tower_calls == [1]
    ask(stub, first, text="Again, other words.")
    assert tower_calls == [1], "the same image, a new request: no encoding"
    # An agent's next turn: its history's screenshots and one new one; only the new one is encoded.
    ask(stub, first, second)
    ask(stub, first, second, third)
    assert tower_calls == [1, 1, 1]


def test_another_partition_never_hits_an_image_it_did_not_send(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, tower_calls: list[int]
) -> None:
    """Issue 26.12: the cache was shared across keys, and a hit is faster (74.8 vs 81.7 ms): one
    key could tell which images another had just sent. Partitioned like the prefix cache."""
    image = png((64, 64), seed=51)
    ask(stub, image, partition="key_a")
    assert tower_calls == [1]
    ask(stub, image, text="Same image, other key.", partition="key_b")
    assert tower_calls == [1, 1], "another key's image must be encoded again"
    ask(stub, image, text="And again.", partition="key_a")
    assert tower_calls == [1, 1], "its own key still hits"


def test_cached_features_give_the_same_output(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, tower_calls: list[int]
) -> None:
    images = (png((64, 64), seed=41), png((112, 56), seed=42))
    cold = ask(stub, *images, text="Describe both.")
    assert tower_calls == [1, 1]
    warm = ask(stub, *images, text="Describe both.")
    assert tower_calls == [1, 1]
    assert warm.text == cold.text and warm.usage.output_tokens == cold.usage.output_tokens


class Features:
    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes


def test_the_cache_is_bounded_in_bytes_least_recently_used_first() -> None:
    cache = VisionFeatureCache(max_bytes=100)
    for key in ("a", "b", "c"):
        cache.put(key, Features(40))
    assert cache.bytes == 80 and cache.get("a") is None, "a went first"
    assert cache.get("b") is not None  # b is now the most recent
    cache.put("d", Features(40))
    assert cache.get("c") is None and cache.get("b") is not None and cache.get("d") is not None
    cache.put("huge", Features(101))
    assert cache.get("huge") is None and cache.bytes == 80
    assert np.isclose(cache.bytes, sum(f.nbytes for f in cache._cache.values()))
    disabled = VisionFeatureCache(max_bytes=0)
    disabled.put("a", Features(1))
    assert len(disabled) == 0


def test_the_model_is_part_of_the_key() -> None:
    """Vision features are kept by the model's cache namespace and the image's hash."""
    cache = VisionFeatureCache(max_bytes=100, namespace="model-a@/models/a:auto")
    cache.put("hash-1", Features(10))
    assert cache.get("hash-1") is not None
    (key,) = cache._cache
    assert key == "model-a@/models/a:auto\0hash-1"
    other = VisionFeatureCache(max_bytes=100, namespace="model-b@/models/b:auto")
    assert other._make_key("hash-1") != key
