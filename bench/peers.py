"""Every MLX server that runs here, side by side (issue 37 item 3): vlmserve against mlx-vlm's
server, vllm-mlx, Rapid-MLX, fusion-mlx and mlx-openai-server, on the same checkpoint and the
same requests, one run, alternating.

Each peer runs from a virtual environment of its own (never a dependency of this project), made
by `bench/peers_install.sh` (default root /work/peers; `--peers-root`). A peer whose venv is
missing, or that does not start, is reported as such and the run goes on without it.

Workloads, all through streamed `POST /v1/chat/completions` (the one API every peer serves),
speculation off on every side, greedy:
- single: N requests one after another (tok/s);
- c8 / c16: 8 / 16 requests at once, each with a prompt of its own and a unique nonce (some
  peers cache repeated prompts) (aggregate tok/s);
- agent: a 5-turn conversation, each turn adding a new 448x448 screenshot in a user message
  (time to first token per turn; the history is re-sent each turn, as agents do);
- tool: a forced function call (`tool_choice` naming the function): latency and whether the
  arguments parse as JSON;
- json: a `json_schema` response format: latency and whether the answer parses and has the keys.
Every round runs each target on one workload before the next target, the order flipping each
round, so no two servers share the CPU. Figures: the best round (the least disturbed one) and
the ratio vlmserve ÷ peer from the same run.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.peers --out bench/results/peers.json

`--best`: each side in its fastest documented configuration instead (BEST: ours with
`--speculative auto`, the peers with their prompt caches and n-gram drafting where they run
here), the same workloads and ratios: the "then each side's best" table.

Before and after a change (issue 32: "the bench figures do not move"): `--peers` with no name and
`--baseline-tree DIR`, a checkout at the older commit with its own .venv, served beside this one.
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
import uuid
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.batching import prompt, screenshot
from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.load import SSEParser
from tests._services import BIN, ServiceProcess, free_port, process_env, start_engine, start_facade

PEERS_ROOT = Path("/work/peers")
API_KEY = "bench-key"


# --- the servers ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeerCommand:
    """How one peer is started: its venv, its command line (model dir and port filled in), where."""

    venv: str
    argv: Callable[[Path, Path, int], list[str]]  # (venv bin, model dir, port) -> command
    in_model_parent: bool = False  # run from the folder holding the model folder
    needs_key: bool = False


PEERS: dict[str, PeerCommand] = {
    "mlx-vlm": PeerCommand(
        "mlx-vlm",
        lambda b, m, p: [str(b / "python"), "-m", "mlx_vlm.server", "--model", str(m), "--port", str(p)],
    ),
    "vllm-mlx": PeerCommand(
        "vllm-mlx",
        lambda b, m, p: [
            str(b / "vllm-mlx"),
            "serve",
            str(m),
            "--port",
            str(p),
            "--mllm",
            "--offline",
            "--continuous-batching",
        ],
    ),
    "rapid-mlx": PeerCommand(
        "rapid-mlx",
        lambda b, m, p: [
            str(b / "rapid-mlx"),
            "serve",
            str(m),
            "--port",
            str(p),
            "--mllm",
            "--disable-model-downloads",
        ],
    ),
    "fusion-mlx": PeerCommand(
        "fusion-mlx",
        lambda b, m, p: [
            str(b / "fusion-mlx"),
            "serve",
            "--model-dir",
            str(m.parent),
            "--port",
            str(p),
            "--api-key",
            API_KEY,
            "--profile",
            "standard",
            "--spec-decode",
            "none",
        ],
        in_model_parent=True,
        needs_key=True,
    ),
    "mlx-openai-server": PeerCommand(
        "mlx-openai-server",
        lambda b, m, p: [
            str(b / "mlx-openai-server"),
            "launch",
            "--model-path",
            str(m),
            "--model-type",
            "multimodal",
            "--port",
            str(p),
        ],
    ),
}


@dataclass(frozen=True)
class BestConfig:
    """A side's fastest documented configuration that runs here (Linux CPU MLX, no download):
    flags set on top of its like-for-like command (`{flag: value}`; value None: a bare flag),
    flags removed, environment added, and what it turns on (for the report)."""

    set_flags: dict[str, str | None] = field(default_factory=dict)
    drop_flags: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    what: str = ""


def with_flags(argv: Sequence[str], config: BestConfig) -> list[str]:
    """`argv` with `config.drop_flags` removed (each with its value, when one follows) and
    `config.set_flags` set: an existing flag's value replaced in place, a missing one appended."""
    flags = {**config.set_flags}
    out: list[str] = []
    index = 0
    while index < len(argv):
        token = argv[index]
        has_value = index + 1 < len(argv) and not argv[index + 1].startswith("--")
        if token in config.drop_flags:
            index += 2 if has_value else 1
            continue
        if token in flags:
            value = flags.pop(token)
            out.append(token)
            if value is not None:
                out.append(value)
            index += 2 if has_value else 1
            continue
        out.append(token)
        index += 1
    for flag, value in flags.items():
        out.extend([flag] if value is None else [flag, value])
    return out


