"""Remote image URLs through the facade: off by default, on by settings, fetched on the
translation pool (never the event loop, never the store's threads), errors OpenAI-shaped."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import in_process, png_bytes
from tests.hardening._image_server import CLIP, PNG, ImageServer, serve_images
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Limits, Store, create_app
from vlmserve.facade.cli import settings_from_args
from vlmserve.facade.remote_images.checks import IPAddress, is_public_address
from vlmserve.facade.remote_images.fetcher import RemoteImageFetcher
from vlmserve.facade.settings.remote_images import RemoteImageSettings

PARAM = "input[0].content[0].image_url"


def image_body(*urls: str) -> dict[str, Any]:
    content = [{"type": "input_image", "image_url": url} for url in urls]
    return {"input": [{"role": "user", "content": content}]}


async def post(app: Any, body: dict[str, Any]) -> httpx.Response:
    async with in_process(app) as http:
        return await http.post("/v1/responses", json=body)


@pytest.fixture(scope="module")
def server() -> Iterator[ImageServer]:
    with serve_images("127.0.0.1") as running:
        yield running


async def test_remote_urls_are_a_clear_400_by_default(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, server: ImageServer
) -> None:
    assert not settings.remote_images.enabled
    reply = await post(
        create_app(settings, engine=engine_client, store=store), image_body(server.url("/image.png"))
    )
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["param"], error["code"]) == (PARAM, "unsupported_value")
    assert "remote image URLs are disabled" in error["message"]
    assert server.seen == []


async def test_enabled_by_settings_the_safe_fetcher_refuses_loopback(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, server: ImageServer
) -> None:
    """Allowlisted and http allowed, but 127.0.0.1 is not a public address: refused, never reached."""
    remote = RemoteImageSettings(enabled=True, allowed_domains=("127.0.0.1",), allow_http=True)
    app = create_app(settings.replace(remote_images=remote), engine=engine_client, store=store)
    server.seen.clear()
    url = server.url("/image.png")
    reply = await post(app, image_body(url))
    assert reply.status_code == 400
    assert reply.json()["error"] == {
        "message": f"Error while downloading {url}.",
        "type": "invalid_request_error",
        "param": PARAM,
        "code": "invalid_image_url",
    }
    assert server.seen == []


def permit_localhost(address: IPAddress) -> bool:
    return str(address) == "127.0.0.1" or is_public_address(address)


async def test_a_fetched_image_reaches_the_engine_and_a_failed_one_names_its_part(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    server: ImageServer,
    engine: FakeEngine,
) -> None:
    remote = RemoteImageSettings(enabled=True, allowed_domains=("127.0.0.1",), allow_http=True, timeout_s=2.0)
    fetcher = RemoteImageFetcher(remote, address_allowed=permit_localhost)
    app = create_app(settings, engine=engine_client, store=store, image_sources=fetcher.for_request)
    reply = await post(app, image_body(server.url("/image.png")))
    assert reply.status_code == 200, reply.text
    assert engine.requests[-1].messages[0].parts[0].image.data == PNG
    missing = server.url("/missing")
    reply = await post(app, image_body(server.url("/image.png"), missing))
    assert reply.status_code == 400
    error = reply.json()["error"]
    assert (error["message"], error["param"]) == (
        f"Error while downloading {missing}.",
        "input[0].content[1].image_url",
    )
    slow = server.url("/slow-body")
    reply = await post(app, image_body(slow))
    assert reply.json()["error"]["message"] == f"Timeout while downloading {slow}."


async def test_slow_fetches_hold_only_the_translation_pool(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    """More blocked fetches than translation workers: the event loop and the store still answer
    at once, and no more than `translation_workers` fetches run together."""
    workers = 2
    release = threading.Event()
    lock = threading.Lock()
    active = peak = 0

    def blocking_source(url: str) -> bytes:
        nonlocal active, peak
        with lock:
            active += 1
            peak = max(peak, active)
        try:
            release.wait(10)
            return png_bytes()
        finally:
            with lock:
                active -= 1

    limited = settings.replace(limits=Limits(translation_workers=workers))
    app = create_app(limited, engine=engine_client, store=store, image_sources=lambda: blocking_source)
    async with in_process(app) as http:
        stored = (await http.post("/v1/responses", json={"input": "hi"})).json()
        blocked = [
            asyncio.create_task(http.post("/v1/responses", json=image_body("https://slow.example/a.png")))
            for _ in range(workers * 3)
        ]
        await asyncio.sleep(0.3)
        started = time.monotonic()
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get(f"/v1/responses/{stored['id']}")).status_code == 200
        conversation = await http.post("/v1/conversations", json={"metadata": {"k": "v"}})
        assert conversation.status_code == 200
        assert time.monotonic() - started < 2.0
        assert not any(task.done() for task in blocked)
        release.set()
        replies = await asyncio.wait_for(asyncio.gather(*blocked), 20)
    assert [reply.status_code for reply in replies] == [200] * len(blocked)
    assert peak == workers


async def test_remote_clips_take_the_image_allowlist_and_the_request_budget(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    server: ImageServer,
    engine: FakeEngine,
) -> None:
    """Issue 34.2: video and audio URLs go through the same safe fetcher, off unless enabled,
    capped by the request's byte budget (a clip is larger than the per-image cap)."""
    clip_url = server.url("/clip.mp4")
    video = {"input": [{"role": "user", "content": [{"type": "input_video", "video_url": clip_url}]}]}
    reply = await post(create_app(settings, engine=engine_client, store=store), video)
    assert reply.status_code == 400
    assert (reply.json()["error"]["param"], reply.json()["error"]["code"]) == (
        "input[0].content[0].video_url",
        "unsupported_value",
    )

    remote = RemoteImageSettings(
        enabled=True,
        allowed_domains=("127.0.0.1",),
        allow_http=True,
        timeout_s=2.0,
        max_bytes_per_image=len(PNG) + 10,
        max_bytes_per_request=len(CLIP) + len(PNG) + 10,
    )
    fetcher = RemoteImageFetcher(remote, address_allowed=permit_localhost)
    app = create_app(settings, engine=engine_client, store=store, image_sources=fetcher.for_request)
    server.seen.clear()
    reply = await post(app, video)
    assert reply.status_code == 200, reply.text
    part = engine.requests[-1].messages[0].parts[0].video
    assert (part.data, part.media_type) == (CLIP, "video/mp4")
    assert [seen.accept for seen in server.seen] == ["video/*, audio/*"]

    # A clip and an image share one budget: the second clip does not fit.
    two = [
        {"type": "video", "video": clip_url},
        {"type": "input_image", "image_url": server.url("/image.png")},
    ]
    reply = await post(
        app, {"input": [{"role": "user", "content": [*two, {"type": "video", "video": clip_url}]}]}
    )
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "input[0].content[2].video"

    # Off the allowlist: refused before any connection.
    server.seen.clear()
    elsewhere = {
        "input": [{"role": "user", "content": [{"type": "video", "video": "http://elsewhere.example/a.mp4"}]}]
    }
    reply = await post(app, elsewhere)
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "input[0].content[0].video"
    assert server.seen == []


