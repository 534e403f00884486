"""The rows whose prompts are being prepared and run, beside the decode batch (generation thread
only): mlx-lm's `PromptProcessingBatch` to batch.py's `GenerationBatch`. Rows are data
(decode.py); this batch acts on them, and the runner (runner.py) moves them from here to the
decode batch once their prompt is in.

Its work, in the stages the runner calls within a step's token budget (scheduler.py decides how
much): `prepare` (model inputs, vision features, a reusable prefix from the prefix cache),
`follow_leaders` (a prompt that starts like another request's in flight starts from that
request's KV), `run_chunks` (one row's next chunk on its own cache: prefill.py `prefill_chunk`,
so its KV cache and first token are exactly what it gets alone; after its last one it draws its
first token) and `prefill_together` (several prompts' rests in one forward, straight into a batch
cache: prefill.py `prefill_group`, and their first tokens). A drafter model's rows keep what it
reads of their prompt's hidden states (`hidden_reader`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from vlmserve.engine.jobs import JobKind
from vlmserve.engine.kv.layout import new_prompt_cache
from vlmserve.engine.kv.snapshots import boundary_state, cuttable
from vlmserve.engine.kv.views import views
from vlmserve.engine.loop.batch import DecodeBatch
from vlmserve.engine.loop.batch_row import BatchRow
from vlmserve.engine.loop.decode import ActiveGeneration, Phase, guarded
from vlmserve.engine.loop.draw import Score, TokenDraw, sample_rows, score_chosen
from vlmserve.engine.loop.message_end import message_end, rerendered_generation_prompts
from vlmserve.engine.loop.model_inputs import ModelInputs, build_model_inputs, prompt_image_spans
from vlmserve.engine.loop.prefill import HiddenReader, groupable, prefill_chunk, prefill_group, prompt_rest
from vlmserve.engine.loop.prefix_cache import PrefixCache, shared_prefix_length
from vlmserve.engine.loop.scheduler import Budget, PrefillRow, chunks, preparations
from vlmserve.engine.loop.scheduler import prefill_group as choose_group
from vlmserve.engine.loop.vision_cache import VisionFeatureCache
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.request_errors import internal_error

__all__ = ["PROMPT_HIDDEN_POSITIONS", "PromptBatch", "PromptGroup"]

log = logging.getLogger(__name__)

# The most prompt positions a drafter model is started from (`joining`): a long prompt's hidden
# states are large (positions x hidden size), and a drafter head attends mostly to what is recent.
PROMPT_HIDDEN_POSITIONS = 4096


@dataclass(slots=True)
class PromptGroup:
    """Prompts run together in one forward: the rows, and, unless it failed (then every row
    failed), what the decode batch extends by (`DecodeBatch.extend`) and each row's first token
    and its score."""

    rows: list[ActiveGeneration]
    entries: list[BatchRow[ActiveGeneration]]
    caches: list[Any]
    rope_deltas: Any
    firsts: list[tuple[int, Score | None]]


class PromptBatch:
    def __init__(
        self,
        loaded: LoadedModel,
        *,
        prefill_chunk_tokens: int,
        prefix_cache: PrefixCache | None,
        vision_cache: VisionFeatureCache | None,
    ) -> None:
        self._loaded = loaded
        self._chunk = max(1, prefill_chunk_tokens)
        self._prefix_cache = prefix_cache
        self._vision_cache = vision_cache
        # Admitted, preparing or prefilling, in arrival order.
        self.rows: list[ActiveGeneration] = []
        # What a drafter model reads of a prompt's hidden states (None: not kept; the decode
        # batch's verifier, verifier.py).
        self.hidden_reader: HiddenReader | None = None
        # The generation prompts the model's template renders differently once answered
        # (message_end.py; probed at the first prompt that needs it).
        self._generation_prompts: tuple[tuple[int, ...], ...] | None = None

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def _keeps_prefixes(self) -> bool:
        return self._prefix_cache is not None and self._prefix_cache.enabled

    def add(self, row: ActiveGeneration) -> None:
        if self.hidden_reader is not None and self.hidden_reader.keeps_prompt_hidden():
            row.prompt_hidden = []
        self.rows.append(row)

    def remove(self, row: ActiveGeneration) -> None:
        self.rows.remove(row)

    # -- preparation ----------------------------------------------------------------------------

    def prepare(self, budget: Budget) -> list[ActiveGeneration]:
        """Prepare the arrivals the budget allows; returns those that ended (a token count's
        answer, a failure), which leave."""
        waiting = [row for row in self.rows if row.phase is Phase.PREPARE]
        image_tokens = [sum(image.token_count for image in row.job.request.images) for row in waiting]
        ended = []
        for row in waiting[: preparations(image_tokens, budget)]:
            guarded(row, functools.partial(self._prepare, row))
            if row.done:
                ended.append(row)
        return ended

    def _prepare(self, row: ActiveGeneration) -> None:
        """Model inputs (vision features included) and any reusable prefix; PREPARE -> PREFILL."""
        loaded, request = self._loaded, row.job.request
        row.prompt_tokens = len(request.prompt_ids)
        if request.kind is JobKind.COUNT_TOKENS:
            row.counted()
            return
        context = loaded.info.context_length
        # Every prepared request fits (prep/preparer.py `_fit_context`, the one place it is checked).
        assert row.prompt_tokens < context, "a prepared prompt leaves room for output"
        row.max_tokens = min(row.max_tokens, context - row.prompt_tokens)
        row.prefix_looked_up = self._prefix_cache is not None
        # The prefix first: images inside the reused part need no vision tower (after a restart
        # the vision cache is empty, and re-encoding an agent's old screenshots would cost more
        # than the rest of the turn).
        spans = prompt_image_spans(loaded, request)
        taken = (
            self._prefix_cache.take(request.partition_key, request.prompt_ids, spans)
            if self._prefix_cache is not None
            else None
        )
        inputs = build_model_inputs(
            loaded, request, spans, vision_cache=self._vision_cache, covered_tokens=taken[1] if taken else 0
        )
        row.inputs = inputs
        if taken is not None:
            cache, cached = taken
        else:
            cache, cached = new_prompt_cache(loaded.model.language_model, loaded.kv_layout), 0
        row.prepared(inputs, cache, cached, TokenDraw(request, loaded, inputs.token_ids, row.max_tokens))
        row.snapshot_at = self._snapshot_position(request.prompt_ids, cache, cached)

    def _snapshot_position(self, prompt_ids: Sequence[int], cache: list[Any], cached: int) -> int:
        """Where this prompt's boundary state is taken (decode.py `snapshot_at`): the end of its
        last message when its generation prompt will be rendered otherwise in the next turn and
        that end is still to run, else the prompt's end."""
        prefix_cache = self._prefix_cache
        if prefix_cache is None or not prefix_cache.enabled or all(cuttable(layer) for layer in cache):
            return len(prompt_ids)
        if self._generation_prompts is None:
            loaded = self._loaded
            self._generation_prompts = (
                rerendered_generation_prompts(loaded.template, loaded.tokenizer)
                if loaded.template is not None
                else ()
            )
        at = message_end(prompt_ids, self._generation_prompts)
        return at if at is not None and max(cached, prefix_cache.min_tokens - 1) < at else len(prompt_ids)

    # -- prefix sharing between requests in flight --------------------------------------------

    def follow_leaders(self, decoding: DecodeBatch[ActiveGeneration], minimum: int) -> None:
        """A prepared request that shares at least `minimum` first prompt tokens with another
        request in flight (same partition) starts from that request's KV for them. From a
        decoding request's batch row at once; from an earlier one still prefilling once its
        chunks get there (it follows it: waits, and its leader's chunks run first). Leaders are
        earlier in arrival order and never followers themselves, so nobody waits in a circle."""
        starting = self.rows
        for index, row in enumerate(starting):
            if not _can_follow(row):
                continue
            best, shared = None, 0
            for other in [*decoding.rows, *(g for g in starting[:index] if _can_lead(g))]:
                length = _shared_prefix(row, other)
                if length > shared:
                    best, shared = other, length
            if best is None or shared < minimum:
                continue
            if best.phase is Phase.DECODE:
                layers = decoding.row_prefix(best, shared)
                if layers is not None:
                    self._start_from(row, layers, shared)
            else:
                row.leader, row.shared_tokens = best, shared
                best.followers.append(row)
                self._share_with_followers(best)  # it may be past that point already

    def _share_with_followers(self, row: ActiveGeneration) -> None:
        """Followers whose shared prefix this request's cache now covers start from it."""
        for follower in list(row.followers):
            if follower.done:
                row.followers.remove(follower)
            elif follower.shared_tokens <= row.prefilled:
                row.followers.remove(follower)
                layers = [(layer.keys, layer.values) for layer in row.cache]
                self._start_from(follower, layers, follower.shared_tokens)

    def _start_from(self, row: ActiveGeneration, layers: list[tuple[Any, Any]], tokens: int) -> None:
        """Start from the first `tokens` positions of another request's per-layer (keys, values)
        (views, not copies) instead of computing them; they count as cached tokens."""
        row.cache = views(layers, tokens, self._loaded.kv_layout)
        row.prefilled = row.cached_tokens = row.shared_tokens = tokens
        row.shared_in_flight = True
        row.leader = None

    # -- prompt chunks ----------------------------------------------------------------------------

    def leaders(self) -> list[ActiveGeneration]:
        """Rows others wait for: their chunks run first."""
        return [row for row in self.rows if row.followers]

    def rest(self) -> list[ActiveGeneration]:
        """Rows prefilling on their own, shortest remaining prompt first."""
        return sorted(
            (row for row in self.rows if row.phase is Phase.PREFILL and row.leader is None),
            key=_remaining,
        )

    def run_chunks(self, rows: list[ActiveGeneration], budget: Budget) -> Iterator[ActiveGeneration]:
        """Each chosen row's next prompt chunk; yields it after (after its last one it has its
        first token and is in DECODE, for the decode batch; or it ended)."""
        for index in chunks(self._prefill_rows(rows), budget):
            row = rows[index]
            guarded(row, functools.partial(self._run_chunk, row))
            yield row

    def _run_chunk(self, row: ActiveGeneration) -> None:
        import mlx.core as mx

        inputs = row.inputs
        assert inputs is not None
        start = row.prefilled
        end = start + _next_chunk(row, self._chunk)
        reader, kept = self.hidden_reader, row.prompt_hidden
        logits = prefill_chunk(
            self._loaded.model.language_model,
            inputs,
            row.cache,
            start,
            end,
            hidden=(reader, kept) if reader is not None and kept is not None else None,
        )
        if row.prompt_hidden and sum(h.shape[1] for h in row.prompt_hidden) > PROMPT_HIDDEN_POSITIONS:
            row.prompt_hidden = [mx.concatenate(row.prompt_hidden, axis=1)[:, -PROMPT_HIDDEN_POSITIONS:]]
        row.prefilled = end
        self._share_with_followers(row)
        if self._keeps_prefixes and end == row.snapshot_at:
            state = boundary_state(row.cache)
            row.prompt_state = (end, state) if state is not None else None
        if end < row.prompt_tokens:
            mx.eval([c.state for c in row.cache], row.prompt_hidden or [])
            return
        # The last chunk: its first token, drawn (scored when asked) by the row's own draw.
        draw = row.draw
        assert draw is not None
        token = draw.sample(logits[:, -1, :]).reshape(-1)
        score_chosen([draw], token)
        value = int(token.item())
        draw.took([value])
        row.prompt_ran(value, draw.take_score())

    def joining(self, row: ActiveGeneration) -> BatchRow[ActiveGeneration]:
        """What a row that ran its prompt here hands the decode batch (with its KV cache): itself
        as its key, its token draw, its latest token, how many it may still be given and, for a
        drafter model, the prompt's hidden states (`prompt_hidden`)."""
        assert row.draw is not None
        return BatchRow(
            row,
            row.draw,
            tokens_left=row.tokens_left,
            last_token=row.last_token,
            rope_deltas=row.rope_deltas,
            prompt_hidden=_prompt_hidden(row),
        )

    # -- prompts run together ---------------------------------------------------------------------

    def prefill_together(self, budget: Budget) -> PromptGroup | None:
        """The prompts that fit one shared prefill forward (scheduler.py), their rests run in it,
        straight into batch rows, and each one's first token drawn; they leave this batch."""
        candidates = [row for row in self.rows if row.phase is Phase.PREFILL]
        group = [candidates[index] for index in choose_group(self._prefill_rows(candidates), budget)]
        if not group:
            return None
        for row in group:
            self.rows.remove(row)
        draws = [_draw(row) for row in group]
        try:
            ran = prefill_group(
                self._loaded.model.language_model,
                [prompt_rest(_inputs(row), row.prefilled) for row in group],
                [row.hand_over_cache() for row in group],
                [row.rope_deltas for row in group],
            )
            logits = ran.last_logits
            chosen = sample_rows(draws, logits)
            score_chosen(draws, chosen)
            values: list[int] = chosen.tolist()
        except Exception:
            log.exception("shared prefill failed")
            for row in group:
                row.fail(internal_error())  # the text and traceback are in the log
            return PromptGroup(group, [], [], None, [])
        if self._keeps_prefixes:
            for index, row in enumerate(group):
                if row.snapshot_at != row.prompt_tokens:
                    continue  # taken by its own chunk already (`_can_prefill_together`)
                state = boundary_state(ran.caches, index)
                row.prompt_state = (row.prompt_tokens, state) if state is not None else None
        entries, firsts = [], []
        for row, draw, value in zip(group, draws, values, strict=True):
            draw.took([value])
            firsts.append((value, draw.take_score()))
            entries.append(
                BatchRow(
                    row, draw, tokens_left=row.tokens_left - 1, last_token=value, rope_deltas=row.rope_deltas
                )
            )
        return PromptGroup(group, entries, ran.caches, ran.rope_deltas, firsts)

    def _prefill_rows(self, rows: Sequence[ActiveGeneration]) -> list[PrefillRow]:
        return [
            PrefillRow(
                key=index,
                remaining=_remaining(row),
                next_chunk=_next_chunk(row, self._chunk) if row.phase is Phase.PREFILL else 0,
                groupable=self._can_prefill_together(row),
            )
            for index, row in enumerate(rows)
        ]

    def _can_prefill_together(self, row: ActiveGeneration) -> bool:
        """Whether the rest of this prompt can share one prefill forward with others': it is all
        one chunk, nobody waits on this request's own cache (followers) nor it on someone else's
        (a leader), and its inputs can be padded (prefill.py `groupable`). It may start from a
        cached prefix, and must be past its boundary when that is inside the prompt (its state is
        taken on the row's own cache, `_run_chunk`)."""
        inputs = row.inputs
        if inputs is None or row.phase is not Phase.PREFILL or row.followers or row.leader is not None:
            return False
        if row.prefilled < row.snapshot_at < row.prompt_tokens:
            return False
        return _remaining(row) <= self._chunk and groupable(inputs)


