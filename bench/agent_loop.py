"""An agent loop on the hybrid and windowed family fixtures (issue 33, docs/performance.md "Hybrid
and windowed families"): each turn resends the conversation with the model's answer (a tool call)
and the tool's output with a new screenshot. Reports, per fixture, time to first token per turn
(the engine's own figure), TTFT of the last turn ÷ the first (goal ≤ 1.5), and the cached share of
each turn (`cached_tokens` ÷ the previous turn's prompt; goal ≥ 90 %), with the prefix cache on
and, beside it in the same run, off (every turn prefilled afresh).

The fixtures are random-weight toys built by training/families (seconds), run in this process on
the CPU; the system prompt is padded to about `--system-words` words so turn 1 is ~1,000 tokens
as in the issue's loop. Rounds alternate cache on and off.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python bench/agent_loop.py --families qwen3_5 gemma3 gemma4 --turns 5 \\
        --rounds 2 --out bench/results/agent-loop.json

`--http` runs the same loop through streamed `POST /v1/responses` instead, against our engine +
facade and mlx-vlm's own server (bench/peers.py starts both; its prefix cache on: APC_ENABLED=1,
disk tier off, as ours) on the fixture and on a float32 copy of it (our engine computes in
float32 on the CPU; mlx-vlm in the checkpoint's dtype), the order flipping each round. The tool's
output carries the screenshot as a `function_call_output` image part, which both servers lower
into a following user turn.
TTFT is the client's (request sent → first delta); the cached share comes from
`usage.input_tokens_details.cached_tokens` ("n/a" where a server reports none). A server that
fails on a fixture has its error as the figure. Each server first runs one unmeasured turn (its
first request's compiles). Each round starts with a new nonce at the head of
the system prompt, so no round reuses another's cache.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python bench/agent_loop.py --http --rounds 2 \\
        --out bench/results/agent-loop-http.json
"""

from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

from bench.load import SSEParser  # noqa: E402
from bench.peers import PEERS_ROOT, Server, start_peer, start_vlmserve  # noqa: E402
from tests.engine._family_engine import (  # noqa: E402
    SCREENSHOT_TOOL,
    greedy,
    image,
    png,
    running_engine,
    screenshot_turn,
    text,
    user,
)
from training.families import FAMILIES, build_family  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402


def system_text(words: int) -> str:
    rules = " ".join(
        f"Rule {i}: keep the window {i % 7} in view and report what moved." for i in range(words // 12)
    )
    return "You operate a computer. " + rules


def system_prompt(words: int) -> pb.Message:
    return pb.Message(role=pb.ROLE_SYSTEM, parts=[text(system_text(words))])


def loop(stub: Any, turns: int, system: pb.Message) -> list[dict[str, Any]]:
    messages = [system, user(text("Open the settings page."), image(png(64, 48, seed=99)))]
    out = []
    for turn in range(turns):
        request = greedy(messages, max_tokens=16)
        request.tools.append(SCREENSHOT_TOOL)
        result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=600).result
        out.append(
            {
                "prompt_tokens": result.usage.input_tokens,
                "cached_tokens": result.usage.cached_tokens,
                "ttft_s": round(result.timings.time_to_first_token_seconds, 4),
            }
        )
        call_id = f"call_{turn:02d}"
        messages += screenshot_turn(result, call_id, seed=turn)
    return out


