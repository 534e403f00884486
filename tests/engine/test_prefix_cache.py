"""Prompt-prefix KV reuse: the slot logic (pure), then on the real engine (same output, fewer prefills)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from vlmserve.engine.prefix_cache import PrefixCache
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .conftest import InProcessEngine
from .test_engine_grpc import image_part, png, text_part

VISION = 900


@dataclass
class FakeLayerCache:
    offset: int

    def is_trimmable(self) -> bool:
        return True

    def trim(self, n: int) -> int:
        self.offset -= n
        return n


def stored(ids: list[int], *, min_tokens: int = 4) -> PrefixCache:
    cache = PrefixCache(min_tokens=min_tokens, vision_ids=frozenset({VISION}))
    cache.store(ids, [FakeLayerCache(len(ids)), FakeLayerCache(len(ids))])
    return cache


CASES = [
    ("shared prefix is reused", list(range(10)), [*range(6), 50, 51], 6),
    ("identical prompt keeps one token to run", list(range(10)), list(range(10)), 9),
    ("longer prompt reuses all", list(range(10)), list(range(14)), 10),
    ("too short a match", list(range(10)), [0, 1, 2, 60, 61, 62], None),
    ("stops before a vision token in the new prompt", list(range(10)), [0, 1, 2, 3, 4, VISION, 6, 7], 5),
    ("stops before a vision token in the cached ids", [0, 1, 2, 3, 4, VISION, 6, 7], list(range(10)), 5),
    ("nothing shared", list(range(10)), [7, 7, 7, 7, 7, 7], None),
]


@pytest.mark.parametrize(("name", "cached", "prompt", "expected"), CASES, ids=[c[0] for c in CASES])
def test_take(name: str, cached: list[int], prompt: list[int], expected: int | None) -> None:
    cache = stored(cached)
    taken = cache.take(prompt)
    if expected is None:
        assert taken is None
        assert cache.take([*cached[:-1], cached[-1] + 1]) is not None, "a miss must leave the slot in place"
    else:
        assert taken is not None
        layers, shared = taken
        assert shared == expected
        assert all(layer.offset == expected for layer in layers)
        assert cache.take(prompt) is None, "a hit empties the slot"


def test_disabled_and_mismatched_caches_are_not_kept() -> None:
    assert stored(list(range(10)), min_tokens=0).take(list(range(12))) is None
    cache = PrefixCache(min_tokens=2, vision_ids=frozenset())
    cache.store(list(range(10)), [FakeLayerCache(9)])  # cache does not hold exactly these ids
    assert cache.take(list(range(12))) is None


# -- on the engine --------------------------------------------------------------------------------

SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer precisely." for i in range(60))


def conversation(*turns: str, image: bytes | None = None) -> pb.GenerateRequest:
    messages = [pb.Message(role=pb.ROLE_SYSTEM, parts=[text_part(SYSTEM)])]
    for index, turn in enumerate(turns):
        role = pb.ROLE_USER if index % 2 == 0 else pb.ROLE_ASSISTANT
        messages.append(pb.Message(role=role, parts=[text_part(turn)]))
    if image is not None:
        messages[-1].parts.append(image_part(image))
    return pb.GenerateRequest(
        messages=messages, sampling=pb.SamplingParams(max_tokens=16, temperature=1.0, seed=21)
    )


def unary(stub: pb_grpc.EngineServiceStub, req: pb.GenerateRequest) -> pb.GenerateResult:
    result: pb.GenerateResult = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result
    return result


def evict(stub: pb_grpc.EngineServiceStub) -> None:
    """A long unrelated request takes the slot, so the next one starts cold."""
    unrelated = pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part("9876543210" * 20)])],
        sampling=pb.SamplingParams(max_tokens=2),
    )
    assert unary(stub, unrelated).usage.cached_tokens == 0


@pytest.mark.parametrize("with_image", [False, True])
def test_follow_up_turn_reuses_the_prefix_with_identical_output(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, with_image: bool
) -> None:
    image = png(seed=8) if with_image else None
    follow_up = conversation("First question?", "An answer.", "Second question?", image=image)
    evict(stub)
    cold = unary(stub, follow_up)
    assert cold.usage.cached_tokens == 0

    evict(stub)
    first = unary(stub, conversation("First question?"))
    warm = unary(stub, follow_up)
    assert warm.usage.cached_tokens > 200  # the long system prompt at least
    assert warm.usage.cached_tokens < warm.usage.input_tokens
    assert warm.usage.input_tokens == cold.usage.input_tokens
    assert warm.text == cold.text
    assert first.usage.cached_tokens == 0
