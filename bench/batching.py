"""Continuous batching, side by side: vlmserve (facade -> engine) against mlx-vlm 0.7.10's own
`mlx_vlm.server` and in-process `mlx_vlm.stream_generate`, same model, same requests, one run.

The model is the ~144M-parameter float32 random qwen2_vl of bench/bench_model.py (built when
missing). Both servers (and the in-process worker) are started once and take turns, A B then
B A, so they never compete for the CPU; on a shared machine, compare ratios from one run, not
absolute figures across runs, and prefer tokens per CPU-second of each side's own processes.
Scenarios (all through `POST /v1/responses`, streaming):

- sequential: N requests one after another (tok/s = output tokens / wall time), alternating
  with in-process `stream_generate` in its own process (same environment) on the same prompts;
- curve: C requests at once for C in --concurrency (aggregate tok/s);
- shared: 8 requests at once with the same new --shared-tokens system prompt (a new one each
  round, so no cache has seen it) and their own questions (aggregate tok/s, mean TTFT);
- agent: 5 turns chained by previous_response_id, each adding a new 448x448 screenshot (TTFT);
- prefill: a short request's TTFT while a --long-tokens prompt prefills, and idle;
- memory: peak server RSS (VmHWM) under 16 concurrent image requests.

    python -m bench.batching --out bench/results/batching.json --plot docs/performance-batching.png
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.load import SSEParser, event_type
from tests._services import BIN, REPO, ServiceProcess, free_port, process_env, start_engine, start_facade

MODEL_NAME = "bench"


# --- requests ------------------------------------------------------------------------------------


def screenshot(seed: int, size: int = 448) -> str:
    """A new 'screenshot' (random blocks) as a PNG data URL."""
    from PIL import Image, ImageDraw

    rng = random.Random(seed)
    picture = Image.new("RGB", (size, size), (255, 255, 255))
    draw = ImageDraw.Draw(picture)
    for _ in range(24):
        x, y = rng.randrange(size), rng.randrange(size)
        colour = (rng.randrange(256), rng.randrange(256), rng.randrange(256))
        draw.rectangle((x, y, x + rng.randrange(8, 120), y + rng.randrange(8, 60)), fill=colour)
    buffer = io.BytesIO()
    picture.save(buffer, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def body(
    model: str, text: str, *, tokens: int, image: str | None = None, previous: str | None = None
) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "input_text", "text": text}]
    if image is not None:
        content.append({"type": "input_image", "image_url": image, "detail": "auto"})
    request: dict[str, Any] = {
        "model": model,
        "input": [{"role": "user", "content": content}],
        "max_output_tokens": tokens,
        "temperature": 0,
        "stream": True,
        "store": previous is not None or image is not None,
    }
    if previous is not None:
        request["previous_response_id"] = previous
    return request


def prompt(index: int) -> str:
    return (
        f"Request {index}: list the steps to check a {['bridge', 'boat', 'car', 'door'][index % 4]} safely."
    )


def shared_prompt_requests(model: str, *, system_tokens: int, seed: int, tokens: int) -> list[dict[str, Any]]:
    """Eight sessions starting at once with the same (new) system prompt, each its own question."""
    system = "Follow these rules. " + long_prompt(system_tokens, seed=seed)
    requests = []
    for index in range(8):
        request = body(model, prompt(500 + index), tokens=tokens)
        request["input"].insert(0, {"role": "system", "content": system})
        requests.append(request)
    return requests


def long_prompt(tokens: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    # The fixture's tokenizer has no merges for digits: each digit and space is one token, so
    # six-digit numbers take seven tokens each (measured: 8192 -> 8189 tokens).
    return " ".join(str(rng.randrange(10**5, 10**6)) for _ in range(tokens // 7))


@dataclass
class Streamed:
    ttft_s: float | None
    latency_s: float
    output_tokens: int
    response_id: str | None
    ok: bool
    input_tokens: int = 0
    cached_tokens: int = 0


async def stream(client: httpx.AsyncClient, request: dict[str, Any]) -> Streamed:
    started = time.perf_counter()
    parser = SSEParser()
    first: float | None = None
    tokens, response_id, ok, usage = 0, None, False, {}
    async with client.stream("POST", "/v1/responses", json=request) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        async for line in response.aiter_lines():
            event = parser.feed(line)
            if event is None:
                continue
            kind = event_type(event)
            if first is None and kind == "response.output_text.delta":
                first = time.perf_counter() - started
            if kind in ("response.completed", "response.incomplete"):
                payload = json.loads(event.data)["response"]
                usage = payload.get("usage") or {}
                tokens = int(usage.get("output_tokens") or 0)
                response_id, ok = payload.get("id"), True
    details = usage.get("input_tokens_details") or {}
    return Streamed(
        first,
        time.perf_counter() - started,
        tokens,
        response_id,
        ok,
        input_tokens=int(usage.get("input_tokens") or 0),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )


async def at_once(
    client: httpx.AsyncClient, requests: Sequence[dict[str, Any]]
) -> tuple[float, list[Streamed]]:
    started = time.perf_counter()
    results = await asyncio.gather(*(stream(client, r) for r in requests))
    return time.perf_counter() - started, list(results)


# --- servers -------------------------------------------------------------------------------------


def peak_rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) in MiB."""
    fields = dict(
        line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line
    )
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


