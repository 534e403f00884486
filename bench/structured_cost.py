"""What a grammar costs: the same decode with and without a json_schema, in ways that load on a
shared machine does not distort.

Two measurements (`--out` writes either as JSON):

- `engine`: an engine in this process on `--model` (default: the 144M float32 benchmark model,
  built into /tmp when missing; its random weights never stop by themselves, so both sides decode
  the whole budget) takes pairs of requests over loopback gRPC: plain text, then the same with a
  strict `response_format` json_schema (the order swaps every pair); the plain one carries the
  engine's schema instruction itself, so both prompts are the same. Per request: the process's
  CPU time (utime + stime, every thread) per generated token, and the engine's decode tok/s.
  Reported: the median of the per-pair ratios json_schema / plain with their quartiles. CPU time
  is work done, which other processes' load hardly changes; wall-clock rates are kept for
  reference only (under load they swing by more than the effect).

- `callgrind`: instructions, counted by valgrind's callgrind (repeatable whatever else runs), of
  decode steps of the same model run directly (forward, the engine's grammar processor when
  constrained, greedy pick), plain vs constrained. Only the steps are counted (instrumentation is
  switched on around them through callgrind's client requests, from a tiny C helper compiled
  with gcc at run time), after warm-up steps. Needs valgrind, gcc and valgrind's headers.

Run as the engine is deployed: OpenBLAS preloaded (one thread: idle BLAS threads spin, which
adds CPU time in proportion to wall time, i.e. to load):

    export LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1
    python bench/structured_cost.py engine --pairs 12 --out bench/results/structured-cost-engine.json
    python bench/structured_cost.py callgrind --steps 40 --out bench/results/structured-cost-callgrind.json

(`steps` is what `callgrind` runs under valgrind; it can be run alone to try it.)
"""

from __future__ import annotations

import argparse
import asyncio
import ctypes
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "rating": {"enum": ["good", "bad"]},
    },
    "required": ["title", "year", "tags", "rating"],
    "additionalProperties": False,
}
SIDES = ("plain", "json_schema")


def _response_format() -> Any:
    from vlmserve.engine.v1 import engine_pb2 as pb

    return pb.ResponseFormat(
        json_schema=pb.JsonSchemaFormat(name="film", schema_json=json.dumps(SCHEMA), strict=True)
    )


def _default_model() -> str:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from bench.bench_model import build_bench_model

    path, _ = build_bench_model()
    return str(path)


def _quartiles(values: list[float]) -> dict[str, float]:
    low, mid, high = statistics.quantiles(values, n=4) if len(values) > 1 else (values[0],) * 3
    return {"q1": round(low, 3), "median": round(mid, 3), "q3": round(high, 3)}


def _blas() -> str:
    """Which BLAS mlx runs on: the deployed engine preloads OpenBLAS (see the Makefile)."""
    maps = Path("/proc/self/maps").read_text(errors="replace") if Path("/proc/self/maps").exists() else ""
    blas = "openblas" if "openblas" in maps.lower() else "mlx's bundled reference BLAS"
    threads = os.environ.get("OPENBLAS_NUM_THREADS")
    return f"{blas}, OPENBLAS_NUM_THREADS={threads}" if threads else blas


def _cpu_seconds() -> float:
    """This process's utime + stime (every thread), as /proc/self/stat has them."""
    times = os.times()
    return times.user + times.system


# -- engine: CPU time per token over loopback gRPC ---------------------------------------------


def _request(max_tokens: int, *, structured: bool) -> Any:
    from vlmserve.engine.prep.prompt import _format_instruction
    from vlmserve.engine.v1 import engine_pb2 as pb

    messages = [pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="Describe a film."))])]
    if not structured:
        # The instruction the engine adds for the json_schema, written by hand: the same prompt,
        # so the sides differ only in the grammar (not in prefill).
        instruction = _format_instruction(_response_format())
        messages.insert(
            0, pb.Message(role=pb.ROLE_SYSTEM, parts=[pb.Part(text=pb.TextPart(text=instruction))])
        )
    generate = pb.GenerateRequest(
        messages=messages, sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    )
    if structured:
        generate.response_format.CopyFrom(_response_format())
    return generate


