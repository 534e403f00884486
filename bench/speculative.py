"""Speculative decoding (issue 21): the same requests with `--speculative off` and another mode
(`lookup` by default; `draft` or `auto` with `--draft-model`), side by side in one process,
alternating, on one model.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.speculative [--model DIR] [--speculative lookup|draft|auto] [--draft-model DIR]
            [--rounds 3] [--kv-bits 8|4 [--kv-quant-scheme turboquant]] [--out bench/results/speculative.json]

Two in-process engines (Generator: the generation loop, no gRPC) on the same weights; each
round runs every workload on one then the other (the order flips every round). Per workload and
engine: wall seconds, process CPU seconds (only one engine works at a time, so the process's CPU
time is that engine's: immune to other processes' time slicing), output tokens, and for the
speculative engine the drafts verified / accepted and accepted tokens per verify. The machine's
load average is recorded before and after. Workloads:

- copy: greedy, a prompt with a JSON record to return unchanged (the random bench model's
  greedy output loops, which prompt lookup predicts: an upper bound on acceptance);
- nothing: seeded sampling at temperature 1 (random text: nothing to copy, drafts rarely
  offered; measures what speculation costs when it cannot help);
- schema: a json_schema answer (grammar fast-forward drafts the forced keys and punctuation);
- tool: a forced tool call (tool_choice names the function): the call's opening, name and
  argument keys are forced, so fast-forward drafts them;
- concurrent8: 8 greedy requests with their own prompts, submitted together.
Default model: the 144M random bench model (bench/bench_model.py builds it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bench.bench_model import DEFAULT_DIR, build_bench_model
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind, PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.drafter import SOURCES
from vlmserve.engine.v1 import engine_pb2 as pb

RECORD = {"name": "alpha", "count": 42, "tags": ["x", "y"], "owner": {"id": 7, "role": "admin"}}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "count": {"type": "integer"},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"type": "string"}},
    },
    "required": ["name", "count", "ok", "tags"],
    "additionalProperties": False,
}

TOOL_PARAMETERS = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}


def start(
    model: str,
    speculative: str,
    max_tokens: int,
    draft_model: str | None = None,
    kv_bits: int | None = None,
    kv_quant_scheme: str = "uniform",
) -> Generator:
    config = EngineConfig(
        model=model,
        max_output_tokens=max_tokens,
        prefix_cache_min_tokens=0,
        speculative=speculative,
        draft_model=draft_model if speculative != "off" else None,
        kv_bits=kv_bits,
        kv_quant_scheme=kv_quant_scheme,
    )
    generator = Generator(config)
    generator.start()
    if not generator.ready.wait(600):
        raise RuntimeError(f"engine did not load: {generator.load_error}")
    return generator


def request(
    generator: Generator, text: str, *, temperature: float, seed: int, max_tokens: int, **fields: Any
) -> PreparedRequest:
    assert generator.preparer is not None
    return generator.preparer.prepare(
        pb.GenerateRequest(
            messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=text))])],
            sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed),
            **fields,
        ),
        kind=JobKind.GENERATE,
    )


def numbered_requests(
    generator: Generator, count: int, max_tokens: int, first: int = 0
) -> list[PreparedRequest]:
    """`count` greedy requests, each with a prompt of its own ("Request i: " and numbers), numbered
    from `first`."""
    return [
        request(
            generator,
            f"Request {i}: {' '.join(str(i * j) for j in range(12))}",
            temperature=0.0,
            seed=i,
            max_tokens=max_tokens,
        )
        for i in range(first, first + count)
    ]


def workloads(generator: Generator, max_tokens: int) -> dict[str, list[PreparedRequest]]:
    copy = f"Return this JSON unchanged: {json.dumps(RECORD)}"
    schema = pb.ResponseFormat(
        json_schema=pb.JsonSchemaFormat(name="r", schema_json=json.dumps(SCHEMA), strict=True)
    )
    return {
        "copy": [request(generator, copy, temperature=0.0, seed=0, max_tokens=max_tokens)],
        "nothing": [request(generator, "Tell me a story.", temperature=1.0, seed=1, max_tokens=max_tokens)],
        "schema": [
            request(
                generator,
                "Describe a record.",
                temperature=0.0,
                seed=2,
                max_tokens=max_tokens,
                response_format=schema,
            )
        ],
        "tool": [
            request(
                generator,
                "What is the weather in Paris?",
                temperature=0.0,
                seed=3,
                max_tokens=max_tokens,
                tools=[
                    pb.Tool(
                        function=pb.FunctionTool(
                            name="get_weather", parameters_json=json.dumps(TOOL_PARAMETERS), strict=True
                        )
                    )
                ],
                tool_choice=pb.ToolChoice(function_name="get_weather"),
            )
        ],
        "concurrent8": numbered_requests(generator, 8, max_tokens),
    }


def counter(generator: Generator, name: str, labels: dict[str, str] | None = None) -> float:
    value = generator.metrics.registry.get_sample_value(f"vlmserve_engine_{name}_total", labels or {})
    return value or 0.0


COUNTERS = ("speculative_drafted_tokens", "speculative_accepted_tokens", "speculative_verified_rows")


def speculation_counter(generator: Generator, name: str) -> float:
    """A speculation counter summed over its draft sources."""
    return sum(counter(generator, name, {"source": source}) for source in SOURCES)


def run(generator: Generator, requests: Sequence[PreparedRequest], tag: str) -> dict[str, float]:
    before = {name: speculation_counter(generator, name) for name in COUNTERS}
    verifies = counter(generator, "decode_forwards", {"kind": "verify"})
    plain = counter(generator, "decode_forwards", {"kind": "plain"})
    jobs = [Job(dataclasses.replace(r, request_id=f"{tag}-{i}"), None) for i, r in enumerate(requests)]
    cpu, wall = time.process_time(), time.perf_counter()
    for job in jobs:
        generator.submit(job)
    if not generator.wait_idle(1800):
        raise RuntimeError("timed out")
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    reports = {r.request_id: r for r in generator.reports}
    tokens = sum(reports[job.request_id].output_tokens for job in jobs)
    result = {"wall_s": wall, "cpu_s": cpu, "tokens": tokens}
    result.update({name: speculation_counter(generator, name) - before[name] for name in COUNTERS})
    result["verify_forwards"] = counter(generator, "decode_forwards", {"kind": "verify"}) - verifies
    result["plain_forwards"] = counter(generator, "decode_forwards", {"kind": "plain"}) - plain
    result["token_ids"] = [list(reports[job.request_id].token_ids) for job in jobs]  # type: ignore[assignment]
    return result


def summarise(runs: list[dict[str, Any]]) -> dict[str, float]:
    keys = ["wall_s", "cpu_s", "tokens", *COUNTERS, "verify_forwards", "plain_forwards"]
    total = {key: sum(r[key] for r in runs) for key in keys}
    total["tok_per_s"] = total["tokens"] / total["wall_s"]
    total["tok_per_cpu_s"] = total["tokens"] / total["cpu_s"]
    rows = total["speculative_verified_rows"]
    total["accepted_tokens_per_verify"] = (total["speculative_accepted_tokens"] / rows + 1) if rows else 0.0
    forwards = total["verify_forwards"] + total["plain_forwards"]
    total["forwards"] = forwards
    return total


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--speculative", choices=("lookup", "draft", "auto"), default="lookup")
    parser.add_argument("--draft-model", default=None, help="drafter for --speculative draft|auto")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument(
        "--workloads", nargs="+", default=["copy", "nothing", "schema", "tool", "concurrent8"]
    )
    parser.add_argument(
        "--kv-bits", type=int, choices=(4, 8), default=None, help="quantized KV (both engines)"
    )
    parser.add_argument("--kv-quant-scheme", choices=("uniform", "turboquant"), default="uniform")
    parser.add_argument("--out", type=Path, default=Path("bench/results/speculative.json"))
    args = parser.parse_args(argv)
    model = args.model if args.model is not None else build_bench_model(DEFAULT_DIR)[0]
    load_before = os.getloadavg()
    mode = args.speculative
    engines = {
        name: start(str(model), name, args.max_tokens, args.draft_model, args.kv_bits, args.kv_quant_scheme)
        for name in ("off", mode)
    }
    work = {
        name: r for name, r in workloads(engines["off"], args.max_tokens).items() if name in args.workloads
    }
    for name, generator in engines.items():  # warm up both (first forwards of each shape)
        run(generator, next(iter(work.values())), f"warm-{name}")
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {w: {e: [] for e in engines} for w in work}
    for round_index in tqdm(range(args.rounds), desc="rounds", disable=None, dynamic_ncols=True):
        order = list(engines) if round_index % 2 == 0 else list(reversed(engines))
        for workload, requests in work.items():
            for name in order:
                runs[workload][name].append(run(engines[name], requests, f"{workload}-{name}-{round_index}"))
                print(
                    workload,
                    name,
                    {k: round(v, 3) for k, v in runs[workload][name][-1].items() if k != "token_ids"},
                    flush=True,
                )
    results: dict[str, Any] = {
        "model": str(model),
        "speculative": mode,
        "draft_model": args.draft_model,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "kv_bits": args.kv_bits,
        "kv_quant_scheme": args.kv_quant_scheme,
    }
    for workload in work:
        off, on = summarise(runs[workload]["off"]), summarise(runs[workload][mode])
        same = all(
            a["token_ids"] == b["token_ids"]
            for a, b in zip(runs[workload]["off"], runs[workload][mode], strict=True)
        )
        results[workload] = {
            "off": off,
            mode: on,
            "speedup_wall": on["tok_per_s"] / off["tok_per_s"],
            "speedup_cpu": on["tok_per_cpu_s"] / off["tok_per_cpu_s"],
            "same_tokens": same,
        }
        print(
            workload,
            {
                k: (round(v, 3) if isinstance(v, float) else v)
                for k, v in results[workload].items()
                if k not in ("off", mode)
            },
        )
        print(
            f"   {mode} accepted tokens per verify",
            round(on["accepted_tokens_per_verify"], 2),
            "forwards",
            off["forwards"],
            "->",
            on["forwards"],
        )
    results["load_average"] = {"before": load_before, "after": os.getloadavg()}
    for generator in engines.values():
        generator.stop()
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("load average", results["load_average"])


if __name__ == "__main__":
    main()