# mlx-vlm's automatic prefix cache is off unless APC_ENABLED is set; "mlx-vlm-server-apc" turns
# it on (in memory only).
MLX_VLM_APC_ENV = {"APC_ENABLED": "1", "APC_DISK_ENABLED": "0"}


def start_mlx_vlm_server(log_dir: Path, model: Path, *, apc: bool = False) -> ServiceProcess:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = log_dir / f"mlx-vlm-server-{port}.log"
    command = [str(BIN / "python"), "-m", "mlx_vlm.server", "--model", str(model), "--port", str(port)]
    command += ["--host", "127.0.0.1"]
    env = {**process_env(), **(MLX_VLM_APC_ENV if apc else {})}
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    service = ServiceProcess(process, url, log_path)
    deadline = time.monotonic() + 180
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"mlx_vlm.server did not start:\n{service.log()[-3000:]}")
        time.sleep(0.5)


# --- scenarios -----------------------------------------------------------------------------------


@dataclass
class Target:
    """A running server: its URL, the model name it answers to, and the processes doing its work."""

    name: str
    url: str
    model: str
    pids: list[int]
    services: list[ServiceProcess]

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pids)

    def stop(self) -> None:
        for service in self.services:
            service.stop()


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pids: Sequence[int]) -> float:
    """User + system CPU time of these processes so far (immune to time slicing by others)."""
    ticks = 0
    for pid in pids:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / CLOCK_TICKS


def start_target(name: str, model_dir: Path, logs: Path, args: argparse.Namespace) -> Target:
    if name.startswith("vlmserve"):  # vlmserve, or a variant with its own --engine-arg
        engine = start_engine(logs, model=str(model_dir), extra=tuple(args.engine_arg))
        facade = start_facade(logs, engine.address, store_path=logs / f"store-{time.monotonic_ns()}.sqlite3")
        return Target(
            name, facade.address, model_dir.name, [engine.process.pid, facade.process.pid], [facade, engine]
        )
    server = start_mlx_vlm_server(logs, model_dir, apc=name == "mlx-vlm-server-apc")
    return Target(name, server.address, str(model_dir), [server.process.pid], [server])


@dataclass
class Throughput:
    """Best wall-clock tok/s over the rounds (the least disturbed one) and median tok per CPU-second."""

    tok_s: float = 0.0
    tok_per_cpu_s: float = 0.0
    rounds: list[tuple[float, float]] = field(default_factory=list)  # (tok/s, tok per CPU-s)

    def add(self, tokens: int, wall: float, cpu: float) -> None:
        self.rounds.append((tokens / wall, tokens / max(cpu, 1e-9)))
        self.tok_s = max(r[0] for r in self.rounds)
        self.tok_per_cpu_s = statistics.median(r[1] for r in self.rounds)