def summary(turns: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Median over rounds of each turn's TTFT; cached share of each turn after the first."""
    ttft = [statistics.median(run[i]["ttft_s"] for run in turns) for i in range(len(turns[0]))]
    first = turns[0]
    share = [
        round(first[i]["cached_tokens"] / first[i - 1]["prompt_tokens"], 3) for i in range(1, len(first))
    ]
    return {
        "prompt_tokens": [t["prompt_tokens"] for t in first],
        "cached_tokens": [t["cached_tokens"] for t in first],
        "ttft_s": ttft,
        "last_over_first": round(ttft[-1] / ttft[0], 3),
        "cached_share_of_previous_turn": share,
    }


# --- through HTTP, ours against mlx-vlm's server ------------------------------------------------

HTTP_TOOL = {
    "type": "function",
    "name": "screenshot",
    "description": "Capture the screen.",
    "parameters": {"type": "object", "properties": {}},
}
# mlx-vlm's prefix cache (APC) is off unless asked for; its disk tier off, as ours by default.
MLX_VLM_CACHE = {"APC_ENABLED": "1", "APC_DISK_ENABLED": "0"}


def image_item(seed: int) -> dict[str, str]:
    data = base64.b64encode(png(64, 48, seed=seed)).decode()
    return {"type": "input_image", "image_url": f"data:image/png;base64,{data}"}


def stream_turn(client: httpx.Client, server: Server, items: list[dict[str, Any]]) -> dict[str, Any]:
    """One streamed Responses turn: TTFT (to the first delta of any kind: text, reasoning or a
    call's arguments), the answer's text and the usage of the final event (`response.completed`,
    or `response.incomplete` when the answer reached `max_output_tokens`)."""
    body = {
        "model": server.model,
        "input": items,
        "tools": [HTTP_TOOL],
        "max_output_tokens": 16,
        "temperature": 0,
        "stream": True,
    }
    started = time.perf_counter()
    first: float | None = None
    parser, answer, usage = SSEParser(), [], None
    with client.stream("POST", "/v1/responses", json=body, headers=server.headers) as response:
        if response.status_code != 200:
            response.read()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        for line in response.iter_lines():
            event = parser.feed(line)
            if event is None or event.data.strip() == "[DONE]":
                continue
            payload = json.loads(event.data)
            kind = str(payload.get("type", event.event))
            if kind in ("error", "response.failed"):
                raise RuntimeError(f"stream error: {event.data[:300]}")
            if kind.endswith(".delta") and payload.get("delta") and first is None:
                first = time.perf_counter() - started
            if kind == "response.output_text.delta":
                answer.append(str(payload["delta"]))
            if kind in ("response.completed", "response.incomplete"):  # incomplete: the token cap
                usage = payload["response"].get("usage")
    if usage is None:
        raise RuntimeError("no usage in the final event")
    details = usage.get("input_tokens_details") or {}
    return {
        "prompt_tokens": usage["input_tokens"],
        "cached_tokens": details.get("cached_tokens"),  # None: the server reports none
        "ttft_s": round(first if first is not None else time.perf_counter() - started, 4),
        "text": "".join(answer),
    }


def http_loop(server: Server, turns: int, system: str) -> list[dict[str, Any]]:
    """The in-process loop's conversation as Responses items: the model's answer (its text) with a
    `screenshot` call it never generated, then the tool's output with a new screenshot."""
    items: list[dict[str, Any]] = [
        {"role": "system", "content": f"[{uuid.uuid4().hex[:12]}] {system}"},
        {
            "role": "user",
            "content": [{"type": "input_text", "text": "Open the settings page."}, image_item(99)],
        },
    ]
    out = []
    with httpx.Client(base_url=server.url, timeout=httpx.Timeout(900.0)) as client:
        for turn in range(turns):
            result = stream_turn(client, server, items)
            out.append({key: result[key] for key in ("prompt_tokens", "cached_tokens", "ttft_s")})
            call_id = f"call_{turn:02d}"
            if result["text"]:
                items.append({"role": "assistant", "content": result["text"]})
            items.append(
                {"type": "function_call", "call_id": call_id, "name": "screenshot", "arguments": "{}"}
            )
            output = [{"type": "input_text", "text": "captured"}, image_item(turn)]
            items.append({"type": "function_call_output", "call_id": call_id, "output": output})
    return out


def http_summary(runs: list[list[dict[str, Any]]], errors: list[str]) -> dict[str, Any]:
    """`summary` of the rounds that finished, with the cached share "n/a" where the server reports
    no cached tokens; a server with no finished round has its first error as the figure."""
    if not runs:
        return {"error": errors[0] if errors else "no round ran", "failures": len(errors)}
    reported = all(turn["cached_tokens"] is not None for run in runs for turn in run)
    table = summary([[{**turn, "cached_tokens": turn["cached_tokens"] or 0} for turn in run] for run in runs])
    if not reported:
        table["cached_tokens"] = "n/a"
        table["cached_share_of_previous_turn"] = "n/a"
    table["ttft_s_rounds"] = [[turn["ttft_s"] for turn in run] for run in runs]
    if errors:
        table["errors"] = errors
    return table


# mlx-vlm's server computes in the checkpoint's dtype (the fixtures': float16); our engine's
# `--dtype auto` casts half precision to float32 on the CPU. So mlx-vlm runs twice: on the fixture
# as it is, and on a float32 copy of it (the same weights, the dtype our engine computes in).
TARGETS = ("vlmserve", "mlx-vlm", "mlx-vlm-float32")


def float32_copy(model: Path, destination: Path) -> Path:
    """`model` with every floating weight cast to float32 and the configs' dtype saying so."""
    import mlx.core as mx

    if destination.exists():
        return destination
    shutil.copytree(model, destination)
    for path in destination.glob("*.safetensors"):
        weights = mx.load(str(path))
        assert isinstance(weights, dict)
        cast = {
            k: v.astype(mx.float32) if mx.issubdtype(v.dtype, mx.floating) else v for k, v in weights.items()
        }
        mx.save_safetensors(str(path), cast, metadata={"format": "mlx"})
    config_path = destination / "config.json"
    config = json.loads(config_path.read_text())
    for section in (config, *(v for v in config.values() if isinstance(v, dict))):
        for key in ("dtype", "torch_dtype"):
            if key in section:
                section[key] = "float32"
    config_path.write_text(json.dumps(config, indent=2))
    return destination


def start_target(target: str, model: Path, logs: Path, peers_root: Path) -> Server:
    if target == "vlmserve":
        return start_vlmserve(model, logs)
    if target == "mlx-vlm-float32":
        model = float32_copy(model, model.with_name(model.name + "-float32"))
    server = start_peer("mlx-vlm", model, logs, peers_root, env=MLX_VLM_CACHE)
    return dataclasses.replace(server, name=target)


def over_http(args: argparse.Namespace, root: Path, system: str) -> dict[str, Any]:
    report: dict[str, Any] = {"load_average_start": os.getloadavg()}
    for name in args.families:
        model = build_family(FAMILIES[name], root / name)
        logs = root / f"{name}-logs"
        logs.mkdir()
        servers: list[Server] = []
        runs: dict[str, list[list[dict[str, Any]]]] = {target: [] for target in TARGETS}
        errors: dict[str, list[str]] = {target: [] for target in TARGETS}
        try:
            for target in runs:
                try:
                    servers.append(start_target(target, model, logs, args.peers_root))
                except Exception as error:  # a server that cannot load the fixture: a result
                    errors[target].append(f"start: {type(error).__name__}: {str(error)[-600:]}")
            for server in servers:  # one unmeasured turn each: first-request compiles, not caching
                try:
                    http_loop(server, 1, system)
                except Exception as error:
                    errors[server.name].append(f"warm-up: {type(error).__name__}: {str(error)[-600:]}")
            for round_index in range(args.rounds):
                for server in servers if round_index % 2 == 0 else list(reversed(servers)):
                    try:
                        runs[server.name].append(http_loop(server, args.turns, system))
                    except Exception as error:  # a failed loop is a figure too
                        errors[server.name].append(f"{type(error).__name__}: {str(error)[-600:]}")
        finally:
            for server in servers:
                server.stop()
        report[name] = {target: http_summary(runs[target], errors[target]) for target in runs}
        print(name, json.dumps(report[name]), flush=True)
    report["load_average_end"] = os.getloadavg()
    return report


def in_process(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    system = system_prompt(args.system_words)
    report: dict[str, Any] = {}
    for name in args.families:
        model = build_family(FAMILIES[name], root / name)
        runs: dict[str, list[list[dict[str, Any]]]] = {"cache": [], "no_cache": []}
        for _ in range(args.rounds):
            for case, min_tokens in (("cache", 16), ("no_cache", 0)):
                with running_engine(model, prefix_cache_min_tokens=min_tokens) as (_, stub):
                    runs[case].append(loop(stub, args.turns, system))
        report[name] = {case: summary(turns) for case, turns in runs.items()}
        print(name, json.dumps(report[name]), flush=True)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--families", nargs="+", default=["qwen3_5", "gemma3", "gemma4"])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--system-words", type=int, default=700)
    parser.add_argument("--http", action="store_true", help="through HTTP, ours against mlx-vlm's server")
    parser.add_argument("--peers-root", type=Path, default=PEERS_ROOT)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = Path(tempfile.mkdtemp(prefix="agent-loop-"))
    report = over_http(args, root, system_text(args.system_words)) if args.http else in_process(args, root)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
