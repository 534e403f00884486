"""bench/peers.py's pure parts: the ratio table and the validity check (the bench itself runs
peer servers and is never run in CI)."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.peers import BEST, PEERS, BestConfig, Figures, parses, summary, with_flags


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


@pytest.mark.parametrize(
    ("argv", "config", "expected"),
    [
        # A flag's value replaced in place.
        (
            ["serve", "--spec-decode", "none", "--port", "1"],
            BestConfig(set_flags={"--spec-decode": "auto"}),
            ["serve", "--spec-decode", "auto", "--port", "1"],
        ),
        # A missing flag appended, a bare one without a value.
        (
            ["serve", "--port", "1"],
            BestConfig(set_flags={"--speculative-config": '{"method":"suffix"}', "--x": None}),
            ["serve", "--port", "1", "--speculative-config", '{"method":"suffix"}', "--x"],
        ),
        # A dropped flag leaves with its value; a dropped bare flag alone.
        (
            ["serve", "--profile", "standard", "--mllm", "--port", "1"],
            BestConfig(drop_flags=("--profile", "--mllm")),
            ["serve", "--port", "1"],
        ),
        # A bare flag already there stays bare, the flag after it untouched.
        (
            ["--offline", "--continuous-batching"],
            BestConfig(set_flags={"--offline": None}),
            ["--offline", "--continuous-batching"],
        ),
        (["--speculative", "off"], BestConfig(), ["--speculative", "off"]),
    ],
)
def test_with_flags(argv: list[str], config: BestConfig, expected: list[str]) -> None:
    assert with_flags(argv, config) == expected


def test_every_side_has_a_best_config_and_it_changes_what_it_says() -> None:
    assert set(BEST) == {"vlmserve", *PEERS}
    assert all(config.what for config in BEST.values())
    assert with_flags(["--speculative", "off"], BEST["vlmserve"]) == ["--speculative", "auto"]
    fusion = PEERS["fusion-mlx"].argv(Path("bin"), Path("models/m"), 8000)
    best = with_flags(fusion, BEST["fusion-mlx"])
    assert best[best.index("--spec-decode") + 1] == "auto" and "none" not in best
