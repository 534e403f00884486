"""Times each decode step for the step gate's measured costs (step_cost.py `StepCosts`), from the
clock readings the verifier gives it (loop/verifier.py). Pure: the readings are its arguments."""

from __future__ import annotations

from dataclasses import dataclass

from vlmserve.engine.speculation.step_cost import StepCosts

__all__ = ["StepClock"]


@dataclass
class StepClock:
    """Times each decode step for `StepCosts` from the clock readings the verifier gives it:
    every step starts at `start` (its rows, whether it verifies), a verify step drafts and
    starts its forward at `launch` (its width then set by `width`), and a step's cost runs to
    the next step's start, except for a plain step followed by a verify: a plain step's forward
    runs on while the next step starts (double-buffered), and a verify first waits for it (the
    batch reads the tokens in flight before `launch`), so that plain step ends, and the verify
    starts, at the verify's `launch` (its drafting, a drafter model's forwards included, is the
    verify's). Timed from start to start, each verify after a plain step was charged the plain
    forward it waited for and that plain step almost nothing, so verifies looked dearer than
    they are and plain steps cheaper (issue 37.1). A step whose batch changed size is not
    counted (the gap also holds a joining row's prompt, or the batch's changes).

    A plain step next to a verify is not a plain step's cost: the verify broke the double
    buffering, and the plain step after it also hands out the verify's tokens. What such a
    plain step costs beyond a plain step's known cost is the verify's (the one before it, else
    the one after it), and it is not measured as a plain step. Charged to nobody, it hid ~20 %
    of a verify's cost: the copying fixture at 9-16 rows, a plain step after a verify 5.3 ms
    against 3.6 ms between plain steps, and verifies priced 10.0 ms measured 12.6 from launch
    to the next step (issue 37.1)."""

    costs: StepCosts
    # The step under way: when it started, its rows and width (0: plain); None: none, or the
    # batch emptied since.
    _step: tuple[float, int, int] | None = None
    # A plain step whose cost ends at the next verify's `launch`.
    _waiting: tuple[float, int, int] | None = None
    # A verify measured (its rows, width and seconds), to be observed with the extra time of
    # the plain step after it.
    _held: tuple[int, int, float] | None = None
    # The extra time of the plain step before the verify under way, the verify's.
    _extra: float = 0.0

    def start(self, now: float, rows: int, *, verifies: bool) -> None:
        previous, self._step = self._step, (now, rows, 0)
        if verifies and previous is not None and previous[2] == 0:
            self._waiting = previous
        else:
            self._waiting = None
            self._ended(previous, now, rows, verify_next=verifies)

    def launch(self, now: float) -> None:
        """The verify step has read the tokens in flight: it drafts and starts its forward."""
        if self._step is None or self._waiting is None:
            return
        self._ended(self._waiting, now, self._step[1], verify_next=True)
        self._waiting, self._step = None, (now, self._step[1], self._step[2])

    def width(self, width: int) -> None:
        """The verify forward's width (1 + the longest drafts it verifies)."""
        if self._step is not None:
            self._step = (self._step[0], self._step[1], width)

    def stop(self) -> None:
        """The batch emptied: the step under way is not measured."""
        self._step = self._waiting = self._held = None
        self._extra = 0.0

    def disturbed(self) -> None:
        """The step under way also ran other work (the runner ran a prompt chunk after it):
        not what a step costs, so it is not measured. Clipped to 3x the average, such steps
        still pulled a plain step's cost up (DFlash greedy, 16 rows: plain 20 ms against a
        two-wide verify's 7.3 ms), and a plain cost too high opens the gate (issue 37.1)."""
        if self._step is not None:
            self._step = (self._step[0], -1, self._step[2])

    def _ended(
        self, step: tuple[float, int, int] | None, now: float, rows: int, *, verify_next: bool
    ) -> None:
        """`step` ended at `now` with the batch at `rows`; `verify_next`: a verify follows it."""
        held, self._held = self._held, None
        extra, self._extra = self._extra, 0.0
        measured = step is not None and step[1] == rows  # (a disturbed step's rows are -1)
        if step is None or not measured:
            if held is not None:
                self.costs.observe(*held)
            return
        seconds = self._elapsed(step, now)
        if step[2] > 0:  # a verify: with the plain step after it, if one follows
            verify = (rows, step[2], seconds + extra)
            if verify_next:
                self.costs.observe(*verify)
            else:
                self._held = verify
            return
        if held is None and not verify_next:
            self.costs.observe(rows, 0, seconds)
            return
        # Next to a verify: never measured as a plain step (after the batch's costs were
        # forgotten, `StepGate._refresh`, three such plain steps between verifies priced a
        # plain step at 10.7 ms, three times its cost, and the verifies won on).
        # Not clipped at 0: a plain step's time is noisy, and clipped, the noise's upper half
        # alone would be added to every verify next to plain steps (at one row, ~10 % of it).
        plain = self.costs.plain(rows)
        beyond = seconds - plain if plain is not None else 0.0
        if held is not None:
            self.costs.observe(held[0], held[1], held[2] + beyond)
        else:
            self._extra = beyond

    @staticmethod
    def _elapsed(step: tuple[float, int, int], now: float) -> float:
        """A step's seconds (started `step[0]`, its rows and width after it), ended `now`."""
        return now - step[0]
