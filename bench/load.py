"""Load a running facade: N `POST /v1/responses` at concurrency C, on loopback only.

Reports p50/p99 time-to-first-token (streaming: the first `response.output_text.delta`, or the
first event after `response.created`/`response.in_progress` when there is no text), end-to-end
latency, errors by kind, and the peak resident memory of the processes named with `--pid`
(VmRSS sampled every 100 ms, and the kernel's VmHWM high-water mark). Prints a table and writes
JSON with `--out`. Bounded: at most 10 000 requests, 256 concurrent, `--max-duration` seconds.

    python bench/load.py --base-url http://127.0.0.1:8000 --requests 200 --concurrency 16 \\
        --stream --image --pid "$ENGINE_PID" --pid "$FACADE_PID" --out bench/results/load.json
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import io
import json
import math
import os
import sys
import time
import urllib.parse
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
from tqdm import tqdm

from vlmserve.server.netaddr import is_loopback_host

MAX_REQUESTS = 10_000
MAX_CONCURRENCY = 256
_PRELUDE_EVENTS = frozenset({"response.created", "response.in_progress"})
_TERMINAL_OK = frozenset({"response.completed", "response.incomplete"})
_TERMINAL_FAILED = frozenset({"response.failed", "error"})


# --- pure parts ----------------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks (numpy's default); None if empty."""
    if not values:
        return None
    if not 0 <= q <= 100:
        raise ValueError("q must be within 0..100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low, high = math.floor(rank), math.ceil(rank)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


@dataclass(frozen=True)
class SSEEvent:
    event: str
    data: str


class SSEParser:
    """Server-sent events from lines (without their line endings), per the WHATWG rules we need:
    `event:` and `data:` fields (data lines joined by newlines), `:` comments, blank-line dispatch."""

    def __init__(self) -> None:
        self._event = ""
        self._data: list[str] = []

    def feed(self, line: str) -> SSEEvent | None:
        line = line.rstrip("\r")
        if not line:
            return self._dispatch()
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "event":
            self._event = value
        elif name == "data":
            self._data.append(value)
        return None

    def close(self) -> SSEEvent | None:
        return self._dispatch()

    def _dispatch(self) -> SSEEvent | None:
        if not self._data:
            self._event = ""
            return None
        event = SSEEvent(self._event or "message", "\n".join(self._data))
        self._event, self._data = "", []
        return event


def event_type(event: SSEEvent) -> str:
    """The Responses event type: the `event:` name, else the JSON `type` field."""
    if event.event != "message":
        return event.event
    try:
        payload = json.loads(event.data)
    except ValueError:
        return event.data.strip()  # e.g. [DONE]
    return str(payload.get("type", "message")) if isinstance(payload, dict) else "message"


def is_loopback_url(base_url: str) -> bool:
    return is_loopback_host(urllib.parse.urlsplit(base_url).hostname or "")


def request_body(
    *, stream: bool, image: bool, max_output_tokens: int, prompt: str, model: str
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": prompt}]
    if image:
        content.append({"type": "input_image", "image_url": _square_png_data_url(), "detail": "auto"})
    return {
        "model": model,
        "input": [{"role": "user", "content": content}],
        "max_output_tokens": max_output_tokens,
        "stream": stream,
        "store": False,
    }


def _square_png_data_url() -> str:
    from PIL import Image, ImageDraw  # only when --image

    picture = Image.new("RGB", (64, 64), (255, 255, 255))
    ImageDraw.Draw(picture).rectangle((16, 16, 40, 40), fill=(220, 40, 40))
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


# --- one request ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    ok: bool
    # "ok", "http_<code>", "status_<status>", "stream_failed", "stream_truncated", "timeout",
    # "transport_error"
    kind: str
    latency_s: float
    ttft_s: float | None = None


async def _streamed(client: httpx.AsyncClient, body: dict[str, Any], started: float) -> Outcome:
    parser = SSEParser()
    first_delta: float | None = None
    first_event: float | None = None  # the first after the prelude; TTFT when no text comes
    terminal: str | None = None
    async with client.stream("POST", "/v1/responses", json=body) as response:
        if response.status_code != 200:
            await response.aread()
            return Outcome(False, f"http_{response.status_code}", time.perf_counter() - started)
        async for line in response.aiter_lines():
            event = parser.feed(line)
            if event is None:
                continue
            kind = event_type(event)
            if first_delta is None and kind == "response.output_text.delta":
                first_delta = time.perf_counter() - started
            if first_event is None and kind not in _PRELUDE_EVENTS:
                first_event = time.perf_counter() - started
            if kind in _TERMINAL_OK | _TERMINAL_FAILED and terminal not in _TERMINAL_FAILED:
                terminal = kind
    latency = time.perf_counter() - started
    ttft = first_delta if first_delta is not None else first_event
    if terminal in _TERMINAL_OK:
        return Outcome(True, "ok", latency, ttft)
    return Outcome(False, "stream_failed" if terminal else "stream_truncated", latency, ttft)


async def _unary(client: httpx.AsyncClient, body: dict[str, Any], started: float) -> Outcome:
    response = await client.post("/v1/responses", json=body)
    latency = time.perf_counter() - started
    if response.status_code != 200:
        return Outcome(False, f"http_{response.status_code}", latency)
    status = response.json().get("status")
    ok = status in ("completed", "incomplete")
    return Outcome(ok, "ok" if ok else f"status_{status}", latency)


async def one_request(client: httpx.AsyncClient, body: dict[str, Any]) -> Outcome:
    started = time.perf_counter()
    try:
        if body["stream"]:
            return await _streamed(client, body, started)
        return await _unary(client, body, started)
    except httpx.TimeoutException:
        return Outcome(False, "timeout", time.perf_counter() - started)
    except (httpx.HTTPError, ValueError):
        return Outcome(False, "transport_error", time.perf_counter() - started)


# --- memory --------------------------------------------------------------------------------------


def read_memory_kib(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in KiB; {} if it is gone."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    values: dict[str, int] = {}
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0])
    return values


@dataclass
class MemoryTrack:
    pid: int
    start_rss_kib: int | None = None
    peak_rss_kib: int | None = None
    end_rss_kib: int | None = None
    hwm_kib: int | None = None

    def sample(self) -> None:
        values = read_memory_kib(self.pid)
        if "VmRSS" in values:
            rss = values["VmRSS"]
            self.start_rss_kib = rss if self.start_rss_kib is None else self.start_rss_kib
            self.peak_rss_kib = max(rss, self.peak_rss_kib or 0)
            self.end_rss_kib = rss
        if "VmHWM" in values:
            self.hwm_kib = values["VmHWM"]


async def _sample_memory(tracks: Iterable[MemoryTrack], stop: asyncio.Event, interval_s: float = 0.1) -> None:
    while not stop.is_set():
        for track in tracks:
            track.sample()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)
    for track in tracks:
        track.sample()


