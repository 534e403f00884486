"""The step policy, as pure functions of row snapshots (no MLX, no rows: tested with tables).

A step's token budget (`step_tokens`) pays one token per decoding row, then preparation and
prefill chunks. The runner (runner.py) asks in stages, with a fresh snapshot each time, since
each stage's work changes the rows the next one sees (a prepared row knows its prompt; a
leader's chunk hands its followers their prefix):

1. `fair_admission`: which waiting jobs join (room, and an optional cost budget: memory), in
   round robin over partitions (tenants), by `admit_count` over that order;
2. `preparations`: which new rows are prepared (arrival order, charged their image tokens);
3. `chunks` over the leaders of a shared prefix (others wait on them), then `prefill_group`
   (rows whose whole rest fits one chunk share one forward), then `chunks` over the rest,
   shortest remaining prompt first.

The step's first chunk always runs, so a long prompt always progresses; chunks are whole, so a
request's KV cache and first token never depend on the company it keeps.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["Budget", "PrefillRow", "admit_count", "chunks", "fair_admission", "prefill_group", "preparations"]


@dataclass(slots=True)
class Budget:
    """What is left of a step's tokens, and whether any preparation or chunk ran yet."""

    tokens: int
    ran: bool = False

    def fits(self, cost: int) -> bool:
        return not self.ran or cost <= self.tokens

    def spend(self, cost: int) -> None:
        self.tokens -= cost
        self.ran = True


@dataclass(frozen=True, slots=True)
class PrefillRow:
    """A prefilling row as the policy sees it."""

    key: int
    # Prompt tokens still to run, and the size of its next (whole) chunk.
    remaining: int
    next_chunk: int
    # Its rest is one chunk and it can share a left-padded forward (prompt_batch.py).
    groupable: bool = False


def admit_count(costs: Sequence[int], *, room: int, in_use: int = 0, budget: int | None = None) -> int:
    """How many of the waiting jobs (oldest first, each with its cost) join now: at most `room`,
    in order, while the costs in flight stay within `budget` (None: no bound). With nothing in
    flight the oldest always joins, so a job larger than the budget still runs (alone)."""
    count, used = 0, in_use
    for cost in costs[: max(0, room)]:
        if budget is not None and used + cost > budget and (count or in_use):
            break
        count, used = count + 1, used + cost
    return count


def preparations(image_tokens: Sequence[int], budget: Budget) -> int:
    """How many of the rows waiting for preparation (arrival order, each with its image tokens)
    are prepared this step; each costs at least one token of the budget (spent here)."""
    count = 0
    for tokens in image_tokens:
        if budget.ran and budget.tokens <= 0:
            break
        budget.spend(max(1, tokens))
        count += 1
    return count


def chunks(rows: Sequence[PrefillRow], budget: Budget) -> list[int]:
    """The rows (keys, in the given order) whose next chunk runs this step: each while it fits
    what is left (the step's first always runs); the budget is spent here."""
    chosen = []
    for row in rows:
        if not budget.fits(row.next_chunk):
            continue
        budget.spend(row.next_chunk)
        chosen.append(row.key)
    return chosen


def prefill_group(rows: Sequence[PrefillRow], budget: Budget) -> list[int]:
    """The groupable rows whose whole rests share one forward: shortest first, while they fit
    together; none unless at least two do. The budget is spent here."""
    group: list[PrefillRow] = []
    for row in sorted((r for r in rows if r.groupable), key=lambda r: r.remaining):
        if row.remaining > budget.tokens - sum(r.remaining for r in group):
            break
        group.append(row)
    if len(group) < 2:
        return []
    budget.spend(sum(r.remaining for r in group))
    return [r.key for r in group]


def fair_admission(
    waiting: Sequence[tuple[str, int]],
    *,
    held: Mapping[str, int],
    last_admitted: Mapping[str, int],
    room: int,
    in_use: int = 0,
    budget: int | None = None,
) -> list[int]:
    """Which waiting jobs (arrival order, each as (partition, cost)) join now, as indices in the
    order they join: `admit_count` over the jobs in fair order, so one partition's backlog of
    large requests never holds another partition's request behind it.

    Fair order is round robin over partitions, each one's own jobs oldest first: the next turn
    goes to the partition holding the fewest jobs in flight (`held`, counting the turns given
    here), then to the one admitted least recently (`last_admitted`: a sequence number; never
    admitted first), then to the one whose oldest job waited longest. As with arrival order, the
    first job in that order that does not fit stops the rest, so a large request at its turn is
    not starved by smaller ones."""
    queues: dict[str, collections.deque[int]] = {}
    for index, (partition, _) in enumerate(waiting):
        queues.setdefault(partition, collections.deque()).append(index)
    holding = dict(held)
    recency = {partition: last_admitted.get(partition, -1) for partition in queues}
    tick = max([*last_admitted.values(), 0]) + 1
    order: list[int] = []
    while queues and len(order) < max(0, room):
        turn = min(queues, key=lambda p: (holding.get(p, 0), recency[p], queues[p][0]))
        order.append(queues[turn].popleft())
        if not queues[turn]:
            del queues[turn]
        holding[turn] = holding.get(turn, 0) + 1
        recency[turn] = tick
        tick += 1
    count = admit_count([waiting[i][1] for i in order], room=room, in_use=in_use, budget=budget)
    return order[:count]
