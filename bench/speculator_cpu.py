"""What the speculator costs the generation thread a step (issue 37.1), without a model: its
per-step work at `--rows` rows (the step gate, shadow looks, lookup feeds and proposals, draft
widths, each verify's bookkeeping), the rows scripted and the step costs fed as the verifier's
clock would feed them.

    python -m bench.speculator_cpu [--rows 16] [--steps 3000] [--repeats 3] [--out FILE.json]

At 16 rows on this CPU the copying fixture's decode step takes ~3 ms and the speculator's work
runs on the same two cores, so each 30 us here is ~1 % of throughput. The rows' token streams
and the costs are fixed by a seed, so two checkouts make the same decisions (the verify steps
are reported beside the time: equal counts, a like-for-like comparison). Scenarios:

- copy, verify cheap: every row copies a passage of its prompt; a verify costs 1.02x a plain
  step per position (a memory-bound accelerator): verifies win;
- copy, verify dear: the same rows, a verify 1.6x per position (this CPU at 16 rows): plain
  steps win until the rows' rates climb;
- nothing: random text, verify dear: lookup finds nothing, plain steps and quiet steps.

Each row asks for 48-80 tokens, so rows leave and join at different steps as in a busy server.
Reported: the thread CPU per step (the best of `--repeats`), and the verify steps.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from vlmserve.engine.speculation.drafter import Speculator

# Token ids drawn from (a real vocabulary's size) and a prompt's length around the copied passage.
_VOCAB = 150_000
_PASSAGE = 40
_NOISE = 60
# Seconds a plain step of the batch costs; a verify of width w costs it x (1 + per_position x w).
_PLAIN_SECONDS = 0.003
SCENARIOS = {
    "copy, verify cheap": ("copy", 0.02),
    "copy, verify dear": ("copy", 0.6),
    "nothing": ("nothing", 0.6),
}


@dataclass(eq=False)
class ScriptedRow:
    """A DraftingRow whose tokens come from a script: `truth` is what it takes, `flight` the
    token in flight (taken, not yet in `generated`)."""

    prompt: list[int]
    truth: list[int]
    max_tokens: int
    generated: list[int] = field(default_factory=list)
    flight: int = 0
    can_draft: bool = True
    constrained: bool = False
    greedy: bool = True

    @property
    def key(self) -> ScriptedRow:
        return self

    @property
    def context_tokens(self) -> tuple[list[int], list[int]]:
        return self.prompt, self.generated

    @property
    def tokens_left(self) -> int:
        return max(0, self.max_tokens - len(self.generated) - 1)

    def forced_tokens(self, pending: Sequence[int]) -> list[int]:
        return []

    def take_prompt_hidden(self) -> None:
        return None


def new_row(rng: random.Random, workload: str) -> ScriptedRow:
    passage = [rng.randrange(_VOCAB) for _ in range(_PASSAGE)]
    noise = [rng.randrange(_VOCAB) for _ in range(_NOISE)]
    max_tokens = rng.randrange(48, 81)
    truth = passage * 3 if workload == "copy" else [rng.randrange(_VOCAB) for _ in range(max_tokens + 1)]
    row = ScriptedRow(noise[: _NOISE // 2] + passage + noise[_NOISE // 2 :], truth, max_tokens)
    row.flight = truth[0]
    return row


def simulate(workload: str, per_position: float, rows: int, steps: int, seed: int) -> tuple[float, int]:
    """(thread CPU seconds a step in the speculator, verify steps) over `steps` steps."""
    rng = random.Random(seed)
    speculator = Speculator()
    costs = speculator.costs
    assert costs is not None
    batch = [new_row(rng, workload) for _ in range(rows)]
    spent, verifies = 0.0, 0
    for _ in range(steps):
        started = time.thread_time()
        verifying = speculator.speculates(batch)
        drafts = speculator.drafts(batch, [[row.flight] for row in batch]) if verifying else [[]] * rows
        spent += time.thread_time() - started
        verifies += verifying
        width = 1 + max(map(len, drafts)) if verifying else 0
        costs.observe(rows, width, _PLAIN_SECONDS * (1 + per_position * width))
        for index, row in enumerate(batch):
            taken = len(row.generated)
            row.generated.append(row.flight)
            if verifying:
                drafted = drafts[index]
                truth = row.truth[taken + 1 : taken + 1 + len(drafted)]
                accepted = next(
                    (i for i, (d, t) in enumerate(zip(drafted, truth, strict=False)) if d != t), len(truth)
                )
                started = time.thread_time()
                speculator.record(row, len(drafted), accepted)
                spent += time.thread_time() - started
                row.generated.extend(truth[:accepted])
            if len(row.generated) >= row.max_tokens:
                started = time.thread_time()
                speculator.forget(row)
                spent += time.thread_time() - started
                batch[index] = new_row(rng, workload)
            else:
                row.flight = row.truth[len(row.generated)]
    return spent / steps, verifies


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--steps", type=int, default=3000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None, help="the figures as JSON")
    args = parser.parse_args(argv)
    results = []
    for name, (workload, per_position) in SCENARIOS.items():
        runs = [simulate(workload, per_position, args.rows, args.steps, seed=0) for _ in range(args.repeats)]
        best = min(seconds for seconds, _ in runs)
        results.append(
            {"scenario": name, "rows": args.rows, "us_per_step": 1e6 * best, "verify_steps": runs[0][1]}
        )
        print(f"{name}: {1e6 * best:.1f} us a step, {runs[0][1]} verify steps of {args.steps}", flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