# --- the run -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadConfig:
    base_url: str
    requests: int = 200
    concurrency: int = 16
    stream: bool = True
    image: bool = False
    max_output_tokens: int = 16
    prompt: str = "Describe the picture in one sentence."
    model: str = "default"
    timeout_s: float = 120.0
    max_duration_s: float = 900.0
    pids: tuple[int, ...] = ()
    api_key: str | None = None

    def __post_init__(self) -> None:
        if not is_loopback_url(self.base_url):
            raise ValueError("--base-url must be a loopback address (127.0.0.0/8, ::1 or localhost)")
        if not 1 <= self.requests <= MAX_REQUESTS:
            raise ValueError(f"--requests must be within 1..{MAX_REQUESTS}")
        if not 1 <= self.concurrency <= MAX_CONCURRENCY:
            raise ValueError(f"--concurrency must be within 1..{MAX_CONCURRENCY}")


@dataclass
class Report:
    config: dict[str, Any]
    wall_s: float
    completed: int
    ok: int
    errors: dict[str, int]
    not_started: int
    ttft_s: dict[str, float | None]
    latency_s: dict[str, float | None]
    requests_per_s: float
    memory: list[dict[str, Any]] = field(default_factory=list)


def summarize(
    config: LoadConfig, outcomes: Sequence[Outcome], wall_s: float, tracks: Sequence[MemoryTrack]
) -> Report:
    ttfts = [o.ttft_s for o in outcomes if o.ok and o.ttft_s is not None]
    latencies = [o.latency_s for o in outcomes if o.ok]
    return Report(
        config={**asdict(config), "api_key": "***" if config.api_key else None},
        wall_s=round(wall_s, 3),
        completed=len(outcomes),
        ok=sum(o.ok for o in outcomes),
        errors=dict(Counter(o.kind for o in outcomes if not o.ok)),
        not_started=config.requests - len(outcomes),
        ttft_s={"p50": percentile(ttfts, 50), "p99": percentile(ttfts, 99), "max": max(ttfts, default=None)},
        latency_s={
            "p50": percentile(latencies, 50),
            "p99": percentile(latencies, 99),
            "max": max(latencies, default=None),
        },
        requests_per_s=round(len(outcomes) / wall_s, 3) if wall_s > 0 else 0.0,
        memory=[asdict(track) for track in tracks],
    )


