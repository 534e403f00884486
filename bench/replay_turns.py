"""Facade time per turn of an agent loop that sends one new screenshot per turn (docs/responses-api.md,
"Replay cost").

The facade runs in this process (its real app, store and translation) against a scripted engine
on a real gRPC server that answers every turn at once with a `screenshot` tool call, so what is
timed is the facade: reading the body, replaying earlier turns, translating, storing, and
sending the whole conversation to the engine. Three ways of continuing, side by side in one run:

* `chain`: `previous_response_id` + the new tool output (the stored chain is replayed);
* `conversation`: `conversation` + the new tool output (the conversation's items are replayed);
* `resend`: the client sends the whole history every turn, `store: false` (nothing replayed;
  the growth every stateless client pays, for comparison).

    .venv/bin/python bench/replay_turns.py --turns 20 --repeats 3 \\
        --out bench/results/replay-turns-20.json

Reports, per mode, the median latency of each turn over the repeats, and the ratio of the last
turns to the first ones (flat: close to 1).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import dataclasses
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image, ImageDraw

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach the tests' scripted engine without installing it

from tests.facade.fake_engine import Script, start_fake_engine  # noqa: E402
from vlmserve.client import AsyncEngineClient  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402
from vlmserve.facade import FacadeSettings, Limits, Store, create_app  # noqa: E402

MODES = ("chain", "conversation", "resend")
TOOL = {"type": "function", "name": "screenshot", "parameters": {"type": "object", "properties": {}}}
CALL = pb.ToolCall(id="call_shot", name="screenshot", arguments="{}", kind=pb.TOOL_KIND_FUNCTION)


def screenshot(turn: int, width: int, height: int) -> str:
    """A PNG data URL that differs every turn and compresses like a busy screen (noise + shapes)."""
    image = Image.effect_noise((width, height), 40).convert("RGB")
    draw = ImageDraw.Draw(image)
    for index in range(turn + 1):
        left = (index * 37) % max(1, width - 40)
        draw.rectangle((left, 10 + index * 7, left + 40, 30 + index * 7), fill=(turn * 11 % 256, 80, 160))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def tool_output(turn: int, image_url: str) -> dict[str, Any]:
    return {
        "type": "function_call_output",
        "call_id": CALL.id,
        "output": [
            {"type": "input_text", "text": f"screen after step {turn}"},
            {"type": "input_image", "image_url": image_url},
        ],
    }


@dataclasses.dataclass
class Timings:
    """Seconds per turn: the whole request (wall), the process's CPU time during it (all
    threads, the in-process engine's share included), and the facade's preparation of it
    (`ResponsesService.translate`: replay, translation, checks), as wall and as CPU time (nothing
    else runs in the process meanwhile, so its CPU time is the preparation's, without the waits
    a machine shared with other work adds to wall times)."""

    wall: list[float] = dataclasses.field(default_factory=list)
    cpu: list[float] = dataclasses.field(default_factory=list)
    prepare: list[float] = dataclasses.field(default_factory=list)
    prepare_cpu: list[float] = dataclasses.field(default_factory=list)


def time_preparation(app: Any, timings: list[Timings]) -> None:
    """Wrap the service's `translate` so that each call's duration goes to the current loop."""
    service = app.state.facade.responses
    translate = service.translate

    async def timed(*args: Any, **kwargs: Any) -> Any:
        started, cpu_started = time.perf_counter(), time.process_time()
        try:
            return await translate(*args, **kwargs)
        finally:
            timings[-1].prepare.append(time.perf_counter() - started)
            timings[-1].prepare_cpu.append(time.process_time() - cpu_started)

    service.translate = timed


async def run_loop(
    http: httpx.AsyncClient, mode: str, turns: int, images: list[str], timings: Timings
) -> None:
    """One agent loop, timed turn by turn into `timings`."""
    seconds = timings.wall
    first = {"type": "message", "role": "user", "content": "Click through the app; report what you see."}
    history: list[dict[str, Any]] = [first]
    previous: str | None = None
    conversation: str | None = None
    if mode == "conversation":
        conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    for turn in range(turns):
        body: dict[str, Any] = {"model": "default", "tools": [TOOL]}
        new_items = [first] if turn == 0 else [tool_output(turn, images[turn])]
        if mode == "chain":
            body.update(input=new_items, previous_response_id=previous)
        elif mode == "conversation":
            body.update(input=new_items, conversation=conversation)
        else:
            if turn:
                history.append(new_items[0])
            body.update(input=history, store=False)
        content = json.dumps({k: v for k, v in body.items() if v is not None}).encode()
        started, cpu_started = time.perf_counter(), time.process_time()
        reply = await http.post(
            "/v1/responses", content=content, headers={"content-type": "application/json"}
        )
        seconds.append(time.perf_counter() - started)
        timings.cpu.append(time.process_time() - cpu_started)
        if reply.status_code != 200:
            raise RuntimeError(f"{mode} turn {turn}: {reply.status_code} {reply.text[:300]}")
        resource = reply.json()
        previous = resource["id"]
        history.extend(
            {key: item[key] for key in ("type", "call_id", "name", "arguments")}
            for item in resource["output"]
            if item["type"] == "function_call"
        )


async def bench(turns: int, repeats: int, width: int, height: int) -> dict[str, Any]:
    engine = await start_fake_engine()
    engine.servicer.script = Script(text_chunks=[], tool_calls=[CALL])
    client = AsyncEngineClient(engine.address)
    images = [screenshot(turn, width, height) for turn in range(turns)]
    image_bytes = statistics.median(len(base64.b64decode(url.split(",", 1)[1])) for url in images)
    with tempfile.TemporaryDirectory(prefix="vlmserve-replay-") as folder:
        store = Store.sqlite(Path(folder) / "store.sqlite3")
        settings = FacadeSettings(
            store_path=Path(folder) / "store.sqlite3",
            limits=dataclasses.replace(Limits(), max_images_per_request=turns + 1),
        )
        app = create_app(settings, engine=client, store=store)
        transport = httpx.ASGITransport(app=app)
        runs: dict[str, list[Timings]] = {mode: [] for mode in MODES}
        current: list[Timings] = [Timings()]
        time_preparation(app, current)
        async with httpx.AsyncClient(transport=transport, base_url="http://facade", timeout=600) as http:
            await run_loop(http, "chain", 2, images, current[-1])  # warm-up: imports, first writes
            for _ in range(repeats):
                for mode in MODES:  # interleaved: machine load affects every mode alike
                    current.append(Timings())
                    await run_loop(http, mode, turns, images, current[-1])
                    runs[mode].append(current[-1])
        store.close()
    await client.close()
    await engine.stop()
    report: dict[str, Any] = {
        "turns": turns,
        "repeats": repeats,
        "screenshot": {"width": width, "height": height, "png_bytes_median": image_bytes},
        "modes": {},
    }
    window = max(1, turns // 5)
    for mode, samples in runs.items():
        report["modes"][mode] = {
            measure: summary([getattr(sample, measure) for sample in samples], window)
            for measure in ("wall", "cpu", "prepare", "prepare_cpu")
        }
    return report


def summary(samples: list[list[float]], window: int) -> dict[str, Any]:
    """Median per turn over the repeats; early (turns 1..window: turn 0 has no screenshot)
    against late (the last window)."""
    per_turn_ms = [round(1000 * statistics.median(values), 2) for values in zip(*samples, strict=True)]
    early = statistics.median(per_turn_ms[1 : 1 + window])
    late = statistics.median(per_turn_ms[-window:])
    return {
        "per_turn_ms": per_turn_ms,
        "early_ms": early,
        "late_ms": late,
        "late_over_early": round(late / early, 2) if early else None,
    }


def format_table(report: dict[str, Any]) -> str:
    lines = [f"{'mode':<13}{'measure':<12}{'early ms':>10}{'late ms':>10}{'late/early':>12}   per turn (ms)"]
    for mode, measures in report["modes"].items():
        for measure, figures in measures.items():
            turns = " ".join(f"{value:.0f}" for value in figures["per_turn_ms"])
            lines.append(
                f"{mode:<13}{measure:<12}{figures['early_ms']:>10.1f}{figures['late_ms']:>10.1f}"
                f"{figures['late_over_early'] or 0:>12.2f}   {turns}"
            )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--turns", type=int, default=20, help="turns per agent loop (default 20)")
    parser.add_argument("--repeats", type=int, default=3, help="loops per mode; the median is reported")
    parser.add_argument("--width", type=int, default=800, help="screenshot width (default 800)")
    parser.add_argument("--height", type=int, default=500, help="screenshot height (default 500)")
    parser.add_argument("--out", type=Path, default=None, help="write the report as JSON here")
    args = parser.parse_args(argv)
    if not 2 <= args.turns <= 200 or not 1 <= args.repeats <= 20:
        parser.error("--turns must be 2..200 and --repeats 1..20")
    report = asyncio.run(bench(args.turns, args.repeats, args.width, args.height))
    print(format_table(report))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
