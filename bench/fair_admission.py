"""Another tenant's wait behind one tenant's backlog under a memory budget (issue 39.5;
docs/hardening.md, round 4).

One engine (in this process, the fixture model; KV 1,536 bytes a token) with
`--memory-budget-mib 8`: tenant a sends six requests of ~4,096 prompt tokens (each fits the
budget only alone), then tenant b sends a 2-token request. Reports b's wait from its submit to
its end, and the same request alone on the idle engine.

    nice -n 10 .venv/bin/python bench/fair_admission.py --out bench/results/fair-admission.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

from tests._fixture_models import RANDOM_MODEL_PATH  # noqa: E402
from vlmserve.engine.config import EngineConfig  # noqa: E402
from vlmserve.engine.jobs import Job, JobKind  # noqa: E402
from vlmserve.engine.loop.generator import Generator  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402


def job(generator: Generator, request_id: str, partition: str, text: str, max_tokens: int) -> Job:
    assert generator.preparer is not None
    request = pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=text))])],
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )
    ready = generator.preparer.prepare(request, kind=JobKind.GENERATE)
    return Job(dataclasses.replace(ready, request_id=request_id, partition_key=partition), None)


def finished_in(generator: Generator, target: Job, timeout: float = 600) -> float:
    started = time.perf_counter()
    generator.submit(target)
    deadline = started + timeout
    while not target.done.is_set() and time.perf_counter() < deadline:
        target.done.wait(0.01)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--budget-mib", type=int, default=8)
    parser.add_argument("--backlog", type=int, default=6)
    parser.add_argument("--prompt-tokens", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    generator = Generator(
        EngineConfig(
            model=str(RANDOM_MODEL_PATH),
            warmup=False,
            memory_budget_mib=args.budget_mib,
            prefix_cache_min_tokens=0,
            max_active=16,
            max_output_tokens=512,
        )
    )
    generator.start()
    assert generator.ready.wait(120), generator.load_error
    try:
        # Words of the prompt, scaled once so a backlog request is about --prompt-tokens long.
        sample = job(generator, "sample", "tenant-a", " ".join(["apple"] * 1000), 1)
        count = int(1000 * args.prompt_tokens / len(sample.request.prompt_ids))
        words = " ".join(["apple"] * count)
        probe = job(generator, "b-alone", "tenant-b", "Hi", 2)
        alone = finished_in(generator, probe)
        backlog = [
            job(generator, f"a{i}", "tenant-a", f"{i} {words}", args.max_tokens) for i in range(args.backlog)
        ]
        tokens = len(backlog[0].request.prompt_ids)
        for item in backlog:
            generator.submit(item)
        time.sleep(0.05)
        behind = finished_in(generator, job(generator, "b", "tenant-b", "Hi", 2))
        assert generator.wait_idle(1200)
        order = [report.request_id for report in generator.reports if report.request_id != "b-alone"]
    finally:
        generator.stop()
    result = {
        "budget_mib": args.budget_mib,
        "backlog": args.backlog,
        "backlog_prompt_tokens": tokens,
        "b_alone_s": round(alone, 3),
        "b_behind_backlog_s": round(behind, 3),
        "finish_order": order,
    }
    print(json.dumps(result, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
