"""Token log probabilities: scored in one batched op per step, then aligned with the visible text.

Scoring (`score_rows`, generation thread): the rows of a decode step whose requests asked for
logprobs, stacked, get one log-softmax, the chosen tokens' values and the top-k alternatives
(`argpartition`, no full sort); rows that did not ask cost nothing. The logits are the ones the
token was drawn from after the grammar, the logits processors and the repetition penalty, before
temperature / top_p / top_k (so temperature leaves the numbers alone, as OpenAI's do, and under a
grammar only allowed tokens are listed: the masked ones are -inf and dropped).

Alignment (`LogprobTrace`, pure): each token adds some raw text (the detokenizer's piece: "" for
a token ending inside a multi-byte character, which the next one completes). The output stages
then hold back, drop (reasoning, markup, a stop sequence and what follows it) and pass on that
text; the assembler reports where in the raw text each visible piece came from, and a token is
listed with the visible part of its text once the visible text has passed its end. So the
listed tokens spell the visible text exactly, each token at most once.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["LogprobTrace", "StepScores", "TokenScore", "score_rows"]


@dataclass(frozen=True, slots=True)
class TokenScore:
    """One sampled token's logprob and the most likely alternatives (id, logprob), best first."""

    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class StepScores:
    """One step's scores for the rows that asked, computing on the device (started, not waited
    for, so a double-buffered decode keeps its overlap); read on accept (`row`)."""

    def __init__(self, arrays: tuple[Any, ...], top_counts: Sequence[int]) -> None:
        self._arrays = arrays  # chosen [n], then top ids and values [n, k] when k > 0
        self._top_counts = tuple(top_counts)
        self._scores: list[TokenScore] | None = None

    def row(self, index: int) -> TokenScore:
        if self._scores is None:
            self._scores = self._read()
        return self._scores[index]

    def _read(self) -> list[TokenScore]:
        lists: list[Any] = [array.tolist() for array in self._arrays]
        if len(lists) == 1:
            return [TokenScore(float(value)) for value in lists[0]]
        scores = []
        for value, ids, row_values, count in zip(*lists, self._top_counts, strict=True):
            ranked = sorted(
                ((int(i), float(v)) for i, v in zip(ids, row_values, strict=True) if math.isfinite(v)),
                key=lambda pair: -pair[1],
            )
            scores.append(TokenScore(float(value), tuple(ranked[:count])))
        return scores


def score_rows(logits: Sequence[Any], tokens: Any, top_counts: Sequence[int]) -> StepScores:
    """Rows' final logits ([1, vocab] each), their chosen tokens ([rows] int) and how many
    alternatives each wants -> the rows' scores: one log-softmax, the chosen values and an
    argpartition top-k over all rows together, evaluated asynchronously."""
    import mlx.core as mx

    stacked = (mx.concatenate(list(logits), axis=0) if len(logits) > 1 else logits[0]).astype(mx.float32)
    logprobs = stacked - mx.logsumexp(stacked, axis=-1, keepdims=True)
    chosen = mx.take_along_axis(logprobs, tokens.reshape(-1, 1).astype(mx.int32), axis=-1).reshape(-1)
    arrays: tuple[Any, ...] = (chosen,)
    k = min(max(top_counts, default=0), logprobs.shape[-1])
    if k > 0:
        top_ids = mx.argpartition(-logprobs, kth=k - 1, axis=-1)[:, :k]
        arrays = (chosen, top_ids, mx.take_along_axis(logprobs, top_ids, axis=-1))
    mx.async_eval(*arrays)  # type: ignore[no-untyped-call]
    return StepScores(arrays, top_counts)


@dataclass(slots=True)
class _Token:
    start: int  # raw-text offset of its first character
    text: str
    entry: pb.TokenLogprob
    visible: list[str] = field(default_factory=list)
    # A token with no text of its own (inside a character) is listed when that character shows.
    shown: bool = False

    @property
    def end(self) -> int:
        return self.start + len(self.text)

    def passed_by(self, offset: int) -> bool:
        """The visible text up to `offset` has decided all of this token."""
        return self.end <= offset if self.text else self.start < offset


class LogprobTrace:
    """Tokens not yet listed, in order, over the raw text they added. Per request."""

    def __init__(self) -> None:
        self._pending: deque[_Token] = deque()
        self._raw_length = 0
        # Every token listed so far (GenerateResult.logprobs).
        self.listed: list[pb.TokenLogprob] = []

    def add(self, text: str, score: TokenScore, alternatives: Sequence[str]) -> None:
        """A generated token: the raw text it added, its score, and its alternatives' texts."""
        entry = pb.TokenLogprob(
            logprob=score.logprob,
            top_logprobs=[
                pb.TopLogprob(token=alternative, logprob=logprob)
                for alternative, (_, logprob) in zip(alternatives, score.top, strict=True)
            ],
        )
        self._pending.append(_Token(self._raw_length, text, entry))
        self._raw_length += len(text)

    def add_text(self, text: str) -> None:
        """Raw text no new token added (the detokenizer's flush): the last token's after all."""
        if not text:
            return
        if self._pending:
            last = self._pending[-1]
            last.text += text
        self._raw_length += len(text)

    def shown(self, start: int, end: int) -> list[pb.TokenLogprob]:
        """The raw text [start, end) became visible: the tokens it settles, in order."""
        for token in self._pending:
            if token.start >= end:
                break
            if token.text:
                lo, hi = max(start, token.start), min(end, token.end)
                if lo < hi:
                    token.visible.append(token.text[lo - token.start : hi - token.start])
            elif start <= token.start < end:
                token.shown = True
        out: list[pb.TokenLogprob] = []
        while self._pending and self._pending[0].passed_by(end):
            out.extend(self._settle(self._pending.popleft()))
        return out

    def finish(self) -> list[pb.TokenLogprob]:
        """Generation ended: every token still pending, with whatever of it was shown."""
        out: list[pb.TokenLogprob] = []
        while self._pending:
            out.extend(self._settle(self._pending.popleft()))
        return out

    def _settle(self, token: _Token) -> list[pb.TokenLogprob]:
        visible = "".join(token.visible)
        if not (visible or token.shown):
            return []
        token.entry.token = visible
        self.listed.append(token.entry)
        return [token.entry]
