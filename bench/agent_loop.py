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
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

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


def system_prompt(words: int) -> pb.Message:
    rules = " ".join(
        f"Rule {i}: keep the window {i % 7} in view and report what moved." for i in range(words // 12)
    )
    return pb.Message(role=pb.ROLE_SYSTEM, parts=[text("You operate a computer. " + rules)])


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--families", nargs="+", default=["qwen3_5", "gemma3", "gemma4"])
    parser.add_argument("--turns", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--system-words", type=int, default=700)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = Path(tempfile.mkdtemp(prefix="agent-loop-"))
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
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
