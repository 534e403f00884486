"""A long scripted agent session on a small-context model, Codex-shaped and Claude-Code-shaped
(issue 36.4; docs/context-management.md): every turn adds a tool call and its screenshot; the
session must never see a 4xx/5xx, and the turn after a compaction must start about as fast as a
steady turn (the compacted prefix is warm).

- Codex-shaped: `POST /v1/responses`, `store: false`, the whole conversation in `input` each turn
  (developer instructions, the task, then call/output pairs with a PNG each), streamed,
  `context_management: [{"type": "compaction", "compact_threshold": T}]`; when a `compaction`
  item comes back, the client drops what came before it (as Codex and OpenAI's docs do).
- Claude-Code-shaped: `POST /v1/messages`, streamed, a `tool_use` / image `tool_result` pair per
  turn, `context_management.edits` clear_tool_uses (trigger at half the context, keep 3),
  clear_thinking and compact_20260112 (trigger at three quarters); a `compaction` block goes
  back into the history.

TTFT: seconds from sending the request to the first text delta (or the first output item).
Reported: turns, statuses, compactions, TTFT of steady turns (median) and of each turn right
after a compaction, their ratio (goal <= 1.5), tokens saved per Anthropic edit (as reported).

    nice -n 10 .venv/bin/python bench/context_session.py --turns 200 --context 4096 \
        --out bench/results/context-session.json

It starts an engine (a copy of models/qwen2-vl-tiny with `max_position_embeddings` set to
--context) and a facade, and stops them.
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from PIL import Image

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

from tests._fixture_models import small_context_model  # noqa: E402
from tests._services import start_engine, start_facade  # noqa: E402

TOOL = {"type": "function", "name": "screenshot", "parameters": {"type": "object", "properties": {}}}
ANTHROPIC_TOOL = {"name": "screenshot", "input_schema": {"type": "object", "properties": {}}}
INSTRUCTIONS = "You operate a computer through the screenshot tool. Describe what changed each step."


def screenshot(turn: int, size: int) -> bytes:
    image = Image.new("RGB", (size, size), ((turn * 37) % 256, (turn * 91) % 256, (turn * 53) % 256))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def stream_turn(
    http: httpx.Client, path: str, body: dict[str, Any]
) -> tuple[int, float | None, list[dict[str, Any]]]:
    """Status, TTFT and the parsed events of one streamed turn."""
    started = time.perf_counter()
    first: float | None = None
    events: list[dict[str, Any]] = []
    with http.stream("POST", path, json=body) as reply:
        if reply.status_code != 200:
            reply.read()
            return reply.status_code, None, [{"error": reply.text[:500]}]
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: ") :])
            events.append(event)
            kind = event.get("type", "")
            if first is None and (kind.endswith("text.delta") or kind == "content_block_delta"):
                first = time.perf_counter() - started
    return 200, first, events


def codex_session(http: httpx.Client, turns: int, threshold: int, image_size: int) -> dict[str, Any]:
    items: list[dict[str, Any]] = [
        {"role": "developer", "content": INSTRUCTIONS},
        {"role": "user", "content": "Open the settings and turn on dark mode."},
    ]
    statuses: dict[int, int] = {}
    ttfts: list[float | None] = []
    compacted_at: list[int] = []
    for turn in range(turns):
        call_id = f"call_{turn}"
        png = base64.b64encode(screenshot(turn, image_size)).decode()
        items += [
            {"type": "function_call", "call_id": call_id, "name": "screenshot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": call_id,
                "output": [{"type": "input_image", "image_url": f"data:image/png;base64,{png}"}],
            },
        ]
        body = {
            "model": "default",
            "input": items,
            "tools": [TOOL],
            "store": False,
            "stream": True,
            "max_output_tokens": 8,
            "context_management": [{"type": "compaction", "compact_threshold": threshold}],
        }
        status, ttft, events = stream_turn(http, "/v1/responses", body)
        statuses[status] = statuses.get(status, 0) + 1
        ttfts.append(ttft)
        if status != 200:
            print(f"codex turn {turn}: {status} {events}", file=sys.stderr)
            continue
        final = events[-1].get("response", {})
        output = final.get("output", [])
        if output and output[0].get("type") == "compaction":
            compacted_at.append(turn)
            # As Codex: the compaction item replaces what came before it.
            items = [items[0], output[0]]
        items += [item for item in output if item.get("type") == "message"][:1]
    return _report(statuses, ttfts, compacted_at)


def claude_session(
    http: httpx.Client, turns: int, trigger: int, compact_at: int, image_size: int
) -> dict[str, Any]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "Open the settings and turn on dark mode."}]
    edits = [
        {"type": "clear_thinking_20251015", "keep": "all"},
        {
            "type": "clear_tool_uses_20250919",
            "trigger": {"type": "input_tokens", "value": trigger},
            "keep": {"type": "tool_uses", "value": 3},
        },
        {"type": "compact_20260112", "trigger": {"type": "input_tokens", "value": compact_at}},
    ]
    statuses: dict[int, int] = {}
    ttfts: list[float | None] = []
    applied: list[dict[str, Any]] = []
    compacted_at: list[int] = []
    for turn in range(turns):
        tool_id = f"toolu_{turn}"
        png = base64.b64encode(screenshot(turn, image_size)).decode()
        messages += [
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": tool_id, "name": "screenshot", "input": {}}],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": tool_id,
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": png},
                            }
                        ],
                    }
                ],
            },
        ]
        body = {
            "model": "default",
            "max_tokens": 8,
            "system": INSTRUCTIONS,
            "tools": [ANTHROPIC_TOOL],
            "messages": messages,
            "stream": True,
            "context_management": {"edits": edits},
        }
        status, ttft, events = stream_turn(http, "/v1/messages", body)
        statuses[status] = statuses.get(status, 0) + 1
        ttfts.append(ttft)
        if status != 200:
            print(f"claude turn {turn}: {status} {events}", file=sys.stderr)
            continue
        delta = next((e for e in events if e.get("type") == "message_delta"), {})
        applied += (delta.get("context_management") or {}).get("applied_edits", [])
        starts = [e["content_block"] for e in events if e.get("type") == "content_block_start"]
        if starts and starts[0].get("type") == "compaction":
            compacted_at.append(turn)
            summary = next(e["delta"]["content"] for e in events if e.get("type") == "content_block_delta")
            # As Claude Code: the compaction block goes back in the history (the server drops
            # what came before it).
            messages.append({"role": "assistant", "content": [{"type": "compaction", "content": summary}]})
            messages.append({"role": "user", "content": "Continue."})
    report = _report(statuses, ttfts, compacted_at)
    cleared = [edit for edit in applied if edit["type"] == "clear_tool_uses_20250919"]
    report["clear_tool_uses_applied"] = len(cleared)
    report["tokens_saved_per_edit"] = (
        round(statistics.mean(edit["cleared_input_tokens"] for edit in cleared), 1) if cleared else 0
    )
    return report


def _report(statuses: dict[int, int], ttfts: list[float | None], compacted_at: list[int]) -> dict[str, Any]:
    after = {turn + 1 for turn in compacted_at}
    steady = [
        t for i, t in enumerate(ttfts) if t is not None and i not in after and i not in compacted_at and i > 0
    ]
    after_ttfts = [ttfts[i] for i in sorted(after) if i < len(ttfts) and ttfts[i] is not None]
    median = statistics.median(steady) if steady else None
    return {
        "turns": len(ttfts),
        "statuses": statuses,
        "errors_4xx_5xx": sum(count for status, count in statuses.items() if status >= 400),
        "compactions": len(compacted_at),
        "compacted_at_turns": compacted_at,
        "ttft_steady_median_s": round(median, 4) if median else None,
        "ttft_after_compaction_s": [round(t, 4) for t in after_ttfts if t is not None],
        "ttft_after_compaction_over_steady": round(statistics.mean(after_ttfts) / median, 3)  # type: ignore[arg-type]
        if after_ttfts and median
        else None,
        "ttft_after_compaction_median_over_steady": round(statistics.median(after_ttfts) / median, 3)  # type: ignore[arg-type]
        if after_ttfts and median
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--image-size", type=int, default=56, help="screenshot side in pixels")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="context-session-"))
    model = small_context_model(args.context, folder)
    engine = start_engine(folder, model=str(model))
    facade = None
    report: dict[str, Any] = {}
    try:
        facade = start_facade(folder, engine.address, store_path=folder / "facade.sqlite3")
        with httpx.Client(base_url=facade.address, timeout=600) as http:
            report = {
                "context": args.context,
                "image_size": args.image_size,
                "codex_shaped": codex_session(http, args.turns, int(args.context * 0.6), args.image_size),
                "claude_code_shaped": claude_session(
                    http, args.turns, args.context // 2, int(args.context * 0.75), args.image_size
                ),
            }
    finally:
        if facade is not None:
            facade.stop()
        engine.stop()
    failed = report["codex_shaped"]["errors_4xx_5xx"] or report["claude_code_shaped"]["errors_4xx_5xx"]
    if failed:
        print(f"errors: logs kept in {folder}", file=sys.stderr)
    else:
        shutil.rmtree(folder, ignore_errors=True)
    text = json.dumps(report, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