@dataclass
class TargetResult:
    name: str
    sequential: Throughput = field(default_factory=Throughput)
    curve: dict[int, Throughput] = field(default_factory=dict)
    shared_prompt: Throughput = field(default_factory=Throughput)
    # Mean time to first token of the eight requests, per round.
    shared_prompt_ttft_s: list[float] = field(default_factory=list)
    agent_ttft_s: list[float] = field(default_factory=list)
    # (input tokens, cached tokens) per turn
    agent_tokens: list[tuple[int, int]] = field(default_factory=list)
    short_ttft_idle_s: float = 0.0
    short_ttft_during_prefill_s: float = 0.0
    long_prompt_ttft_s: float = 0.0
    rss_before_mib: float = 0.0
    peak_rss_mib: float = 0.0
    notes: list[str] = field(default_factory=list)


async def throughput(
    target: Target, requests: list[dict[str, Any]], *, one_by_one: bool
) -> tuple[int, float, float]:
    """(output tokens, wall seconds, CPU seconds) for `requests`, sequential or all at once."""
    tokens, wall, cpu, _ = await timed(target, requests, one_by_one=one_by_one)
    return tokens, wall, cpu


async def timed(
    target: Target, requests: list[dict[str, Any]], *, one_by_one: bool
) -> tuple[int, float, float, list[Streamed]]:
    """throughput()'s figures and each request's own."""
    async with httpx.AsyncClient(base_url=target.url, timeout=httpx.Timeout(1800.0)) as client:
        cpu = target.cpu_seconds()
        started = time.perf_counter()
        if one_by_one:
            done = [await stream(client, r) for r in requests]
        else:
            done = list(await asyncio.gather(*(stream(client, r) for r in requests)))
        wall = time.perf_counter() - started
        return sum(r.output_tokens for r in done), wall, target.cpu_seconds() - cpu, done


async def agent_loop(target: Target, result: TargetResult) -> None:
    async with httpx.AsyncClient(base_url=target.url, timeout=httpx.Timeout(900.0)) as client:
        previous = None
        for turn in range(5):
            text = f"Turn {turn + 1}: here is the new screen. What changed?"
            one = await stream(
                client, body(target.model, text, tokens=8, image=screenshot(1000 + turn), previous=previous)
            )
            previous = one.response_id
            result.agent_ttft_s.append(one.ttft_s or one.latency_s)
            result.agent_tokens.append((one.input_tokens, one.cached_tokens))
    print(
        f"{target.name}: agent TTFT per turn {[round(t, 2) for t in result.agent_ttft_s]}, "
        f"(input, cached) tokens {result.agent_tokens}",
        flush=True,
    )


async def prefill_interference(target: Target, result: TargetResult, args: argparse.Namespace) -> None:
    model = target.model
    async with httpx.AsyncClient(base_url=target.url, timeout=httpx.Timeout(1800.0)) as client:
        idle = [(await stream(client, body(model, prompt(200 + i), tokens=4))) for i in range(3)]
        result.short_ttft_idle_s = statistics.median(r.ttft_s or r.latency_s for r in idle)
        long_task = asyncio.create_task(stream(client, body(model, long_prompt(args.long_tokens), tokens=1)))
        await asyncio.sleep(args.long_head_start)
        short = await stream(client, body(model, prompt(300), tokens=4))
        long = await long_task
    result.short_ttft_during_prefill_s = short.ttft_s or short.latency_s
    result.long_prompt_ttft_s = long.ttft_s or long.latency_s
    if result.short_ttft_during_prefill_s > result.long_prompt_ttft_s - args.long_head_start:
        result.notes.append("the short request's first token came after the long prompt's")
    print(
        f"{target.name}: short TTFT idle {result.short_ttft_idle_s:.2f}s, during a long prefill "
        f"{result.short_ttft_during_prefill_s:.2f}s (long TTFT {result.long_prompt_ttft_s:.1f}s)",
        flush=True,
    )


