"""A row's token draw: how its next tokens are chosen from the target's logits (generation thread
only).

A row (decode.py) gets its draw when the prompt batch (prompt_batch.py) prepares it, which draws
its first token with it after its prompt ran; then the row hands the draw to the decode batch
with its KV cache (batch_row.py `BatchRow`), which draws every later token. So a decode step flows
one way: the batch decides each row's tokens (the step's result, several per row after a
speculative verify) and the runner hands them to the rows; the batch never calls a row.

The draw holds the sampler (its own seeded streams), the logits processors (the grammar's), the ids
they and the repetition penalty look back on (the prompt, then the tokens drawn), and the logprob
score of the token just drawn, until its row takes it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from vlmserve.engine.grammar.processor import GrammarLogitsProcessor
from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.loop.logprobs import StepScores, score_rows
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.sampling import REPETITION_CONTEXT_TOKENS, TokenSampler
from vlmserve.engine.token_choice import choose_tokens

__all__ = ["LogitsProcessor", "Score", "TokenDraw", "sample_rows", "score_chosen"]

# In the mlx-lm convention `processor(tokens, logits) -> logits`: tokens = the ids so far, prompt
# then generated (1-D int32), logits shape (1, vocab); typed loosely (no MLX types here).
LogitsProcessor = Callable[[Any, Any], Any]

# A drawn token's logprob score: the step's scores and the row's index in them (read lazily, on
# accept, so the double-buffered step keeps its overlap).
Score = tuple[StepScores, int]


class TokenDraw:
    """One request's token choice. Not thread-safe."""

    def __init__(
        self, request: PreparedRequest, loaded: LoadedModel, prompt_ids: Sequence[int], max_tokens: int
    ) -> None:
        self.request = request
        self._loaded = loaded
        self.sampler = TokenSampler(request.settings, loaded.model.config)
        self.processors = self.new_logits_processors(max_tokens)
        self.prompt_ids = prompt_ids
        # The tokens drawn so far, in order (a row may stop before the last ones: it leaves then).
        self.generated: list[int] = []
        self.top_logprobs = request.settings.top_logprobs
        self._logprobs = request.settings.logprobs
        # The processors are made once: what the speculator asks of every row every step is
        # worked out here.
        self._grammar = next((p for p in self.processors if isinstance(p, GrammarLogitsProcessor)), None)
        self._can_draft = not self._logprobs and all(
            isinstance(p, GrammarLogitsProcessor) for p in self.processors
        )
        # Whether a token's logits change before it is drawn (processors, repetition penalty).
        self._processes = bool(self.processors) or self.sampler.penalizes
        # The logits the last token was drawn from, until scored; its score, until taken.
        self.scored_logits: Any = None
        self.score: Score | None = None

    def new_logits_processors(self, max_tokens: int) -> list[LogitsProcessor]:
        """This request's logits processors, fresh (they keep state), in the order applied."""
        constraint = self.request.constraint
        if constraint is None:
            return []
        return [
            GrammarLogitsProcessor(
                constraint.grammar,
                self._loaded.grammar.tokenizer,
                eos_token_ids=self._loaded.eos_token_ids,
                max_new_tokens=max_tokens,
                thinking_end_token_id=constraint.thinking_end_token_id,
            )
        ]

    def processed_logits(self, logits: Any, drafts: Sequence[int] = ()) -> Any:
        """The logits [1, vocab] a token is drawn from: the logits processors, then the repetition
        penalty, as of the tokens so far followed by `drafts` (a speculative verify judges each
        draft as if those before it had been drawn)."""
        import mlx.core as mx

        if self.processors:
            so_far = mx.array([*self.prompt_ids, *self.generated, *drafts], dtype=mx.int32)
            for processor in self.processors:
                logits = processor(so_far, logits)
        recent = [
            *self.prompt_ids[-REPETITION_CONTEXT_TOKENS:],
            *self.generated[-REPETITION_CONTEXT_TOKENS:],
            *drafts,
        ]
        return self.sampler.penalize(logits, recent)

    @property
    def processes(self) -> bool:
        """Whether a token's logits change before it is drawn (processors, repetition penalty)."""
        return self._processes

    @property
    def scored(self) -> bool:
        """Whether the request asked for logprobs (each drawn token is scored)."""
        return self._logprobs

    def sample(self, logits: Any) -> Any:
        """The next token (lazy array [1]) from the target's logits [1, vocab]."""
        return self.sampler.choose(self.drawn_from(logits))

    def drawn_from(self, logits: Any) -> Any:
        """The logits [1, vocab] this row's next token is drawn from (kept for its score when
        the request asked for logprobs)."""
        processed = self.processed_logits(logits) if self.processes else logits
        if self._logprobs:
            self.scored_logits = processed
        return processed

    def took(self, tokens: Sequence[int]) -> None:
        """These drawn tokens follow the ones so far."""
        self.generated.extend(tokens)

    def take_score(self) -> Score | None:
        score, self.score = self.score, None
        return score

    # -- speculative decoding -------------------------------------------------------------------

    @property
    def can_draft(self) -> bool:
        """Drafts can be verified: no logprobs (each verified position would need its own score)
        and no logits processors but the grammar's."""
        return self._can_draft

    @property
    def grammar(self) -> GrammarLogitsProcessor | None:
        return self._grammar

    def forced_tokens(self, pending: Sequence[int]) -> list[int]:
        """The tokens the grammar forces after the tokens so far and `pending` (grammar
        fast-forward); none without a grammar."""
        grammar = self.grammar
        if grammar is None:
            return []
        return grammar.forced_after([*self.prompt_ids, *self.generated, *pending])

    @property
    def grammar_failure(self) -> str | None:
        """Why the request's grammar could not be followed to its end, if it could not."""
        for processor in self.processors:
            failure = getattr(processor, "failure", None)  # GrammarLogitsProcessor's
            if isinstance(failure, str):
                return failure
        return None


def sample_rows(draws: Sequence[TokenDraw], logits: Any) -> Any:
    """Each draw's next token (lazy [rows]) from its row of the target's logits [rows, vocab]:
    the rows whose logits change first (processors, penalty) are processed one by one, then every
    row is chosen together (token_choice.py), each with its own settings and random streams."""
    import mlx.core as mx

    if any(draw.processes or draw.scored for draw in draws):
        rows = [draw.drawn_from(logits[index : index + 1]) for index, draw in enumerate(draws)]
        if any(draw.processes for draw in draws):
            logits = mx.concatenate(rows) if len(rows) > 1 else rows[0]
    return choose_tokens(logits, [draw.sampler for draw in draws])


def score_chosen(draws: Sequence[TokenDraw], tokens: Any) -> None:
    """Score the tokens just drawn ([rows] lazy ids, one per draw) for the draws whose requests
    asked for logprobs, in one batched op (not waited for); each row reads its score when it takes
    its token."""
    import mlx.core as mx

    wanted = [index for index, draw in enumerate(draws) if draw.scored_logits is not None]
    if not wanted:
        return
    chosen = tokens if len(wanted) == len(draws) else tokens[mx.array(wanted, dtype=mx.int32)]
    scores = score_rows(
        [draws[index].scored_logits for index in wanted],
        chosen,
        [draws[index].top_logprobs for index in wanted],
    )
    for row, index in enumerate(wanted):
        draws[index].scored_logits = None
        draws[index].score = (scores, row)
