"""Stand-ins for the Speculator's `DraftingRow` (speculation/drafter.py) that the speculation tests
drive it with: a row whose history never repeats, so prompt lookup finds nothing (`LookupRow`),
and a row whose tokens are scripted (`ScriptedRow`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


class LookupRow:
    """A DraftingRow with a history that never repeats (lookup finds nothing)."""

    def __init__(
        self, start: int, *, constrained: bool = False, can_draft: bool = True, greedy: bool = True
    ) -> None:
        self.generated = [start]
        self.constrained = constrained
        self.can_draft = can_draft
        self.greedy = greedy
        self.tokens_left = 100

    @property
    def key(self) -> LookupRow:
        return self

    @property
    def context_tokens(self) -> tuple[list[int], list[int]]:
        return [], self.generated

    def forced_tokens(self, pending: Any) -> list[int]:
        return []

    def take_prompt_hidden(self) -> None:
        return None


class ScriptedRow:
    """A row whose tokens are scripted (what the target would take, greedy): a prompt, then
    `script` token by token however many a step gives it."""

    def __init__(self, prompt: Sequence[int], script: Sequence[int], *, greedy: bool = True) -> None:
        self.prompt = list(prompt)
        self.script = list(script)
        self.generated: list[int] = [self.script[0]]
        self.constrained = False
        self.can_draft = True
        self.greedy = greedy

    @property
    def key(self) -> ScriptedRow:
        return self

    @property
    def tokens_left(self) -> int:
        return len(self.script) - len(self.generated)

    @property
    def context_tokens(self) -> tuple[list[int], list[int]]:
        return self.prompt, self.generated

    def forced_tokens(self, pending: object) -> list[int]:
        return []

    def take_prompt_hidden(self) -> None:
        return None