async def measure_memory(target: Target, result: TargetResult) -> None:
    """Peak RSS of a freshly started server under 16 concurrent image requests (after a warm-up)."""
    pid = target.pids[0]
    async with httpx.AsyncClient(base_url=target.url, timeout=httpx.Timeout(900.0)) as client:
        await stream(client, body(target.model, "warm up", tokens=4, image=screenshot(999)))
        result.rss_before_mib = peak_rss_mib(pid)[0]
        await asyncio.gather(
            *(
                stream(client, body(target.model, prompt(400 + i), tokens=8, image=screenshot(2000 + i)))
                for i in range(16)
            )
        )
        result.peak_rss_mib = peak_rss_mib(pid)[1]
    print(
        f"{target.name}: RSS {result.rss_before_mib:.0f} MiB after warm-up, peak {result.peak_rss_mib:.0f}",
        flush=True,
    )


async def measure_all(
    targets: list[Target], args: argparse.Namespace, in_process: InProcess | None = None
) -> dict[str, TargetResult]:
    """Throughput in alternating rounds (A B, then B A, ...), then the other scenarios. The
    in-process sequential runs alternate with the servers' sequential runs."""
    results = {t.name: TargetResult(t.name) for t in targets}
    if in_process is not None:
        results[in_process.name] = TargetResult(in_process.name)
    for target in targets:
        async with httpx.AsyncClient(base_url=target.url, timeout=httpx.Timeout(900.0)) as client:
            await stream(client, body(target.model, "warm up", tokens=4, image=screenshot(999)))
    for round_index in range(args.rounds):
        order = targets if round_index % 2 == 0 else targets[::-1]
        sequential: list[Target | InProcess] = [*targets, *([in_process] if in_process else [])]
        for runner in sequential if round_index % 2 == 0 else sequential[::-1]:
            if isinstance(runner, InProcess):
                measured = await asyncio.to_thread(runner.sequential, args.sequential, args.tokens)
            else:
                requests = [body(runner.model, prompt(i), tokens=args.tokens) for i in range(args.sequential)]
                measured = await throughput(runner, requests, one_by_one=True)
            results[runner.name].sequential.add(*measured)
        for concurrency in args.concurrency:
            for target in order:
                requests = [
                    body(target.model, prompt(100 + i), tokens=args.tokens) for i in range(concurrency)
                ]
                curve = results[target.name].curve.setdefault(concurrency, Throughput())
                curve.add(*await throughput(target, requests, one_by_one=False))
        if "shared" in args.scenarios:
            for target in order:
                requests = shared_prompt_requests(
                    target.model, system_tokens=args.shared_tokens, seed=round_index, tokens=args.tokens
                )
                tokens, wall, cpu, done = await timed(target, requests, one_by_one=False)
                results[target.name].shared_prompt.add(tokens, wall, cpu)
                ttft = statistics.mean(r.ttft_s or r.latency_s for r in done)
                results[target.name].shared_prompt_ttft_s.append(ttft)
                print(
                    f"round {round_index + 1} {target.name}: shared system prompt, 8 at once: "
                    f"{tokens / wall:.1f} tok/s, mean TTFT {ttft:.2f}s, "
                    f"cached {[r.cached_tokens for r in done]}",
                    flush=True,
                )
        for name in [*(t.name for t in order), *([in_process.name] if in_process else [])]:
            r = results[name]
            curve = ", ".join(
                f"{c}: {t.rounds[-1][0]:.1f} ({t.rounds[-1][1]:.1f}/CPU-s)" for c, t in r.curve.items()
            )
            print(
                f"round {round_index + 1} {name} (load {os.getloadavg()[0]:.1f}): sequential "
                f"{r.sequential.rounds[-1][0]:.1f} tok/s, {r.sequential.rounds[-1][1]:.1f} tok/CPU-s; "
                f"{curve}",
                flush=True,
            )
    for target in targets:
        if "agent" in args.scenarios:
            await agent_loop(target, results[target.name])
        if "prefill" in args.scenarios and target.name in args.prefill_targets:
            await prefill_interference(target, results[target.name], args)
    return results