async def measure_engine(model: str, pairs: int, max_tokens: int) -> dict[str, Any]:
    import grpc

    from vlmserve.engine.config import EngineConfig
    from vlmserve.engine.rpc.server import EngineServer
    from vlmserve.engine.v1 import engine_pb2 as pb
    from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

    server = EngineServer(EngineConfig(model=model, max_output_tokens=max_tokens, max_active=1))
    address = await server.start("127.0.0.1:0")
    server.load()
    await server.wait_loaded()
    cpu_ms: dict[str, list[float]] = {side: [] for side in SIDES}
    rates: dict[str, list[float]] = {side: [] for side in SIDES}
    tokens: dict[str, list[int]] = {side: [] for side in SIDES}
    prompts: dict[str, int] = {}
    cached: dict[str, int] = {}  # the last request's prefix-cache hit (the prompt is the same)
    load_before = os.getloadavg()[0]
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.EngineServiceStub(channel)
            for index in range(pairs + 1):  # the first pair warms up and is not counted
                for side in SIDES if index % 2 == 0 else SIDES[::-1]:
                    started = _cpu_seconds()
                    reply = await stub.GenerateUnary(
                        pb.GenerateUnaryRequest(request=_request(max_tokens, structured=side != "plain"))
                    )
                    spent = _cpu_seconds() - started
                    result = reply.result
                    if side != "plain":
                        json.loads(result.text)  # the point of the grammar: it always parses
                    prompts[side] = result.usage.input_tokens
                    cached[side] = result.usage.cached_tokens
                    if index > 0:
                        cpu_ms[side].append(1000 * spent / result.usage.output_tokens)
                        rates[side].append(result.timings.decode_tokens_per_second)
                        tokens[side].append(result.usage.output_tokens)
    finally:
        await server.shutdown(grace_seconds=1)
    assert prompts["plain"] == prompts["json_schema"], prompts  # one prompt, with or without a grammar
    cpu_ratios = [s / p for p, s in zip(cpu_ms["plain"], cpu_ms["json_schema"], strict=True)]
    rate_ratios = [s / p for p, s in zip(rates["plain"], rates["json_schema"], strict=True)]
    return {
        "method": "engine: process CPU time (utime+stime) per generated token, alternating pairs",
        "model": Path(model).name,
        "blas": _blas(),
        "pairs": pairs,
        "max_tokens": max_tokens,
        "load_average_1m": {"before": round(load_before, 1), "after": round(os.getloadavg()[0], 1)},
        "cpu_ms_per_token": {side: _quartiles(values) for side, values in cpu_ms.items()},
        "cpu_ratio_json_schema_over_plain": _quartiles(cpu_ratios),
        "cpu_ratio_per_pair": [round(r, 3) for r in cpu_ratios],
        "decode_tok_s": {side: _quartiles(values) for side, values in rates.items()},
        "tok_s_ratio_json_schema_over_plain": _quartiles(rate_ratios),
        "prompt_tokens": prompts["plain"],
        "last_cached_tokens": cached,
        "median_output_tokens": {side: statistics.median(counts) for side, counts in tokens.items()},
    }


# -- steps: decode steps run directly (what callgrind counts) ----------------------------------


def _instrumentation() -> tuple[Any, Any]:
    """(start, stop) callgrind client requests; no-ops when no helper library is given."""
    library = os.environ.get("STRUCTURED_COST_CG_LIB")
    if not library:
        return (lambda: None), (lambda: None)
    helper = ctypes.CDLL(library)
    return helper.cg_start, helper.cg_stop


