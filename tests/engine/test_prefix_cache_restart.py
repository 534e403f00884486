"""The prefix cache's disk tier on the real engine: an agent's next turn after a restart, or on
another engine sharing the folder, starts from the KV written at shutdown — the same output as
without it, and never another tenant's."""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import grpc
import pytest
from prometheus_client import generate_latest
from safetensors import SafetensorError

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.client import channel_options
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.rpc.server import EngineServer
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .test_engine_grpc import png
from .test_prefix_cache import conversation, unary

# Every test here runs a real engine on a fixture model.
pytestmark = pytest.mark.needs_model


@contextmanager
def engine_on(
    folder: Path | None, **settings: object
) -> Iterator[tuple[EngineServer, pb_grpc.EngineServiceStub]]:
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    config = EngineConfig(
        model=str(RANDOM_MODEL_PATH),
        warmup=False,
        prefix_cache_dir=str(folder) if folder is not None else None,
        **settings,  # type: ignore[arg-type]
    )

    def run(coroutine: object, timeout: float = 60) -> object:
        return asyncio.run_coroutine_threadsafe(coroutine, loop).result(timeout)  # type: ignore[arg-type]

    async def start() -> tuple[EngineServer, str]:
        server = EngineServer(config)  # grpc.aio binds a server to the loop it is made in
        return server, await server.start("127.0.0.1:0")

    server, address = run(start())  # type: ignore[misc]
    server.load()
    run(server.wait_loaded())
    try:
        with grpc.insecure_channel(str(address), options=channel_options()) as channel:
            yield server, pb_grpc.EngineServiceStub(channel)
    finally:
        run(server.shutdown(grace_seconds=5))
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


TURN_1 = ("First question?",)
TURN_2 = ("First question?", "An answer.", "Second question?")


@pytest.mark.parametrize("with_image", [False, True])
def test_the_next_turn_after_a_restart_comes_from_disk_with_identical_output(
    tmp_path: Path, with_image: bool
) -> None:
    image = png(seed=8) if with_image else None
    with engine_on(None) as (_, stub):
        cold = unary(stub, conversation(*TURN_2, image=image, partition="agent"))
    with engine_on(tmp_path) as (_, stub):
        first = unary(stub, conversation(*TURN_1, image=image, partition="agent"))
    assert list(tmp_path.rglob("*.safetensors")), "the cache was written at shutdown"
    with engine_on(tmp_path) as (server, stub):
        warm = unary(stub, conversation(*TURN_2, image=image, partition="agent"))
        # The image lies in the reused prefix: the vision tower does not run for it again.
        vision = server.generator.vision_cache
        assert vision is not None and vision.encoded == 0
        other_tenant = unary(stub, conversation(*TURN_2, image=image, partition="someone-else"))
        assert vision.encoded == (1 if with_image else 0)
        cache = server.generator.prefix_cache
        assert cache is not None
        assert cache.hits["disk"] == 1
        scraped = generate_latest(server.generator.metrics.registry).decode()
        assert 'vlmserve_engine_prefix_cache_tier_hits_total{tier="disk"} 1.0' in scraped
        assert 'vlmserve_engine_prefix_cache_bytes{tier="disk"} 0.0' not in scraped
    assert warm.usage.cached_tokens > first.usage.input_tokens - 8
    assert warm.text == cold.text
    assert warm.usage.input_tokens == cold.usage.input_tokens
    assert other_tenant.usage.cached_tokens == 0


def test_another_engine_sharing_the_folder_finds_what_one_wrote(tmp_path: Path) -> None:
    with engine_on(tmp_path) as (_, reader):
        # Up before the other engine wrote anything.
        assert unary(reader, conversation("Unrelated.", partition="agent")).usage.cached_tokens == 0
        with engine_on(tmp_path) as (_, writer):
            first = unary(writer, conversation(*TURN_1, partition="agent"))
        taken = unary(reader, conversation(*TURN_2, partition="agent"))
    assert taken.usage.cached_tokens > first.usage.input_tokens - 8


@pytest.mark.parametrize("damage", ["truncate", "flip"])
def test_a_damaged_entry_is_recomputed_not_served(tmp_path: Path, damage: str) -> None:
    with engine_on(None) as (_, stub):
        cold = unary(stub, conversation(*TURN_2, partition="agent"))
    with engine_on(tmp_path) as (_, stub):
        unary(stub, conversation(*TURN_1, partition="agent"))
    for path in tmp_path.rglob("*.safetensors"):
        data = path.read_bytes()
        path.write_bytes(data[: len(data) // 2] if damage == "truncate" else data[:-16] + bytes(16))
    with engine_on(tmp_path) as (server, stub):
        again = unary(stub, conversation(*TURN_2, partition="agent"))
        cache = server.generator.prefix_cache
        assert cache is not None and cache.hits["disk"] == 0
    assert again.usage.cached_tokens == 0
    assert again.text == cold.text


def test_a_full_disk_turns_the_tier_off_and_the_engine_serves_from_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 39: safetensors' full-disk error (a SafetensorError, not an OSError) killed the writer
    thread while the tier stayed on, so every later eviction waited in memory for it."""
    import safetensors.numpy

    def full(*args: object, **kwargs: object) -> None:
        raise SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    # Each entry is about 1.9 MiB: the 4 MiB cache keeps two and evicts the rest to the (full) disk.
    with engine_on(tmp_path, prefix_cache_mib=4) as (server, stub):
        cache = server.generator.prefix_cache
        assert cache is not None and cache.disk is not None
        for turn in range(6):
            unary(stub, conversation(f"Question number {turn} " * 40, partition="agent"))
        assert cache.disk.flush(timeout=10)
        scraped = generate_latest(server.generator.metrics.registry).decode()
        assert not cache.disk.enabled
        assert cache.disk.pending_bytes == 0
        assert 'vlmserve_engine_prefix_cache_disk_errors_total{kind="disabled"} 1.0' in scraped
        assert "vlmserve_engine_prefix_cache_disk_enabled 0.0" in scraped
        assert "vlmserve_engine_prefix_cache_disk_pending_bytes 0.0" in scraped
        again = unary(stub, conversation("Question number 5 " * 40, "An answer.", "More?", partition="agent"))
        assert again.usage.cached_tokens > 0  # memory goes on serving
    assert not list(tmp_path.rglob("*.safetensors"))


def test_a_fifo_named_like_an_entry_does_not_hang_the_engine(tmp_path: Path) -> None:
    """Issue 39: a FIFO in the (shared) folder, named like an entry, blocked the disk tier's open
    forever with the GIL held: every request timed out and SIGTERM was ignored."""
    fifo_name = "0" * 64 + ".safetensors"
    with engine_on(tmp_path) as (server, stub):
        cache = server.generator.prefix_cache
        assert cache is not None and cache.disk is not None
        first = unary(stub, conversation(*TURN_1, partition="agent"))
        os.mkfifo(cache.disk.folder / fifo_name)  # the next lookup scans the folder
        taken = unary(stub, conversation(*TURN_2, partition="agent"))
        assert cache.disk.enabled
    assert taken.usage.cached_tokens > first.usage.input_tokens - 8
    with engine_on(tmp_path) as (server, stub):  # there at start-up too
        again = unary(stub, conversation(*TURN_2, partition="agent"))
        cache = server.generator.prefix_cache
        assert cache is not None and cache.hits["disk"] == 1
    assert again.usage.cached_tokens > first.usage.input_tokens - 8
