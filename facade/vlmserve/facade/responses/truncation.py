"""`truncation: "auto"`: the oldest turns are left out until the prompt fits the model's context.

What is dropped is whole turns of the conversation (the contract messages the items became),
oldest first: never a system or developer message (the instructions stay wherever they are),
never a tool call without the outputs that answer it (an assistant turn that calls tools and the
tool turns after it go together), and never the last turn (the input that is being answered).
How many messages went is the response's `truncated_items` (an extension field; absent when
nothing was dropped or truncation is off). A prompt that does not fit even then is the engine's
usual 400 `context_length_exceeded`.

The prompt is measured by the engine (`CountTokens`: the model's own template, tokens and image
tokens), first whole, then by bisection over how many turns to drop (about log2(turns) counts).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence, Sized
from typing import Protocol

from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb

Count = Callable[[OutgoingRequest], Awaitable[int]]
_INSTRUCTIONS = (pb.ROLE_SYSTEM, pb.ROLE_DEVELOPER)


class TurnLike(Protocol):
    """What grouping reads of a message (`pb.Message`, or `OutgoingRequest.turns()`'s `Turn`)."""

    @property
    def role(self) -> int: ...

    @property
    def tool_calls(self) -> Sized: ...


def turn_groups(messages: Sequence[TurnLike]) -> list[list[int]]:
    """The message indexes that may go, in droppable units, oldest first: each message but the
    instructions, an assistant turn with tool calls together with the tool turns after it."""
    groups: list[list[int]] = []
    for index, message in enumerate(messages):
        if message.role in _INSTRUCTIONS:
            continue
        answering = (
            message.role == pb.ROLE_TOOL
            and groups
            and messages[groups[-1][0]].role == pb.ROLE_ASSISTANT
            and len(messages[groups[-1][0]].tool_calls) > 0
            and all(messages[i].role in (pb.ROLE_ASSISTANT, pb.ROLE_TOOL) for i in groups[-1])
            and groups[-1][-1] == _previous_turn(messages, index)
        )
        if answering:
            groups[-1].append(index)
        else:
            groups.append([index])
    return groups


def _previous_turn(messages: Sequence[TurnLike], index: int) -> int:
    """The index of the last message before `index` that is not an instruction."""
    for earlier in range(index - 1, -1, -1):
        if messages[earlier].role not in _INSTRUCTIONS:
            return earlier
    return -1


def without_groups(request: OutgoingRequest, groups: Sequence[list[int]], dropped: int) -> OutgoingRequest:
    """A new request: `request` with the messages of its first `dropped` groups left out."""
    return request.without_messages({index for group in groups[:dropped] for index in group})


async def truncate_to_fit(
    request: OutgoingRequest, *, count: Count, budget: int
) -> tuple[OutgoingRequest, int]:
    """The request with the fewest oldest turns left out that make the prompt at most `budget`
    tokens (a new one; `request` is left as it is), and how many messages went. `request`
    itself, and 0, when it fits already, or when even dropping all but the last turn would not
    make it fit (the engine then refuses it with the usual error)."""
    if await count(request) <= budget:
        return request, 0
    turns = request.turns()
    groups = turn_groups(turns)
    # The last turn is what is being answered: never dropped.
    low, high = 1, len(groups) - 1
    if high < low:
        return request, 0
    shortest = without_groups(request, groups, high)
    if await count(shortest) > budget:
        return request, 0
    # The fewest groups dropped that fit: fits(high) is known true.
    fitting = shortest
    while low < high:
        middle = (low + high) // 2
        candidate = without_groups(request, groups, middle)
        if await count(candidate) <= budget:
            high, fitting = middle, candidate
        else:
            low = middle + 1
    return fitting, sum(len(group) for group in groups[:high])
