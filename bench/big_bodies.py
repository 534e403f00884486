"""Many large request bodies at once (docs/hardening.md, "Slow clients and many large bodies"):
the facade's peak memory with the bound on
bodies in flight (--max-body-bytes-in-flight) off and on, side by side in one run.

    python bench/big_bodies.py --bodies 4 --mib 30
    python bench/big_bodies.py --per-byte --mib 30     # 1, 4, 8 bodies: RSS growth per accepted byte
    python bench/big_bodies.py --tiny-parts 400000     # one body of N one-character text parts per API

Each run starts the scripted engine and a fresh facade, posts N bodies of M MiB at once (one long
`input_text`, which the facade reads, parses and translates), and reads the facade's peak RSS
(VmHWM) from /proc. Linux only.

`--tiny-parts N`: per API (Messages, Responses, chat), one body of N one-character text parts in
one user message (~31 bytes a part), posted alone to a fresh facade: its answer, its RSS growth
per body byte (accepted or not) and the facade's CPU seconds for it (issue 39.2).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests._services import free_port, process_env, start_facade  # noqa: E402

UNBOUNDED = str(1 << 40)


def peak_rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmHWM")


async def post_all(url: str, bodies: int, mib: int) -> Counter[int]:
    body = json.dumps({"input": "x" * (mib * 1024 * 1024 - 64), "max_output_tokens": 4}).encode()
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        replies = await asyncio.gather(
            *(
                http.post("/v1/responses", content=body, headers={"content-type": "application/json"})
                for _ in range(bodies)
            )
        )
    return Counter(reply.status_code for reply in replies)


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


TINY_PART_APIS = ("/v1/messages", "/v1/responses", "/v1/chat/completions")


def tiny_parts_body(path: str, parts: int) -> bytes:
    """A body of `parts` one-character text parts in one user message, in `path`'s API."""
    kind = {"/v1/messages": "text", "/v1/responses": "input_text", "/v1/chat/completions": "text"}[path]
    content = [{"type": kind, "text": "a"}] * parts
    message = {"role": "user", "content": content}
    if path == "/v1/responses":
        body: dict[str, object] = {"input": [message], "max_output_tokens": 4}
    else:
        body = {"model": "default", "messages": [message], "max_tokens": 4}
    return json.dumps(body).encode()


def run_tiny_parts(path: str, parts: int, logs: Path, extra: tuple[str, ...]) -> dict[str, object]:
    engine_address = f"127.0.0.1:{free_port()}"
    engine = subprocess.Popen(
        [sys.executable, "-m", "tests.facade.fake_engine_server", "--address", engine_address],
        cwd=REPO,
        env=process_env(),
    )
    body = tiny_parts_body(path, parts)
    try:
        time.sleep(1.5)
        facade = start_facade(
            logs, engine_address, store_path=logs / f"store-{time.time()}.sqlite3", extra=extra
        )
        try:
            pid = facade.process.pid
            before, cpu_before = peak_rss_mib(pid), cpu_s(pid)
            started = time.monotonic()
            reply = httpx.post(
                f"{facade.address}{path}",
                content=body,
                headers={"content-type": "application/json"},
                timeout=300,
            )
            wall = time.monotonic() - started
            peak, cpu_after = peak_rss_mib(pid), cpu_s(pid)
        finally:
            facade.stop()
    finally:
        engine.terminate()
        engine.wait(10)
    grown = peak - before
    error = reply.json().get("error") if reply.status_code != 200 else None
    return {
        "api": path,
        "parts": parts,
        "body_bytes": len(body),
        "status": reply.status_code,
        "error": (error.get("param") or error.get("message", ""))[:80] if isinstance(error, dict) else None,
        "rss_before_mib": round(before),
        "peak_rss_mib": round(peak),
        "rss_per_body_byte": round(grown * 1024 * 1024 / len(body), 2),
        "facade_cpu_s": round(cpu_after - cpu_before, 2),
        "wall_s": round(wall, 2),
    }


def run(budget: str | None, bodies: int, mib: int, logs: Path) -> dict[str, object]:
    engine_address = f"127.0.0.1:{free_port()}"
    engine = subprocess.Popen(
        [sys.executable, "-m", "tests.facade.fake_engine_server", "--address", engine_address],
        cwd=REPO,
        env=process_env(),
    )
    try:
        time.sleep(1.5)
        extra = ("--max-body-bytes-in-flight", budget) if budget else ()
        facade = start_facade(logs, engine_address, store_path=logs / f"store-{budget}.sqlite3", extra=extra)
        try:
            before = peak_rss_mib(facade.process.pid)
            statuses = asyncio.run(post_all(facade.address, bodies, mib))
            peak = peak_rss_mib(facade.process.pid)
        finally:
            facade.stop()
    finally:
        engine.terminate()
        engine.wait(10)
    return {
        "budget": "unbounded" if budget == UNBOUNDED else budget or "default",
        "statuses": dict(statuses),
        "rss_before_mib": round(before),
        "peak_rss_mib": round(peak),
    }


def per_byte(result: dict[str, object], mib: int) -> dict[str, object]:
    """The memory cost of each accepted body byte: peak RSS growth / bytes of the 200s."""
    statuses = result["statuses"]
    assert isinstance(statuses, dict)
    accepted = statuses.get(200, 0) * mib * 1024 * 1024
    grown = float(result["peak_rss_mib"]) - float(result["rss_before_mib"])  # type: ignore[arg-type]
    return {**result, "rss_per_accepted_byte": round(grown * 1024 * 1024 / accepted, 2) if accepted else None}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--bodies", type=int, default=4)
    parser.add_argument("--mib", type=int, default=30)
    parser.add_argument(
        "--per-byte",
        action="store_true",
        help="instead: 1, 4 and 8 bodies under the default bound, peak RSS growth per accepted byte",
    )
    parser.add_argument(
        "--tiny-parts",
        type=int,
        metavar="N",
        help="instead: per API, one body of N one-character text parts; RSS growth per body byte",
    )
    parser.add_argument(
        "--api", choices=TINY_PART_APIS, action="append", help="with --tiny-parts: only these"
    )
    parser.add_argument(
        "--facade-arg", action="append", default=[], help="with --tiny-parts: passed to the facade (repeat)"
    )
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="vlmserve-bodies-"))
    if args.tiny_parts:
        for path in args.api or TINY_PART_APIS:
            print(json.dumps(run_tiny_parts(path, args.tiny_parts, logs, tuple(args.facade_arg))), flush=True)
        return 0
    if args.per_byte:
        for bodies in (1, 4, 8):
            print(json.dumps({"bodies": bodies, **per_byte(run(None, bodies, args.mib, logs), args.mib)}))
        return 0
    for budget in (UNBOUNDED, str(96 << 20), None):
        print(json.dumps(run(budget, args.bodies, args.mib, logs)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