def test_remote_image_settings_from_flags_and_environment() -> None:
    settings = settings_from_args(
        [
            "--allow-remote-images-from",
            "images.example.com",
            "--allow-remote-images-from",
            "*.cdn.example",
            "--remote-image-timeout",
            "5",
            "--remote-image-max-bytes",
            "1000000",
        ],
        {"VLMSERVE_FACADE_REMOTE_IMAGES_MAX_BYTES_PER_REQUEST": "3000000"},
    )
    remote = settings.remote_images
    assert remote.enabled and remote.allowed_domains == ("images.example.com", "*.cdn.example")
    assert (remote.timeout_s, remote.max_bytes_per_image, remote.max_bytes_per_request) == (
        5.0,
        1_000_000,
        3_000_000,
    )
    assert not remote.allow_http
    from_env = FacadeSettings.from_env(
        {
            "VLMSERVE_FACADE_REMOTE_IMAGES_ENABLED": "1",
            "VLMSERVE_FACADE_REMOTE_IMAGES_ALLOWED_DOMAINS": "a.example,b.example",
            "VLMSERVE_FACADE_REMOTE_IMAGES_ALLOW_HTTP": "yes",
        }
    ).remote_images
    assert from_env.enabled and from_env.allow_http and from_env.allowed_domains == ("a.example", "b.example")
    off = settings_from_args([], {}).remote_images
    assert not off.enabled and off.allowed_domains == ()
