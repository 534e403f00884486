"""Fair admission across partitions (issue 39.5): one tenant's backlog of large requests never
holds another tenant's request behind it. The policy is pure (scheduler.fair_admission, a table
of cases), then Admission with stand-in jobs; the real engine is in test_memory_admission.py."""

from __future__ import annotations

import pytest

from vlmserve.engine.jobs import Job, JobKind, PreparedRequest
from vlmserve.engine.loop.admission import Admission
from vlmserve.engine.loop.memory_budget import MemoryBudget
from vlmserve.engine.loop.scheduler import fair_admission
from vlmserve.engine.sampling import SamplingSettings

CASES = [
    # (id, waiting [(partition, cost)], held, last admitted, room, in use, budget, admitted)
    ("nothing waiting", [], {}, {}, 4, 0, None, []),
    ("one partition: oldest first, as before", [("a", 1)] * 3, {}, {}, 4, 0, None, [0, 1, 2]),
    ("one partition: a large head still waits", [("a", 6), ("a", 1)], {"a": 1}, {}, 4, 6, 8, []),
    # The finding: a's six large requests (one running) and b's tiny one behind them.
    (
        "another partition's small request overtakes a backlog",
        [("a", 6)] * 5 + [("b", 1)],
        {"a": 1},
        {},
        4,
        6,
        8,
        [5],
    ),
    (
        "round robin, oldest partition first",
        [("a", 1), ("a", 1), ("b", 1), ("b", 1), ("c", 1)],
        {},
        {},
        8,
        0,
        None,
        [0, 2, 4, 1, 3],
    ),
    ("room bounds the turns", [("a", 1), ("a", 1), ("b", 1)], {}, {}, 2, 0, None, [0, 2]),
    (
        "the partition holding fewer goes first",
        [("a", 1), ("b", 1), ("b", 1), ("b", 1)],
        {"a": 3},
        {},
        8,
        0,
        None,
        [1, 2, 3, 0],
    ),
    (
        "equal holdings: the one admitted least recently",
        [("a", 1), ("b", 1)],
        {"a": 1, "b": 1},
        {"a": 7, "b": 3},
        8,
        0,
        None,
        [1, 0],
    ),
    (
        "never admitted comes before admitted",
        [("a", 1), ("b", 1)],
        {"a": 1, "b": 1},
        {"a": 7},
        8,
        0,
        None,
        [1, 0],
    ),
    # The first in fair order that does not fit stops the others: no partition's large request
    # is starved by smaller ones from elsewhere.
    (
        "a misfit at its turn holds the rest",
        [("a", 6), ("b", 1)],
        {"a": 1, "b": 1},
        {"b": 9, "a": 2},
        8,
        7,
        8,
        [],
    ),
    (
        "nothing in flight: the first in fair order runs however large",
        [("a", 50), ("b", 1)],
        {},
        {},
        4,
        0,
        10,
        [0],
    ),
    (
        "the unkeyed partition is one partition like any other",
        [("", 6), ("", 6), ("k", 1)],
        {"": 1},
        {},
        4,
        6,
        8,
        [2],
    ),
]


@pytest.mark.parametrize(
    ("waiting", "held", "last", "room", "in_use", "budget", "expected"),
    [case[1:] for case in CASES],
    ids=[case[0] for case in CASES],
)
def test_fair_admission(
    waiting: list[tuple[str, int]],
    held: dict[str, int],
    last: dict[str, int],
    room: int,
    in_use: int,
    budget: int | None,
    expected: list[int],
) -> None:
    admitted = fair_admission(waiting, held=held, last_admitted=last, room=room, in_use=in_use, budget=budget)
    assert admitted == expected


def job(request_id: str, partition: str, prompt_tokens: int) -> Job:
    request = PreparedRequest(
        request_id=request_id,
        kind=JobKind.GENERATE,
        prompt_ids=tuple(range(prompt_tokens)),
        images=(),
        settings=SamplingSettings(max_tokens=0),
        partition_key=partition,
    )
    return Job(request, None)


def taken_ids(admission: Admission, room: int = 8) -> list[str]:
    return [j.request_id for j in admission.take(room, block=False).jobs]


def test_one_partitions_backlog_does_not_hold_another_behind_it() -> None:
    """The finding's shape at Admission: budget 8 units, a's requests cost 6, b's 1."""
    admission = Admission(max_queue=64)
    admission.memory = MemoryBudget(budget_bytes=8, kv_bytes_per_token=1)
    admission.open()
    for i in range(6):
        admission.submit(job(f"a{i}", "tenant-a", 6))
    assert taken_ids(admission) == ["a0"]
    admission.submit(job("b0", "tenant-b", 1))
    assert taken_ids(admission) == ["b0"]  # at once, beside a0 (it waited behind five before)
    admission.submit(job("b1", "tenant-b", 1))
    admission.finished("a0")
    admission.finished("b0")
    # a holds nothing and b nothing: a was admitted less recently, so a1 goes first; b1 fits too.
    assert taken_ids(admission) == ["a1", "b1"]
    admission.finished("b1")
    admission.finished("a1")
    assert taken_ids(admission) == ["a2"]
    assert admission.memory_in_use == 6


def test_round_robin_between_backlogs_of_equal_requests() -> None:
    """One slot at a time: two tenants' backlogs alternate instead of draining in arrival order."""
    admission = Admission(max_queue=64)
    admission.open()
    for i in range(3):
        admission.submit(job(f"a{i}", "tenant-a", 1))
    for i in range(3):
        admission.submit(job(f"b{i}", "tenant-b", 1))
    order = []
    while taken := taken_ids(admission, room=1):
        order += taken
        admission.finished(taken[0])
    assert order == ["a0", "b0", "a1", "b1", "a2", "b2"]
    # Nothing is kept of a partition that holds and awaits nothing (bounded by the jobs held).
    assert admission._held == {} and admission._last_admitted == {}


def test_a_partition_whose_waiting_job_is_cancelled_leaves_no_record() -> None:
    admission = Admission(max_queue=64)
    admission.open()
    admission.submit(job("a0", "tenant-a", 1))
    admission.submit(job("a1", "tenant-a", 1))
    assert taken_ids(admission, room=1) == ["a0"]
    admission.finished("a0")
    admission.abort("a1")
    (cancelled,) = admission.drop_cancelled()
    admission.finished(cancelled.request_id)
    assert admission._held == {} and admission._last_admitted == {}