# Each side's fastest documented configuration that serves the bench model here (issue 37.3,
# "then each side's best"). What was tried and did not run is in docs/performance.md.
BEST: dict[str, BestConfig] = {
    "vlmserve": BestConfig(
        set_flags={"--speculative": "auto"},
        what="--speculative auto (prompt lookup + grammar fast-forward; no draft model) and the "
        "prefix cache as shipped",
    ),
    "mlx-vlm": BestConfig(
        env={"APC_ENABLED": "1", "APC_DISK_ENABLED": "0"},
        what="automatic prefix cache in memory (APC_ENABLED=1, off by default; on qwen2_vl its "
        "self-check fails, 'model has no make_cache', and it caches nothing)",
    ),
    "vllm-mlx": BestConfig(
        what="its defaults: continuous batching, prefix cache (--use-paged-cache leaves the vision "
        "lane's cache as it is; MTP needs MTP heads; --mllm-draft-model takes Gemma 4 drafters)",
    ),
    "rapid-mlx": BestConfig(
        what="its defaults: prefix cache, media prefix cache (explicit speculative decoding is "
        "rejected with --mllm)",
    ),
    "fusion-mlx": BestConfig(
        set_flags={"--spec-decode": "auto"},
        what="--spec-decode auto (n-gram suffix drafting for a model without MTP heads), prefix "
        "cache, int4 KV (its defaults)",
    ),
    "mlx-openai-server": BestConfig(what="its defaults (nothing it offers runs here)"),
}


@dataclass
class Server:
    name: str
    url: str
    model: str
    headers: dict[str, str]
    services: list[ServiceProcess]

    def stop(self) -> None:
        for service in self.services:
            service.stop()


