"""A stand-in for the Speculator's `DraftingRow` (speculation/drafter.py): a row whose history
never repeats, so prompt lookup finds nothing; the speculation tests drive the Speculator with it."""

from __future__ import annotations

from typing import Any


class LookupRow:
    """A DraftingRow with a history that never repeats (lookup finds nothing)."""

    def __init__(self, start: int, *, constrained: bool = False, can_draft: bool = True) -> None:
        self.generated = [start]
        self.constrained = constrained
        self.can_draft = can_draft
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