def run_steps(model_path: str, *, steps: int, warmup: int, structured: bool, budget: int) -> dict[str, Any]:
    """Prefill a short prompt, then `warmup` + `steps` greedy decode steps, as the engine takes
    them: the processor sees the ids so far (an array rebuilt each step, as decode.py does) and
    masks the logits before the pick. Only the last `steps` are instrumented (fewer when EOS comes
    first: the engine would stop there)."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache
    from mlx_vlm.utils import load

    from vlmserve.engine.grammar.compiler import GrammarCompiler, constraint_for
    from vlmserve.engine.grammar.processor import GrammarLogitsProcessor

    model, processor = load(model_path)
    tokenizer = getattr(processor, "tokenizer", processor)
    eos = frozenset([int(tokenizer.eos_token_id)])
    grammar_processor = None
    if structured:
        compiler = GrammarCompiler(tokenizer, eos)
        constraint = constraint_for(
            compiler,
            tool_call_format="",
            tools=[],
            tool_mode="none",
            forced_name=None,
            parallel_tool_calls=False,
            max_tool_calls=None,
            response_format=_response_format(),
        )
        assert constraint is not None
        grammar_processor = GrammarLogitsProcessor(
            constraint.grammar, compiler.tokenizer, eos_token_ids=eos, max_new_tokens=budget
        )
    language_model = model.language_model
    prompt = tokenizer.encode("Describe a film in JSON.")
    cache = make_prompt_cache(language_model)
    logits = language_model(mx.array([prompt]), cache=cache).logits[:, -1, :]
    generated: list[int] = []
    start, stop = _instrumentation()

    def step(logits: Any) -> Any:
        if grammar_processor is not None:
            logits = grammar_processor(mx.array([*prompt, *generated], dtype=mx.int32), logits)
        token = int(mx.argmax(logits, axis=-1).item())
        generated.append(token)
        next_logits = language_model(mx.array([[token]]), cache=cache).logits[:, -1, :]
        mx.eval(next_logits)
        return next_logits

    for _ in range(warmup):
        logits = step(logits)
    start()
    measured = 0
    while measured < steps and not (generated and generated[-1] in eos):  # the engine stops at EOS too
        logits = step(logits)
        measured += 1
    stop()
    return {"steps": measured, "warmup": warmup, "structured": structured, "tokens": generated}


# -- callgrind: instructions per decode step --------------------------------------------------

_HELPER_C = """
#include <valgrind/callgrind.h>
void cg_start(void) { CALLGRIND_ZERO_STATS; CALLGRIND_START_INSTRUMENTATION; }
void cg_stop(void) { CALLGRIND_STOP_INSTRUMENTATION; CALLGRIND_DUMP_STATS_AT("steps"); }
"""


def _instructions(out_prefix: Path) -> int:
    """Ir of the dump taken at cg_stop (the file whose `desc: Trigger:` line names it)."""
    for dump in sorted(out_prefix.parent.glob(out_prefix.name + "*")):
        text = dump.read_text(errors="replace")
        if re.search(r"^desc: Trigger: Client Request: steps", text, re.M):
            found = re.search(r"^totals: (\d+)", text, re.M)
            if found:
                return int(found.group(1))
    raise RuntimeError(f"no callgrind dump with the measured steps under {out_prefix}*")


def measure_callgrind(model: str, steps: int, warmup: int, budget: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="structured-cost-") as scratch:
        folder = Path(scratch)
        (folder / "helper.c").write_text(_HELPER_C)
        library = folder / "helper.so"
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O1", "-o", str(library), str(folder / "helper.c")], check=True
        )
        env = {**os.environ, "STRUCTURED_COST_CG_LIB": str(library), "PYTHONHASHSEED": "0"}
        runs: dict[str, subprocess.Popen[str]] = {}
        for side in SIDES:  # both at once: callgrind runs a program on one core, ~50x slower
            command = [
                "valgrind",
                "--tool=callgrind",
                "--quiet",
                "--instr-atstart=no",
                f"--callgrind-out-file={folder / f'cg-{side}'}.%p",
                sys.executable,
                __file__,
                "steps",
                "--model",
                model,
                "--steps",
                str(steps),
                "--warmup",
                str(warmup),
                "--budget",
                str(budget),
                *(["--structured"] if side != "plain" else []),
            ]
            runs[side] = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, text=True)
        figures: dict[str, Any] = {}
        for side, process in runs.items():
            stdout, _ = process.communicate()
            if process.returncode != 0:
                raise RuntimeError(f"callgrind run of the {side} side failed ({process.returncode})")
            run = json.loads(stdout.strip().splitlines()[-1])
            figures[side] = {
                "instructions_per_step": round(_instructions(folder / f"cg-{side}") / run["steps"]),
                "steps": run["steps"],
                "tokens": run["tokens"],
            }
    plain, structured = (
        figures["plain"]["instructions_per_step"],
        figures["json_schema"]["instructions_per_step"],
    )
    return {
        "method": "callgrind: instructions of decode steps (forward + grammar processor + greedy pick)",
        "model": Path(model).name,
        "blas": _blas(),
        "steps": {side: figures[side]["steps"] for side in SIDES},
        "warmup": warmup,
        "processor_budget": budget,
        "instructions_per_step": {"plain": plain, "json_schema": structured},
        "grammar_instructions_per_step": structured - plain,
        "ratio_json_schema_over_plain": round(structured / plain, 4),
        "json_schema_tokens": figures["json_schema"]["tokens"],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    modes = parser.add_subparsers(dest="mode", required=True)
    engine = modes.add_parser("engine", help="CPU time per token over loopback gRPC, alternating pairs")
    engine.add_argument("--pairs", type=int, default=12)
    engine.add_argument("--max-tokens", type=int, default=64)
    grind = modes.add_parser("callgrind", help="instructions per decode step under callgrind")
    steps = modes.add_parser("steps", help="decode steps run directly (what callgrind runs)")
    steps.add_argument("--structured", action="store_true")
    for sub in (grind, steps):
        sub.add_argument("--steps", type=int, default=40)
        sub.add_argument("--warmup", type=int, default=2)
        sub.add_argument(
            "--budget",
            type=int,
            help="the processor's max_new_tokens (default: warmup + steps, as one request)",
        )
    for sub in (engine, grind, steps):
        sub.add_argument("--model", help="default: the 144M benchmark model (bench/bench_model.py)")
        sub.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    model = args.model or _default_model()
    if args.mode != "engine" and args.budget is None:
        args.budget = args.warmup + args.steps
    if args.mode == "engine":
        figures = asyncio.run(measure_engine(model, args.pairs, args.max_tokens))
    elif args.mode == "callgrind":
        figures = measure_callgrind(model, args.steps, args.warmup, args.budget)
    else:
        started = time.process_time()
        figures = run_steps(
            model, steps=args.steps, warmup=args.warmup, structured=args.structured, budget=args.budget
        )
        figures["cpu_seconds"] = round(time.process_time() - started, 3)
        print(json.dumps(figures))
        return 0
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
