"""The copying model answering by real greedy generation (`mlx_vlm.generate` on the model as
`mlx_vlm.load` reads it): what tests/e2e/test_copying_model.py asserts and what
`python -m training.copying_eval` prints for a trained model."""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.copying import CopyCase, copy_case

MODEL_DIR = Path(__file__).resolve().parent.parent / "models" / "qwen2-vl-copying"
HELD_OUT_SEED = 777_000  # neither training (seed 0's stream), its eval (424_242) nor the bench (900_000+)


def held_out_cases(count: int, seed: int = HELD_OUT_SEED, unchanged: float = 0.0) -> list[CopyCase]:
    """Edit cases, or with `unchanged` 1.0 pure copies (training/copying.py's copy_case)."""
    return [copy_case(random.Random(seed + i), unchanged) for i in range(count)]


def greedy_answer(model: Any, processor: Any, prompt: str, max_tokens: int = 160) -> str:
    """The model's reply to `prompt` as the user turn (default system prompt), greedy."""
    from mlx_vlm.generate.dispatch import generate

    rendered = processor.tokenizer.apply_chat_template(
        [{"role": "user", "content": prompt}], tokenize=False, add_generation_prompt=True
    )
    result = generate(model, processor, rendered, max_tokens=max_tokens, temperature=0.0, verbose=False)
    return str(result.text)


@dataclass(frozen=True)
class Scores:
    exact: float  # share of cases answered exactly
    lines: float  # share of the answers' lines exactly right (in place)
    misses: list[tuple[str, str]]  # (wanted, got) of the cases not exact


def score(model: Any, processor: Any, cases: Sequence[CopyCase]) -> Scores:
    misses: list[tuple[str, str]] = []
    right_lines = total_lines = 0
    for case in cases:
        got = greedy_answer(model, processor, case.prompt).strip()
        wanted_lines, got_lines = case.answer.splitlines(), got.splitlines()
        total_lines += len(wanted_lines)
        right_lines += sum(w == g for w, g in zip(wanted_lines, got_lines, strict=False))
        if got != case.answer:
            misses.append((case.answer, got))
    return Scores(1 - len(misses) / len(cases), right_lines / max(total_lines, 1), misses)


def main(argv: Sequence[str] | None = None) -> None:
    from mlx_vlm.utils import load

    parser = argparse.ArgumentParser(description="Greedy exact copies of held-out cases.", allow_abbrev=False)
    parser.add_argument("--model", type=Path, default=MODEL_DIR)
    parser.add_argument("--cases", type=int, default=50)
    parser.add_argument("--unchanged", type=float, default=0.0, help="share of pure copies (1.0: only)")
    args = parser.parse_args(argv)
    model, processor = load(str(args.model))
    scores = score(model, processor, held_out_cases(args.cases, unchanged=args.unchanged))
    print(f"exact {scores.exact:.2f} lines {scores.lines:.2f} over {args.cases} held-out cases")
    for wanted, got in scores.misses[:3]:
        print(f"--- wanted\n{wanted}\n--- got\n{got}")


if __name__ == "__main__":
    main()
