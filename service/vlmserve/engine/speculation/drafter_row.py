"""What every drafter model's wrapper (model_drafter.py, dflash_drafter.py) shares: the row it
drafts for and the load error. A module of its own so neither wrapper imports the other's."""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import Any, Protocol

__all__ = ["DraftModelError", "DrafterRow"]


class DraftModelError(ValueError):
    """The draft model cannot serve this target (unknown kind, mismatched sizes, no weights)."""


class DrafterRow(Protocol):
    @property
    def key(self) -> Hashable:
        """The row's key in its batch (its drafter state is kept under it)."""
        ...

    @property
    def context_tokens(self) -> tuple[Sequence[int], Sequence[int]]: ...

    def take_prompt_hidden(self) -> tuple[int, Any] | None: ...
