"""Quiet steps: plain steps the step gate has decided ahead, run without asking it. Pure.

When the gate finds that a plain step wins for the batch's rows (StepGate.quiet), the steps
after it are plain too, until a probe is due, while the rows' hopes stay below what a verify
would need: the speculator skips its per-row work and the gate on them (~100 us a step at 16
rows on this CPU, 3 % of the copying fixture's ~3 ms steps).

What the rows hope is each one's expected accepted drafts (all it would draft, at its rate once
its rest is over), summed: the gate says how far that sum may rise before a verify could win
(`StepGate.headroom`), and the quiet steps last while it has not. A row that joins adds its
hope; a watched row's shadow look (shadow.py) moves its own. A row that leaves changes nothing:
what it hoped, and any rise it brought, stay counted until the quiet steps end (it made a
verify no likelier to win than it counted for). Quiet steps used to end at any change of the batch's
rows and at any watched row's look that copied: at 16 streams a row leaves or joins every few
steps and every row of a copying workload copies, so they were asked almost every other step
(issue 37.1).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

__all__ = ["QuietSteps"]


@dataclass
class QuietSteps:
    """The quiet steps under way (none while `left` is 0) for a batch-size bucket."""

    left: int = 0
    # Quiet steps run since they began, for the rows' rests (Speculator._end_quiet).
    ran: int = 0
    size: int = 0
    # The rows at the last quiet step (a step with the same rows needs no other check).
    keys: tuple[Hashable, ...] = ()
    # Each row's hope when it was last valued, and the rows' summed rise since the quiet steps
    # began, against the headroom the gate left.
    hopes: dict[Hashable, float] = field(default_factory=dict)
    rise: float = 0.0
    headroom: float = 0.0

    def begin(self, steps: int, size: int, hopes: dict[Hashable, float], headroom: float) -> None:
        """`steps` quiet steps for a batch in bucket `size` whose rows hope `hopes` (by key)."""
        self.left, self.ran, self.size = steps, 0, size
        self.keys = tuple(hopes)
        self.hopes, self.rise, self.headroom = dict(hopes), 0.0, headroom

    def joined(self, keys: tuple[Hashable, ...], size: int) -> list[Hashable] | None:
        """For a step with rows `keys` (bucket `size`): None if the quiet steps are over (none
        left, or the bucket changed), else the keys of rows that joined since the last one,
        whose hopes are to be valued (`hope`) before the step `runs`."""
        if self.left <= 0 or size != self.size:
            self.stop()
            return None
        if keys == self.keys:
            return []
        self.keys = keys
        return [key for key in keys if key not in self.hopes]

    def runs(self) -> None:
        """This step is a quiet one."""
        self.left -= 1
        self.ran += 1

    def stop(self) -> None:
        """No more quiet steps: the gate decides the steps from here."""
        self.left = 0

    def hope(self, key: Hashable, hoped: float) -> None:
        """A row's hope now (a joining row's, or a watched row's after a look): the quiet steps
        end once the rows' summed rise passes the headroom (the gate is asked at the next step
        that is not already running as a quiet one)."""
        self.rise += hoped - self.hopes.get(key, 0.0)
        self.hopes[key] = hoped
        if self.rise > self.headroom:
            self.stop()

    def end(self) -> tuple[Sequence[Hashable], int]:
        """The rows that were in the quiet steps and how many ran (their rests count them)."""
        keys, ran = list(self.hopes), self.ran
        self.left, self.ran, self.keys, self.hopes = 0, 0, (), {}
        return keys, ran