def wait_for_models(service: ServiceProcess, headers: dict[str, str], timeout: float) -> str:
    """The first model id of GET /v1/models once the server answers it."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            answer = httpx.get(f"{service.address}/v1/models", headers=headers, timeout=3)
            if answer.status_code == 200 and answer.json().get("data"):
                return str(answer.json()["data"][0]["id"])
        except (httpx.HTTPError, ValueError):
            pass
        if service.process.poll() is not None or time.monotonic() > deadline:
            log = service.log()[-2000:]
            service.stop()
            raise RuntimeError(f"did not start:\n{log}")
        time.sleep(1)


def start_peer(
    name: str,
    model_dir: Path,
    logs: Path,
    root: Path,
    env: dict[str, str] | None = None,
    *,
    best: BestConfig | None = None,
) -> Server:
    """`env`: variables added to the peer's environment (mlx-vlm's prefix cache is one); `best`:
    its flags and environment on top of the like-for-like command."""
    spec = PEERS[name]
    venv_bin = root / spec.venv / "bin"
    if not venv_bin.is_dir():
        raise RuntimeError(f"no venv at {venv_bin.parent} (bench/peers_install.sh)")
    if spec.in_model_parent:
        # It serves every model folder beside the model (fusion-mlx): give it a folder holding
        # only this one, so it cannot pick another.
        alone = logs / f"{name}-models"
        alone.mkdir(exist_ok=True)
        if not (alone / model_dir.name).exists():
            (alone / model_dir.name).symlink_to(model_dir.resolve(), target_is_directory=True)
        model_dir = alone / model_dir.name
    port = free_port()
    log_path = logs / f"{name}-{port}.log"
    env = {
        **process_env(),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        # Rapid-MLX and fusion-mlx report usage by default; a benchmark sends nothing anywhere.
        "DO_NOT_TRACK": "1",
        "RAPID_MLX_TELEMETRY": "0",
        "FUSION_MLX_TELEMETRY": "0",
        **(best.env if best else {}),
        **(env or {}),
    }
    argv = spec.argv(venv_bin, model_dir, port)
    if best is not None:
        argv = with_flags(argv, best)
    # Some peers write into their working folder (mlx-openai-server: logs/app.log): the logs'.
    cwd = model_dir.parent if spec.in_model_parent else logs
    with log_path.open("wb") as log:
        process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=cwd)
    service = ServiceProcess(process, f"http://127.0.0.1:{port}", log_path)
    headers = {"Authorization": f"Bearer {API_KEY}"} if spec.needs_key else {}
    served = wait_for_models(service, headers, timeout=300)
    if spec.in_model_parent and served != model_dir.name:
        service.stop()
        raise RuntimeError(f"serves {served!r}, not the bench model {model_dir.name!r}")
    return Server(name, service.address, served, headers, [service])


def start_vlmserve(
    model_dir: Path, logs: Path, tree: Path | None = None, *, best: BestConfig | None = None
) -> Server:
    """Our engine + facade; with `tree`, the same stack from another checkout (its venv at
    tree/.venv, e.g. a worktree at an older commit), named `vlmserve@<its commit>`: before and
    after a change, side by side in one run. Speculation off, or `best`'s flags."""
    bin_dir, name = BIN, "vlmserve"
    if tree is not None:
        bin_dir = tree / ".venv" / "bin"
        commit = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        name = f"vlmserve@{commit}"
    flags = ["--speculative", "off"]
    if best is not None:
        flags = with_flags(flags, best)
    engine = start_engine(logs, model=str(model_dir), extra=tuple(flags), bin_dir=bin_dir)
    facade = start_facade(
        logs, engine.address, store_path=logs / f"store-{time.monotonic_ns()}.sqlite3", bin_dir=bin_dir
    )
    return Server(name, facade.address, model_dir.name, {}, [facade, engine])


# --- requests ------------------------------------------------------------------------------------


def chat(model: str, messages: list[dict[str, Any]], tokens: int, **extra: Any) -> dict[str, Any]:
    return {
        "model": model,
        "messages": messages,
        "max_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }


def distinct(model: str, index: int, tokens: int) -> dict[str, Any]:
    """A prompt of its own, with a nonce no cache has seen."""
    text = f"[{uuid.uuid4().hex[:12]}] {prompt(index)}"
    return chat(model, [{"role": "user", "content": text}], tokens)


WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
            "required": ["city", "unit"],
        },
    },
}
ANSWER_SCHEMA = {
    "type": "json_schema",
    "json_schema": {
        "name": "answer",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city", "days"],
            "additionalProperties": False,
        },
    },
}


@dataclass
class Streamed:
    ttft_s: float | None
    latency_s: float
    tokens: int
    text: str
    tool_arguments: str | None
    counted_by_usage: bool


async def stream(client: httpx.AsyncClient, server: Server, request: dict[str, Any]) -> Streamed:
    started = time.perf_counter()
    parser = SSEParser()
    first: float | None = None
    chunks, text, arguments, usage_tokens = 0, [], None, None
    async with client.stream(
        "POST", "/v1/chat/completions", json=request, headers=server.headers
    ) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        async for line in response.aiter_lines():
            event = parser.feed(line)
            if event is None or event.data.strip() == "[DONE]":
                continue
            payload = json.loads(event.data)
            if payload.get("error"):  # an error event inside a 200 stream (mlx-openai-server's way)
                raise RuntimeError(f"stream error: {json.dumps(payload['error'])[:300]}")
            if isinstance(payload.get("usage"), dict) and payload["usage"].get("completion_tokens"):
                usage_tokens = int(payload["usage"]["completion_tokens"])
            for choice in payload.get("choices") or []:
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("tool_calls"):
                    chunks += 1
                    if first is None:
                        first = time.perf_counter() - started
                text.append(delta.get("content") or "")
                for call in delta.get("tool_calls") or []:
                    piece = (call.get("function") or {}).get("arguments") or ""
                    arguments = (arguments or "") + piece
    return Streamed(
        first,
        time.perf_counter() - started,
        usage_tokens if usage_tokens is not None else chunks,
        "".join(text),
        arguments,
        usage_tokens is not None,
    )