def _draw(row: ActiveGeneration) -> TokenDraw:
    assert row.draw is not None, "a prepared row has its draw"
    return row.draw


def _inputs(row: ActiveGeneration) -> ModelInputs:
    assert row.inputs is not None, "a prepared row has its inputs"
    return row.inputs


def _remaining(row: ActiveGeneration) -> int:
    """Prompt tokens still to run (before preparation: unknown, counted as 0)."""
    return row.prompt_tokens - row.prefilled if row.inputs is not None else 0


def _next_chunk(row: ActiveGeneration, chunk: int) -> int:
    """Size of the row's next prefill chunk. Chunks are always whole (only the last is
    shorter), whatever else runs in the step, so a request's KV cache and first token do not
    depend on the company it keeps; one also ends at the row's boundary (`snapshot_at`)."""
    if row.prefilled < row.snapshot_at:
        chunk = min(chunk, row.snapshot_at - row.prefilled)
    return min(chunk, row.prompt_tokens - row.prefilled)


def _can_follow(row: ActiveGeneration) -> bool:
    """Prepared, nothing of its prompt computed or cached yet, not tied to another request."""
    return row.phase is Phase.PREFILL and not row.prefilled and row.leader is None and not row.followers


def _can_lead(row: ActiveGeneration) -> bool:
    """Prefilling its own cache (not waiting for someone else's)."""
    return row.phase is Phase.PREFILL and row.leader is None


def _shared_prefix(row: ActiveGeneration, other: ActiveGeneration) -> int:
    """Prompt tokens `row` shares with `other` (same partition only), leaving at least one of
    its own to run (its first token's logits)."""
    if other.partition_key != row.partition_key:
        return 0
    ids, images = row.prompt_signature
    other_ids, other_images = other.prompt_signature
    return min(shared_prefix_length(ids, images, other_ids, other_images), row.prompt_tokens - 1)


def _prompt_hidden(row: ActiveGeneration) -> tuple[int, Any] | None:
    """(the first prompt position they cover, the prompt's last hidden states [1, n, hidden]
    from there to its end), once, for a drafter model; None when they were not kept (another
    request's forward ran the prompt, or a drafter is not in use)."""
    import mlx.core as mx

    chunks_kept, row.prompt_hidden = row.prompt_hidden, None
    if not chunks_kept or row.prefilled < row.prompt_tokens:
        return None
    hidden = chunks_kept[0] if len(chunks_kept) == 1 else mx.concatenate(chunks_kept, axis=1)
    return row.prompt_tokens - int(hidden.shape[1]), hidden