class InProcess:
    """`mlx_vlm.stream_generate` in its own process (this module with --in-process-worker), with
    the servers' environment (OpenBLAS preloaded: without it MLX's CPU matmuls are several times
    slower) and its own CPU time, so its sequential runs alternate with the servers' in one run."""

    name = "in-process"

    def __init__(self, model_dir: Path) -> None:
        command = [str(BIN / "python"), "-m", "bench.batching", "--in-process-worker", str(model_dir)]
        command += ["--out", os.devnull]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=process_env(), cwd=REPO, text=True
        )
        self.pids = [self.process.pid]
        self._ask("ready")

    def _ask(self, line: str) -> dict[str, Any]:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(line + "\n")
        self.process.stdin.flush()
        answer = self.process.stdout.readline()
        if not answer:
            raise RuntimeError("the in-process worker exited")
        result: dict[str, Any] = json.loads(answer)
        return result

    def sequential(self, count: int, tokens: int) -> tuple[int, float, float]:
        """(output tokens, wall seconds, CPU seconds) for `count` requests one after another."""
        return self.generate([prompt(index) for index in range(count)], tokens)

    def generate(
        self, prompts: Sequence[str], tokens: int, temperature: float = 0.0
    ) -> tuple[int, float, float]:
        """(output tokens, wall seconds, CPU seconds) for these prompts one after another."""
        cpu = cpu_seconds(self.pids)
        started = time.perf_counter()
        answer = self._ask(
            json.dumps({"prompts": list(prompts), "tokens": tokens, "temperature": temperature})
        )
        return int(answer["tokens"]), time.perf_counter() - started, cpu_seconds(self.pids) - cpu

    def stop(self) -> None:
        if self.process.poll() is None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def in_process_worker(model_dir: Path) -> int:
    """Answer JSON lines on stdin ({"prompts": [...], "tokens": N, "temperature": T}): each prompt
    in turn, rendered with the model's chat template, through `mlx_vlm.stream_generate`; one JSON
    line ({"tokens": output tokens}) each on stdout."""
    import mlx.core as mx
    from mlx_vlm import load, stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template

    model, processor = load(str(model_dir))
    if mx.default_device() == mx.cpu:
        model.set_dtype(mx.float32)  # as the engine's --dtype auto (already float32 here)

    def run(prompts: Sequence[str], max_tokens: int, temperature: float) -> int:
        tokens = 0
        for text in prompts:
            rendered = apply_chat_template(processor, model.config, text, num_images=0)
            *_, last = stream_generate(
                model, processor, rendered, max_tokens=max_tokens, temperature=temperature
            )
            tokens += int(last.generation_tokens)
        return tokens

    run([prompt(0)], 4, 0.0)  # warm-up
    for line in sys.stdin:
        answer: dict[str, Any] = {"ready": True}
        if line.strip() != "ready":
            asked = json.loads(line)
            answer = {"tokens": run(asked["prompts"], int(asked["tokens"]), float(asked["temperature"]))}
        print(json.dumps(answer), flush=True)
    return 0