# --- workloads -----------------------------------------------------------------------------------


@dataclass
class Figures:
    """Per target and workload: each round's headline figure (tok/s or seconds) and notes."""

    rounds: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    errors: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    valid: dict[str, dict[str, list[bool]]] = field(default_factory=dict)
    counted_by_usage: dict[str, bool] = field(default_factory=dict)
    # The 1-minute load average as each round's workload began (other jobs share the CPU).
    load: list[dict[str, Any]] = field(default_factory=list)

    def add(self, target: str, workload: str, value: float) -> None:
        self.rounds.setdefault(target, {}).setdefault(workload, []).append(value)

    def fail(self, target: str, workload: str, error: str) -> None:
        self.errors.setdefault(target, {}).setdefault(workload, []).append(error[:300])

    def check(self, target: str, workload: str, ok: bool) -> None:
        self.valid.setdefault(target, {}).setdefault(workload, []).append(ok)


HIGHER_IS_BETTER = {
    "single": True,
    "c8": True,
    "c16": True,
    "agent_ttft_turn5": False,
    "tool": False,
    "json": False,
}


async def run_workload(server: Server, workload: str, figures: Figures, args: argparse.Namespace) -> None:
    async with httpx.AsyncClient(base_url=server.url, timeout=httpx.Timeout(1800.0)) as client:
        if workload in ("single", "c8", "c16"):
            count = {"single": args.single, "c8": 8, "c16": 16}[workload]
            requests = [distinct(server.model, i, args.tokens) for i in range(count)]
            started = time.perf_counter()
            if workload == "single":
                done = [await stream(client, server, r) for r in requests]
            else:
                done = list(await asyncio.gather(*(stream(client, server, r) for r in requests)))
            wall = time.perf_counter() - started
            figures.add(server.name, workload, sum(d.tokens for d in done) / wall)
            figures.counted_by_usage[server.name] = all(d.counted_by_usage for d in done)
        elif workload == "agent_ttft_turn5":
            messages: list[dict[str, Any]] = []
            ttfts = []
            nonce = uuid.uuid4().hex[:8]
            for turn in range(5):
                content = [
                    {"type": "text", "text": f"[{nonce}] Turn {turn + 1}: what changed on the screen?"},
                    {"type": "image_url", "image_url": {"url": screenshot(1000 * turn + len(nonce))}},
                ]
                messages.append({"role": "user", "content": content})
                answer = await stream(client, server, chat(server.model, messages, args.agent_tokens))
                ttfts.append(answer.ttft_s or answer.latency_s)
                messages.append({"role": "assistant", "content": answer.text or "(nothing)"})
            figures.add(server.name, workload, ttfts[-1])
            figures.add(server.name, "agent_ttft_turn1", ttfts[0])
        elif workload == "tool":
            request = chat(
                server.model,
                [{"role": "user", "content": f"[{uuid.uuid4().hex[:8]}] Weather in Oslo, in celsius?"}],
                args.tokens,
                tools=[WEATHER_TOOL],
                tool_choice={"type": "function", "function": {"name": "get_weather"}},
            )
            answer = await stream(client, server, request)
            figures.add(server.name, workload, answer.latency_s)
            figures.check(server.name, workload, parses(answer.tool_arguments, ("city", "unit")))
        elif workload == "json":
            request = chat(
                server.model,
                [
                    {
                        "role": "user",
                        "content": f"[{uuid.uuid4().hex[:8]}] A city and a number of days, as JSON.",
                    }
                ],
                args.tokens,
                response_format=ANSWER_SCHEMA,
            )
            answer = await stream(client, server, request)
            figures.add(server.name, workload, answer.latency_s)
            figures.check(server.name, workload, parses(answer.text, ("city", "days")))


