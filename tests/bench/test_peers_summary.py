"""bench/peers.py's pure parts: the ratio table and the validity check (the bench itself runs
peer servers and is never run in CI)."""

from __future__ import annotations

import pytest

from bench.peers import Figures, parses, summary


def test_ratio_is_ours_over_peer_for_throughput_and_peer_over_ours_for_latency() -> None:
    figures = Figures()
    for value in (10.0, 12.0):
        figures.add("vlmserve", "c8", value)
    figures.add("peer", "c8", 8.0)
    figures.add("vlmserve", "tool", 2.0)
    figures.add("peer", "tool", 3.0)
    table = summary(figures)
    assert table["c8"]["vlmserve"] == {"best": 12.0}
    assert table["c8"]["peer"] == {"best": 8.0, "vlmserve_ratio": 1.5}
    # Latency: the lower best round counts, and > 1 still means vlmserve is ahead.
    assert table["tool"]["peer"] == {"best": 3.0, "vlmserve_ratio": 1.5}


def test_a_peer_that_produced_nothing_has_no_ratio() -> None:
    figures = Figures()
    figures.add("vlmserve", "single", 3.0)
    figures.add("peer", "single", 0.0)
    assert summary(figures)["single"]["peer"] == {"best": 0.0}


@pytest.mark.parametrize(
    ("text", "keys", "expected"),
    [
        ('{"city": "Oslo", "unit": "c"}', ("city", "unit"), True),
        ('{"city": "Oslo"}', ("city", "unit"), False),
        ('{"city": "Os', ("city",), False),
        ("[1, 2]", ("city",), False),
        (None, ("city",), False),
    ],
)
def test_parses(text: str | None, keys: tuple[str, ...], expected: bool) -> None:
    assert parses(text, keys) is expected
