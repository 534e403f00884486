"""bench/agent_loop.py's HTTP summary: what a server reports becomes the figure, an absent
`cached_tokens` reads "n/a" (never 0 %), and a server that finished no round has its error as
the figure (the bench itself starts servers and is never run in CI)."""

from __future__ import annotations

from typing import Any

import pytest

from bench.agent_loop import http_summary


def turns(ttfts: list[float], prompts: list[int], cached: list[int | None]) -> list[dict[str, Any]]:
    return [
        {"ttft_s": t, "prompt_tokens": p, "cached_tokens": c}
        for t, p, c in zip(ttfts, prompts, cached, strict=True)
    ]


@pytest.mark.parametrize(
    ("runs", "errors", "expected"),
    [
        # The median per turn over rounds; the share is of the previous turn's prompt.
        (
            [turns([0.25, 0.125], [100, 150], [0, 100]), turns([0.75, 0.375], [100, 150], [0, 100])],
            [],
            {"ttft_s": [0.5, 0.25], "last_over_first": 0.5, "cached_share_of_previous_turn": [1.0]},
        ),
        # A reported 0 is a figure: 0 %.
        ([turns([0.2, 0.2], [100, 150], [0, 0])], [], {"cached_share_of_previous_turn": [0.0]}),
        # Not reported at all: "n/a", not 0 %.
        (
            [turns([0.2, 0.2], [100, 150], [None, None])],
            [],
            {"cached_tokens": "n/a", "cached_share_of_previous_turn": "n/a"},
        ),
        # A round that failed beside ones that finished: figures from those, the error kept.
        ([turns([0.2, 0.2], [100, 150], [0, 90])], ["HTTP 500: x"], {"errors": ["HTTP 500: x"]}),
        # No round finished: the first error is the figure.
        ([], ["start: it died", "HTTP 500: y"], {"error": "start: it died", "failures": 2}),
    ],
)
def test_http_summary(runs: list[list[dict[str, Any]]], errors: list[str], expected: dict[str, Any]) -> None:
    table = http_summary(runs, errors)
    assert {key: table[key] for key in expected} == expected