def parses(text: str | None, keys: Sequence[str]) -> bool:
    try:
        value = json.loads(text or "")
    except ValueError:
        return False
    return isinstance(value, dict) and all(key in value for key in keys)


def best(values: list[float], higher: bool) -> float:
    return max(values) if higher else min(values)


def summary(figures: Figures) -> dict[str, dict[str, Any]]:
    """Per workload: each target's best round and vlmserve ÷ target (>1 means vlmserve is ahead)."""
    table: dict[str, dict[str, Any]] = {}
    ours = figures.rounds.get("vlmserve", {})
    for workload, higher in {**HIGHER_IS_BETTER, "agent_ttft_turn1": False}.items():
        row: dict[str, Any] = {}
        for target, by_workload in figures.rounds.items():
            if workload not in by_workload:
                continue
            value = best(by_workload[workload], higher)
            entry: dict[str, Any] = {"best": round(value, 3)}
            if target != "vlmserve" and workload in ours:
                mine = best(ours[workload], higher)
                # A peer that produced nothing has no ratio (its errors say why).
                if value > 0 and mine > 0:
                    entry["vlmserve_ratio"] = round(mine / value if higher else value / mine, 3)
            row[target] = entry
        table[workload] = row
    return table


async def measure(servers: list[Server], args: argparse.Namespace) -> Figures:
    figures = Figures()
    for round_index in range(args.rounds):
        for workload in args.workloads:
            order = servers if round_index % 2 == 0 else list(reversed(servers))
            figures.load.append(
                {"round": round_index, "workload": workload, "load_1m": round(os.getloadavg()[0], 2)}
            )
            for server in order:
                try:
                    await run_workload(server, workload, figures, args)
                except Exception as error:  # a peer's failure is a result, not a crash
                    figures.fail(server.name, workload, f"{type(error).__name__}: {error}")
                print(f"round {round_index} {workload} {server.name} done", file=sys.stderr, flush=True)
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_DIR, help="built when missing")
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--peers-root", type=Path, default=PEERS_ROOT)
    parser.add_argument(
        "--workloads", nargs="*", default=list(HIGHER_IS_BETTER), choices=list(HIGHER_IS_BETTER)
    )
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--agent-tokens", type=int, default=16)
    parser.add_argument("--single", type=int, default=3, help="requests in the single-stream workload")
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        default=None,
        help="also serve vlmserve from this checkout (a worktree at another commit with its own .venv)",
    )
    parser.add_argument(
        "--best",
        action="store_true",
        help="each side in its fastest documented configuration (BEST) instead of speculation off",
    )
    args = parser.parse_args(argv)
    if not args.model_dir.is_dir():
        build_bench_model(args.model_dir)
    logs = Path(tempfile.mkdtemp(prefix="vlmserve-peers-"))
    servers: list[Server] = []
    started: dict[str, str] = {}
    ours = BEST["vlmserve"] if args.best else None
    load_start = os.getloadavg()
    try:
        servers.append(start_vlmserve(args.model_dir, logs, best=ours))
        started["vlmserve"] = "ok"
        if args.baseline_tree is not None:
            servers.append(start_vlmserve(args.model_dir, logs, args.baseline_tree, best=ours))
            started[servers[-1].name] = "ok"
        for name in args.peers:
            try:
                config = BEST[name] if args.best else None
                servers.append(start_peer(name, args.model_dir, logs, args.peers_root, best=config))
                started[name] = "ok"
            except Exception as error:  # reported; the others still run
                started[name] = f"{type(error).__name__}: {str(error)[-600:]}"
            print(f"{name}: {started[name][:200]}", file=sys.stderr, flush=True)
        figures = asyncio.run(measure(servers, args))
    finally:
        for server in servers:
            server.stop()
    report = {
        "model": str(args.model_dir),
        "mode": "best" if args.best else "speculation off",
        "configs": {name: asdict(BEST[name]) for name in ["vlmserve", *args.peers]} if args.best else {},
        "load_average_start": load_start,
        "load_average": os.getloadavg(),
        "started": started,
        "summary": summary(figures),
        "figures": asdict(figures),
        "logs": str(logs),
    }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
