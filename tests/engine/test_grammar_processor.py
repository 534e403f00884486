"""The grammar as a logits processor (MLX, CPU): masks, the token budget, thinking, padded vocabularies.

Driven by random logits: a stand-in for a model that knows nothing, so every valid output is the
processor's doing.
"""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import mlx.core as mx
import numpy as np
import pytest
from transformers import AutoTokenizer

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.grammar.compiler import GrammarCompiler, OutputConstraint, constraint_for
from vlmserve.engine.grammar.processor import GrammarLogitsProcessor
from vlmserve.engine.toolcalls.registry import HERMES_FORMAT
from vlmserve.engine.v1 import engine_pb2 as pb

EOS = 8178
VOCAB = 8192
SCHEMA = {
    "type": "object",
    "properties": {
        "shapes": {"type": "array", "items": {"type": "string"}},
        "size": {"type": "object", "properties": {"w": {"type": "integer"}}, "required": ["w"]},
        "count": {"type": "integer"},
    },
    "required": ["shapes", "size", "count"],
    "additionalProperties": False,
}


@pytest.fixture(scope="module")
def tokenizer() -> Any:
    return AutoTokenizer.from_pretrained(str(RANDOM_MODEL_PATH))


@pytest.fixture(scope="module")
def compiler(tokenizer: Any) -> GrammarCompiler:
    return GrammarCompiler(tokenizer, [EOS])


def constraint(compiler: GrammarCompiler, *, tools: list[pb.Tool] | None = None) -> OutputConstraint:
    built = constraint_for(
        compiler,
        tool_call_format=HERMES_FORMAT,
        tools=tools or [],
        tool_mode="auto" if tools else "none",
        forced_name=None,
        parallel_tool_calls=True,
        max_tool_calls=None,
        response_format=pb.ResponseFormat(json_schema=pb.JsonSchemaFormat(schema_json=json.dumps(SCHEMA))),
    )
    assert built is not None
    return built


def accepting(processor: GrammarLogitsProcessor) -> bool:
    """The output so far is a complete sentence of the processor's grammar (its matcher says)."""
    return bool(processor._matcher.is_accepting())


def generate(
    processor: GrammarLogitsProcessor,
    steps: int,
    *,
    seed: int,
    vocab: int = VOCAB,
    prompt: list[int] | None = None,
) -> list[int]:
    """Greedy decoding of random logits through the processor, until EOS or `steps` tokens."""
    key = mx.random.key(seed)
    ids = mx.array(prompt or [1, 2, 3])
    out: list[int] = []
    for _ in range(steps):
        key, step_key = mx.random.split(key)
        logits = mx.random.normal((1, vocab), key=step_key)
        token = int(mx.argmax(processor(ids, logits), axis=-1).item())
        out.append(token)
        ids = mx.concatenate([ids, mx.array([token])])
        if token == EOS:
            break
    return out


@pytest.mark.parametrize("budget", [32, 48, 200])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_json_closes_within_the_budget(
    compiler: GrammarCompiler, tokenizer: Any, budget: int, seed: int
) -> None:
    processor = GrammarLogitsProcessor(
        constraint(compiler).grammar,
        compiler.tokenizer,
        eos_token_ids=frozenset([EOS]),
        max_new_tokens=budget,
    )
    out = generate(processor, budget, seed=seed)
    assert out[-1] == EOS and len(out) <= budget
    jsonschema.validate(json.loads(tokenizer.decode(out[:-1])), SCHEMA)


@pytest.mark.parametrize("seed", [0, 1, 2, 3])
def test_calls_or_json_close_within_the_budget(compiler: GrammarCompiler, tokenizer: Any, seed: int) -> None:
    tools = [pb.Tool(function=pb.FunctionTool(name="shell", parameters_json='{"type": "object"}'))]
    processor = GrammarLogitsProcessor(
        constraint(compiler, tools=tools).grammar,
        compiler.tokenizer,
        eos_token_ids=frozenset([EOS]),
        max_new_tokens=60,
    )
    out = generate(processor, 60, seed=seed)
    assert out[-1] == EOS
    assert accepting(processor)


def test_padded_vocabulary_rows_are_never_chosen(compiler: GrammarCompiler) -> None:
    processor = GrammarLogitsProcessor(
        constraint(compiler).grammar, compiler.tokenizer, eos_token_ids=frozenset([EOS]), max_new_tokens=50
    )
    logits = mx.zeros((1, VOCAB + 64))
    logits[:, VOCAB:] = 100.0  # the model's padding rows: no token, never allowed
    masked = processor(mx.array([1]), logits)
    assert masked.shape == (1, VOCAB + 64)
    assert bool(mx.all(mx.isinf(masked[:, VOCAB:])).item())
    assert int(mx.sum(~mx.isinf(masked)).item()) > 0


def test_constraint_starts_after_thinking_ends(compiler: GrammarCompiler, tokenizer: Any) -> None:
    end_think = tokenizer.encode("</tool_call>", add_special_tokens=False)[0]  # any single token will do
    processor = GrammarLogitsProcessor(
        constraint(compiler).grammar,
        compiler.tokenizer,
        eos_token_ids=frozenset([EOS]),
        max_new_tokens=100,
        thinking_end_token_id=end_think,
    )
    logits = mx.zeros((1, VOCAB))
    assert bool(mx.all(processor(mx.array([1]), logits) == 0).item())  # thinking: free
    thought = tokenizer.encode("hmm, let me think", add_special_tokens=False)
    ids = mx.array([1, *thought])
    assert bool(mx.all(processor(ids, logits) == 0).item())
    ids = mx.concatenate([ids, mx.array([end_think])])
    masked = processor(ids, logits)  # the answer: JSON only
    allowed = [i for i, value in enumerate(masked[0].tolist()) if value == 0]
    assert allowed and all(tokenizer.decode([i]).startswith("{") for i in allowed)


class _IdsReadOnlyThroughNumpy:
    """Ids with a size and numpy's buffer view only: an MLX op on them (a slice, `tolist`) would
    queue behind the forward in flight (batch.py's double buffering), so it must not be needed."""

    def __init__(self, ids: list[int]) -> None:
        self._ids = np.array(ids, dtype=np.int32)
        self.size = self._ids.size

    def __array__(self, dtype: Any = None, copy: Any = None) -> Any:
        return self._ids


def test_new_ids_are_read_without_an_mlx_op(compiler: GrammarCompiler, tokenizer: Any) -> None:
    grammar = constraint(compiler).grammar
    reads_through_numpy = GrammarLogitsProcessor(
        grammar, compiler.tokenizer, eos_token_ids=frozenset([EOS]), max_new_tokens=100
    )
    reference = GrammarLogitsProcessor(
        grammar, compiler.tokenizer, eos_token_ids=frozenset([EOS]), max_new_tokens=100
    )
    logits = mx.zeros((1, VOCAB))
    ids = [1, 2]  # the prompt: the first call only records where generation starts
    reads_through_numpy(_IdsReadOnlyThroughNumpy(ids), logits)
    reference(mx.array(ids), logits)
    for token in tokenizer.encode('{"shapes": ["a', add_special_tokens=False):
        ids.append(token)
        masked = reads_through_numpy(_IdsReadOnlyThroughNumpy(ids), logits)
        assert bool(mx.all(masked == reference(mx.array(ids), logits)).item())
    assert not accepting(reads_through_numpy)