def plot(results: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for name, target in results["targets"].items():
        xs = sorted(int(c) for c in target["curve"])
        left.plot(xs, [target["curve"][c]["tok_s"] for c in xs], marker="o", label=name)
        if target["agent_ttft_s"]:
            right.plot(range(1, 6), target["agent_ttft_s"], marker="o", label=name)
    left.axhline(
        results["in_process_sequential_tok_s"], linestyle="--", color="grey", label="in-process, sequential"
    )
    left.set(
        xscale="log", xlabel="concurrent requests", ylabel="output tok/s (all requests)", title="Throughput"
    )
    left.set_xticks(xs, [str(x) for x in xs])
    right.set(xlabel="turn", ylabel="TTFT (s)", title="Agent loop: +1 448x448 screenshot per turn")
    for axis in (left, right):
        axis.grid(alpha=0.3)
        axis.legend()
    figure.suptitle(f"{results['model']}, {results['tokens']} tokens per request")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--tokens", type=int, default=32, help="output tokens per request")
    parser.add_argument("--sequential", type=int, default=3, help="requests in the sequential run")
    parser.add_argument("--rounds", type=int, default=2, help="alternating rounds of the throughput runs")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--long-tokens", type=int, default=8192, help="the long prompt's size (about)")
    parser.add_argument("--long-head-start", type=float, default=2.0, help="seconds before the short request")
    parser.add_argument(
        "--scenarios",
        nargs="*",
        default=["agent", "prefill", "memory", "shared"],
        choices=["agent", "prefill", "memory", "shared"],
    )
    parser.add_argument(
        "--shared-tokens", type=int, default=1024, help="the shared system prompt's size (about)"
    )
    parser.add_argument(
        "--targets",
        nargs="+",
        default=["vlmserve", "mlx-vlm-server"],
        choices=["vlmserve", "mlx-vlm-server", "mlx-vlm-server-apc"],
    )
    parser.add_argument(
        "--prefill-targets",
        nargs="+",
        default=["vlmserve"],
        help="targets of the long-prefill scenario (minutes each on a loaded CPU)",
    )
    parser.add_argument("--engine-arg", action="append", default=[], help="extra vlmserve-engine argument")
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    parser.add_argument("--in-process-worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--plot", type=Path, help="PNG plot")
    args = parser.parse_args(argv)

    if args.in_process_worker is not None:
        return in_process_worker(args.in_process_worker)
    model_dir, parameters = build_bench_model(args.model_dir)
    results: dict[str, Any] = {
        "model": f"random qwen2_vl, {parameters / 1e6:.0f}M parameters, float32",
        "tokens": args.tokens,
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_at_start": os.getloadavg()[0],
        "targets": {},
    }
    with tempfile.TemporaryDirectory() as tmp:
        logs = Path(tmp)
        targets = [start_target(name, model_dir, logs, args) for name in args.targets]
        in_process = InProcess(model_dir)
        try:
            measured = asyncio.run(measure_all(targets, args, in_process))
        finally:
            in_process.stop()
            for target in targets:
                target.stop()
        alone = measured.pop(in_process.name).sequential
        results["in_process_sequential_tok_s"] = alone.tok_s
        results["in_process_sequential_tok_per_cpu_s"] = alone.tok_per_cpu_s
        results["in_process_sequential_rounds"] = alone.rounds
        if "memory" in args.scenarios:
            for name in args.targets:  # each alone and fresh: the peak is this scenario's
                target = start_target(name, model_dir, logs, args)
                try:
                    asyncio.run(measure_memory(target, measured[name]))
                finally:
                    target.stop()
        results["targets"] = {name: asdict(result) for name, result in measured.items()}
    ours = results["targets"].get("vlmserve")
    if ours:
        eight = ours["curve"].get(8, {"tok_s": 0.0, "tok_per_cpu_s": 0.0})
        summary: dict[str, float] = {
            "sequential_vs_in_process": ours["sequential"]["tok_s"] / results["in_process_sequential_tok_s"],
            "sequential_vs_in_process_per_cpu_s": ours["sequential"]["tok_per_cpu_s"]
            / results["in_process_sequential_tok_per_cpu_s"],
            "eight_concurrent_vs_our_sequential": eight["tok_s"] / ours["sequential"]["tok_s"],
            "eight_concurrent_vs_our_sequential_per_cpu_s": eight["tok_per_cpu_s"]
            / ours["sequential"]["tok_per_cpu_s"],
        }
        for name, theirs in results["targets"].items():
            key = name.replace("-", "_")
            if name == "vlmserve":
                continue
            if 8 in theirs["curve"]:
                summary[f"eight_concurrent_vs_{key}"] = eight["tok_s"] / theirs["curve"][8]["tok_s"]
                summary[f"eight_concurrent_vs_{key}_per_cpu_s"] = (
                    eight["tok_per_cpu_s"] / theirs["curve"][8]["tok_per_cpu_s"]
                )
            if theirs["shared_prompt"]["rounds"]:
                summary[f"shared_prompt_vs_{key}"] = (
                    ours["shared_prompt"]["tok_s"] / theirs["shared_prompt"]["tok_s"]
                )
        if ours["agent_ttft_s"]:
            summary["agent_turn5_vs_turn1_ttft"] = ours["agent_ttft_s"][-1] / ours["agent_ttft_s"][0]
        if ours["short_ttft_idle_s"]:
            summary["short_ttft_during_prefill_vs_idle"] = (
                ours["short_ttft_during_prefill_s"] / ours["short_ttft_idle_s"]
            )
        results["summary"] = summary
        print(json.dumps(summary, indent=2))
    results["load_average_at_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    if args.plot is not None:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
