"""Prompt-prefix KV reuse: the cache's matching, partitions and bounds (pure), then on the real
engine (same output, fewer prefills, nothing crosses tenants)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pytest

from vlmserve.engine.loop.model_inputs import ImageSpan
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .conftest import InProcessEngine
from .test_engine_grpc import image_part, png, text_part

IMAGE = 900
LAYERS = 2
# Bytes one cached token takes in these fake caches (keys + values, 2 layers, float32).
TOKEN_BYTES = LAYERS * 2 * 4 * 4


@dataclass
class FakeLayer:
    """A one-row KV cache layer: keys/values [1, heads, tokens, dim] (numpy slices like MLX)."""

    keys: np.ndarray
    values: np.ndarray
    offset: int


def layers_for(ids: list[int]) -> list[FakeLayer]:
    n = len(ids)
    data = np.asarray(ids, dtype=np.float32).reshape(1, 1, n, 1) * np.ones((1, 1, n, 4), np.float32)
    return [FakeLayer(data, data.copy(), n) for _ in range(LAYERS)]


def cache_with(*entries: tuple[str, list[int]], min_tokens: int = 4, max_bytes: int = 1 << 20) -> PrefixCache:
    cache = PrefixCache(min_tokens=min_tokens, max_bytes=max_bytes)
    for partition, ids in entries:
        cache.store(partition, ids, spans_of(ids), layers_for(ids))
    return cache


def spans_of(ids: list[int], hashes: tuple[str, ...] = ("red", "blue", "green")) -> list[ImageSpan]:
    """Runs of IMAGE tokens, labelled with `hashes` in order."""
    spans: list[ImageSpan] = []
    index = 0
    while index < len(ids):
        if ids[index] == IMAGE:
            start = index
            while index < len(ids) and ids[index] == IMAGE:
                index += 1
            spans.append(ImageSpan(start, index - start, hashes[len(spans)]))
        else:
            index += 1
    return spans


IMG = [IMAGE] * 4
CASES = [
    ("shared prefix is reused", list(range(10)), [*range(6), 50, 51], 6),
    ("identical prompt keeps one token to run", list(range(10)), list(range(10)), 9),
    ("longer prompt reuses all", list(range(10)), list(range(14)), 10),
    ("too short a match", list(range(10)), [0, 1, 2, 60, 61, 62], None),
    ("nothing shared", list(range(10)), [7, 7, 7, 7, 7, 7], None),
    ("the same image is reused past", [1, 2, *IMG, 3, 4, 5], [1, 2, *IMG, 3, 4, 9, 9], 8),
]


@pytest.mark.parametrize(("name", "cached", "prompt", "expected"), CASES, ids=[c[0] for c in CASES])
def test_take(name: str, cached: list[int], prompt: list[int], expected: int | None) -> None:
    cache = cache_with(("a", cached))
    taken = cache.take("a", prompt, spans_of(prompt))
    if expected is None:
        assert taken is None
    else:
        assert taken is not None
        layers, shared = taken
        assert shared == expected
        assert all(layer.offset == expected and layer.keys.shape[2] == expected for layer in layers)
        assert np.array_equal(layers[0].keys[0, 0, :, 0], np.asarray(cached[:expected], np.float32))
        assert cache.take("a", prompt, spans_of(prompt)) is not None, "entries are shared, not taken away"


def test_a_different_image_at_the_same_place_is_not_reused() -> None:
    ids = [1, 2, 3, 4, 5, *IMG, 6, 7]
    cache = cache_with(("a", ids))
    taken = cache.take("a", [*ids, 8], spans_of(ids, hashes=("blue",)))
    assert taken is not None and taken[1] == 5, "same placeholder ids, other pixels: stops at the image"


def test_a_prefix_never_serves_another_partition() -> None:
    secret = list(range(100, 140))
    cache = cache_with(("tenant-a", secret))
    for guess_length in (8, 20, 39, 40):
        guess = [*secret[:guess_length], 7]
        assert cache.take("tenant-b", guess, []) is None
        assert cache.take("", guess, []) is None
    taken = cache.take("tenant-a", [*secret, 7], [])
    assert taken is not None and taken[1] == 40


def test_longest_match_among_several_entries() -> None:
    cache = cache_with(("a", [1, 2, 3, 4, 5, 6]), ("a", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]), ("a", [9] * 8))
    assert len(cache) == 2, "an entry that a newer one extends is dropped"
    taken = cache.take("a", [1, 2, 3, 4, 5, 6, 7, 8, 0], [])
    assert taken is not None and taken[1] == 8
    taken = cache.take("a", [9] * 6 + [1], [])
    assert taken is not None and taken[1] == 6


def test_least_recently_used_entries_go_first_within_the_byte_bound() -> None:
    first, second, third = [1] * 10, [2] * 10, [3] * 10
    cache = cache_with(("a", first), ("a", second), max_bytes=25 * TOKEN_BYTES)
    assert cache.bytes == 20 * TOKEN_BYTES
    assert cache.take("a", [*first, 0], []) is not None  # `first` is now the most recent
    cache.store("a", third, [], layers_for(third))
    assert cache.bytes <= 25 * TOKEN_BYTES
    assert cache.take("a", [*second, 0], []) is None, "least recently used, evicted"
    assert cache.take("a", [*first, 0], []) is not None
    assert cache.take("a", [*third, 0], []) is not None


def test_disabled_and_oversized_caches_are_not_kept() -> None:
    assert cache_with(("a", list(range(10))), min_tokens=0).take("a", list(range(12)), []) is None
    assert cache_with(("a", list(range(10))), max_bytes=0).take("a", list(range(12)), []) is None
    too_big = cache_with(("a", list(range(10))), max_bytes=5 * TOKEN_BYTES)
    assert len(too_big) == 0 and too_big.bytes == 0
    mismatched = PrefixCache(min_tokens=2, max_bytes=1 << 20)
    layers = layers_for(list(range(10)))
    layers[0].offset = 9  # the cache does not hold exactly these ids
    mismatched.store("a", list(range(10)), [], layers)
    assert len(mismatched) == 0


@dataclass
class FakeWindowLayer:
    """A layer no prefix can be cut from (it has its own update): kept only at boundaries."""

    offset: int

    def update_and_fetch(self, keys: np.ndarray, values: np.ndarray) -> None:
        raise AssertionError("never run")


def store_checkpointed(cache: PrefixCache, ids: list[int], boundaries: list[int]) -> None:
    layers: list[Any] = [layers_for(ids)[0], FakeWindowLayer(len(ids))]
    states: dict[int, list[Any]] = {at: [None, FakeWindowLayer(at)] for at in boundaries}
    cache.store("a", ids, [], layers, checkpoints=states)


def test_an_entry_served_up_to_its_last_boundary_is_replaced_by_one_that_shares_that_far() -> None:
    """Gemma 4's next turn parts from the previous entry after its last boundary (the end of the
    last message): that entry can serve nothing the new one cannot, so its boundaries move there."""
    cache = PrefixCache(min_tokens=4, max_bytes=1 << 20)
    first = list(range(20))
    store_checkpointed(cache, first, [15])
    store_checkpointed(cache, [*first[:17], 90, 91, 92, 93, 94], [20])
    assert len(cache) == 1
    taken = cache.take("a", [*first[:16], 77, 78], [])
    assert taken is not None and taken[1] == 15
    assert taken[0][1].offset == 15 and taken[0][0].keys.shape[2] == 15
    taken = cache.take("a", [*first[:17], 90, 91, 92, 93, 0], [])
    assert taken is not None and taken[1] == 20
    # One that parts before the last boundary keeps the older entry.
    store_checkpointed(cache, [*first[:10], 60, 61, 62, 63], [12])
    assert len(cache) == 2


# -- on the engine --------------------------------------------------------------------------------

SYSTEM = "You are a careful assistant. " + " ".join(f"Rule {i}: answer precisely." for i in range(60))


def conversation(*turns: str, image: bytes | None = None, partition: str = "") -> pb.GenerateRequest:
    messages = [pb.Message(role=pb.ROLE_SYSTEM, parts=[text_part(SYSTEM)])]
    for index, turn in enumerate(turns):
        role = pb.ROLE_USER if index % 2 == 0 else pb.ROLE_ASSISTANT
        messages.append(pb.Message(role=role, parts=[text_part(turn)]))
    if image is not None:
        messages[1].parts.append(image_part(image))  # in the first user turn: history from then on
    return pb.GenerateRequest(
        messages=messages,
        sampling=pb.SamplingParams(max_tokens=16, temperature=1.0, seed=21),
        partition_key=partition,
    )


def unary(stub: pb_grpc.EngineServiceStub, req: pb.GenerateRequest) -> pb.GenerateResult:
    result: pb.GenerateResult = stub.GenerateUnary(pb.GenerateUnaryRequest(request=req), timeout=60).result
    return result


@pytest.mark.parametrize("with_image", [False, True])
def test_follow_up_turn_reuses_the_prefix_with_identical_output(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, with_image: bool
) -> None:
    image = png(seed=8) if with_image else None
    partition = f"follow-up-{with_image}"
    follow_up = conversation(
        "First question?", "An answer.", "Second question?", image=image, partition=partition
    )
    cold_partition = pb.GenerateRequest()
    cold_partition.CopyFrom(follow_up)
    cold_partition.partition_key = partition + "-cold"
    cold = unary(stub, cold_partition)
    assert cold.usage.cached_tokens == 0

    first = unary(stub, conversation("First question?", image=image, partition=partition))
    warm = unary(stub, follow_up)
    assert first.usage.cached_tokens == 0
    # The long system prompt at least, and past the image in the first turn when there is one.
    assert warm.usage.cached_tokens > (first.usage.input_tokens - 8)
    assert warm.usage.cached_tokens < warm.usage.input_tokens
    assert warm.usage.input_tokens == cold.usage.input_tokens
    assert warm.text == cold.text


def test_another_tenants_prompt_never_shows_in_cached_tokens(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub
) -> None:
    """Issue 10's finding: with one shared slot, key B's cached_tokens rose 112 -> 116 -> 118 ->
    126 as its guess approached key A's secret prompt. Same guesses here: from partition A they
    do hit (so the cache is really there to leak), from partition B never."""
    secret = "The launch code is 7 4 1 9 3 and the vault opens at midnight."
    unary(stub, conversation(secret, partition="tenant-a"))
    guesses = [secret[:n] for n in (20, 35, 50, len(secret))]
    from_b = [unary(stub, conversation(g, partition="tenant-b")).usage.cached_tokens for g in guesses]
    from_a = [unary(stub, conversation(g, partition="tenant-a-again")).usage.cached_tokens for g in guesses]
    same_tenant = [unary(stub, conversation(g, partition="tenant-a")).usage.cached_tokens for g in guesses]
    assert from_b == from_a, "a new tenant sees what any other tenant would: its own history only"
    # B's own earlier guesses may serve B (its own prompts); A's secret never does: B's hits stop
    # where its own earlier guesses ended, while A's would run on into the secret.
    assert max(from_b) < same_tenant[-1]
    assert same_tenant[-1] >= unary(stub, conversation(secret, partition="tenant-a")).usage.input_tokens - 16


@pytest.mark.needs_model
def test_a_kept_prefix_holds_its_own_rows_not_the_whole_batch_cache() -> None:
    """Found in bench/batching.py's memory scenario: engine RSS 731 -> 1578 MiB under 16 image
    requests, all of it while rows left the batch. A leaving row's KV went to the prefix cache
    as a lazy slice of the batch's KV arrays, which kept those whole arrays (every row, every
    allocated position) alive, one version per leaving row. Now an entry is its own copy: the
    memory the engine keeps after a batch stays within what the prefix cache says it holds."""
    import dataclasses

    import mlx.core as mx

    from tests._fixture_models import RANDOM_MODEL_PATH
    from vlmserve.engine.config import EngineConfig
    from vlmserve.engine.jobs import Job, JobKind
    from vlmserve.engine.loop.generator import Generator

    generator = Generator(
        EngineConfig(model=str(RANDOM_MODEL_PATH), max_active=8, prefix_cache_min_tokens=8, warmup=False)
    )
    generator.start()
    try:
        assert generator.ready.wait(60), generator.load_error
        preparer = generator.preparer
        assert preparer is not None

        def jobs(tag: str) -> list[Job]:
            out = []
            for index in range(8):
                text = f"{tag} {index}: " + " ".join(f"word{index}-{n}" for n in range(40))
                request = preparer.prepare(
                    pb.GenerateRequest(
                        messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part(text)])],
                        # Rows leave one by one, each from a batch of a different size.
                        sampling=pb.SamplingParams(max_tokens=2 + 2 * index, temperature=0.0),
                    ),
                    kind=JobKind.GENERATE,
                )
                out.append(Job(dataclasses.replace(request, request_id=f"{tag}-{index}"), None))
            return out

        for job in jobs("warm"):  # every kernel and buffer size once
            generator.submit(job)
        assert generator.wait_idle(120)
        assert generator.prefix_cache is not None
        generator.prefix_cache.clear()
        mx.clear_cache()
        before = mx.get_active_memory()
        for job in jobs("measured"):
            generator.submit(job)
        assert generator.wait_idle(120)
        assert len(generator.prefix_cache) == 8
        kept = mx.get_active_memory() - before
        assert kept <= 2 * generator.prefix_cache.bytes + (1 << 20), (kept, generator.prefix_cache.bytes)
    finally:
        generator.stop()


@pytest.mark.parametrize("max_tokens", [1, 2])
def test_a_request_done_on_its_first_token_leaves_its_prompt_to_the_next_turn(
    idle_engine: InProcessEngine, stub: pb_grpc.EngineServiceStub, max_tokens: int
) -> None:
    """A prewarm (prompt_cache_options.prewarm, the turn after a compaction) is a request that
    ends on its first token, before it ever joins the decode batch: its prefill cache is the
    prompt the next turn shares, and was dropped (0 cached tokens after a one-token request)."""
    partition = f"first-token-{max_tokens}"
    prewarm = conversation("First question?", partition=partition)
    prewarm.sampling.max_tokens = max_tokens
    first = unary(stub, prewarm)
    assert first.usage.output_tokens == max_tokens
    warm = unary(stub, conversation("First question?", "An answer.", "Next?", partition=partition))
    assert warm.usage.cached_tokens >= first.usage.input_tokens - 8