async def run_load(config: LoadConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> Report:
    body = request_body(
        stream=config.stream,
        image=config.image,
        max_output_tokens=config.max_output_tokens,
        prompt=config.prompt,
        model=config.model,
    )
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    tracks = [MemoryTrack(pid) for pid in config.pids]
    stop_sampling = asyncio.Event()
    sampler = asyncio.create_task(_sample_memory(tracks, stop_sampling))
    outcomes: list[Outcome] = []
    queue: asyncio.Queue[int] = asyncio.Queue()
    for index in range(config.requests):
        queue.put_nowait(index)
    limits = httpx.Limits(max_connections=config.concurrency, max_keepalive_connections=config.concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        while True:
            try:
                queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            outcomes.append(await one_request(client, body))
            bar.update(1)

    # A bar on a terminal (none when the output is a log or a file: disable=None).
    bar = tqdm(total=config.requests, desc="requests", unit="req", disable=None, dynamic_ncols=True)
    started = time.perf_counter()
    async with httpx.AsyncClient(
        base_url=config.base_url,
        headers=headers,
        timeout=config.timeout_s,
        limits=limits,
        transport=transport,
        trust_env=False,  # no proxies: loopback only
    ) as client:
        workers = [asyncio.create_task(worker(client)) for _ in range(config.concurrency)]
        _, pending = await asyncio.wait(workers, timeout=config.max_duration_s)
        for task in pending:  # past --max-duration: in-flight requests are abandoned, not counted
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    wall = time.perf_counter() - started
    bar.close()
    stop_sampling.set()
    await sampler
    return summarize(config, outcomes, wall, tracks)


def format_table(report: Report) -> str:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value * 1000:.0f} ms"

    rows = [
        ("requests ok / done / asked", f"{report.ok} / {report.completed} / {report.config['requests']}"),
        ("errors", ", ".join(f"{k}={v}" for k, v in sorted(report.errors.items())) or "none"),
        ("wall time", f"{report.wall_s:.1f} s ({report.requests_per_s:.2f} req/s)"),
        ("TTFT p50 / p99", f"{ms(report.ttft_s['p50'])} / {ms(report.ttft_s['p99'])}"),
        ("latency p50 / p99 / max", " / ".join(ms(report.latency_s[k]) for k in ("p50", "p99", "max"))),
    ]
    for track in report.memory:
        rows.append(
            (
                f"pid {track['pid']} RSS start / peak / end",
                " / ".join(_mib(track[k]) for k in ("start_rss_kib", "peak_rss_kib", "end_rss_kib"))
                + f" (VmHWM {_mib(track['hwm_kib'])})",
            )
        )
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)


def _mib(kib: int | None) -> str:
    return "-" if kib is None else f"{kib / 1024:.0f} MiB"


def parse_args(argv: Sequence[str] | None) -> tuple[LoadConfig, Path | None]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--base-url", default="http://127.0.0.1:8000", help="the facade (loopback only)")
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--stream", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument(
        "--image", action=argparse.BooleanOptionalAction, default=False, help="attach a 64x64 PNG"
    )
    parser.add_argument("--max-output-tokens", type=int, default=16)
    parser.add_argument("--prompt", default=LoadConfig.prompt)
    parser.add_argument("--model", default="default")
    parser.add_argument("--timeout", type=float, default=120.0, help="per request, seconds")
    parser.add_argument("--max-duration", type=float, default=900.0, help="whole run, seconds")
    parser.add_argument("--pid", type=int, action="append", default=[], help="process to track (repeatable)")
    parser.add_argument("--api-key-env", default="VLMSERVE_BENCH_API_KEY", help="env var holding an API key")
    parser.add_argument("--out", type=Path, default=None, help="write the JSON report here")
    args = parser.parse_args(argv)
    config = LoadConfig(
        base_url=args.base_url,
        requests=args.requests,
        concurrency=args.concurrency,
        stream=args.stream,
        image=args.image,
        max_output_tokens=args.max_output_tokens,
        prompt=args.prompt,
        model=args.model,
        timeout_s=args.timeout,
        max_duration_s=args.max_duration,
        pids=tuple(args.pid),
        api_key=os.environ.get(args.api_key_env) or None,
    )
    return config, args.out


def main(argv: Sequence[str] | None = None) -> int:
    try:
        config, out = parse_args(argv)
    except ValueError as error:
        print(f"load.py: {error}", file=sys.stderr)
        return 2
    report = asyncio.run(run_load(config))
    print(format_table(report))
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(asdict(report), indent=2) + "\n")
        print(f"wrote {out}")
    return 0 if report.ok == report.config["requests"] else 1


if __name__ == "__main__":
    sys.exit(main())
