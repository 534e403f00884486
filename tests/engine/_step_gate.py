"""The step gate (speculation/step_cost.py) pinned, for tests about what verifying does rather
than when: the gate decides from this machine's measured step costs, which move with its load
and with the tests run before, so two engines would not draft alike."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from vlmserve.engine.speculation.drafter import Speculator
from vlmserve.engine.speculation.step_cost import StepCosts, StepGate


def script_gate(monkeypatch: pytest.MonkeyPatch, decide: Callable[[], bool]) -> None:
    """Each step verifies when `decide()` says so, whatever the rows offer."""
    monkeypatch.setattr(
        StepGate, "verifies", lambda self, offers, max_width, *, certain=False, observed=False: decide()
    )


def verify_every_step(monkeypatch: pytest.MonkeyPatch, *, prior_start_rate: bool = True) -> None:
    """Every step verifies, its width from the prior position cost (no width explored first),
    and, with `prior_start_rate`, a new row starts from the prior acceptance rate rather than the
    recent rows'."""
    script_gate(monkeypatch, lambda: True)
    monkeypatch.setattr(StepCosts, "relative", lambda self, rows, max_width: None)
    monkeypatch.setattr(StepCosts, "explored", lambda self, rows: True)
    if prior_start_rate:
        monkeypatch.setattr(Speculator, "start_rate", lambda self, greedy: None)
