"""End to end (issue 35): the computer-use loop closes — models/squares-click behind the real engine
and facade, driven by the official `openai` SDK loop of OpenAI's computer-use guide and by the
`anthropic` SDK loop of the computer tool, both unmodified.

Asked "Click the <colour> square." with the computer tool and no screenshot, the model asks for
one; given it (a D x D screen, D in 112/224/336, 2-4 squares), it clicks a cell centre of the
D x D screen (its 0-1000 answer mapped per D); after the next screenshot it is done (`*_closes`).
The click must land inside that colour's square on >= 95 % of 40 fresh screens per loop (the
issue's bar; models/squares-click/README.md has the figures). With every screenshot blanked
(white, same size) it must not do better than chance would (a cell of 16 guessed: ~6 %): what
it clicks is read from the screenshot.

The loops are what cost (one engine and facade serve the module): each is run once, and every
test that reads it asserts on the same runs (`LoopRuns`): the closing checks on the first
CLOSING_SCREENS of the screens the grounding checks score.
"""

from __future__ import annotations

import base64
import functools
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import anthropic
import openai
import pytest

from tests._services import REPO, ServiceProcess, start_engine, start_facade
from training.squares_click import SCREEN_SIZES, Screen, draw_screen, prompt_for

MODEL = REPO / "models" / "squares-click"
E2E_SEED = 35_035
# Blank screenshots: enough screens that chance (~6 %) stays far below MAX_BLANK_ACCURACY; the
# grounding checks score every one (95 %: at most two misses of 40), the loop closing checks
# the first 12 of the same runs.
SCREENS = 40
GROUNDING_SCREENS = SCREENS
CLOSING_SCREENS = 12
MIN_ACCURACY = 0.95
MAX_BLANK_ACCURACY = 0.25
MAX_TURNS = 6

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def services(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    """The engine on the fixture and the facade before it, for the whole module."""
    logs = tmp_path_factory.mktemp("squares-click")
    engine: ServiceProcess = start_engine(logs, model=str(MODEL))
    try:
        facade = start_facade(logs, engine.address, store_path=logs / "responses.sqlite3")
        try:
            yield engine, facade
        finally:
            facade.stop()
    finally:
        engine.stop()


@pytest.fixture(scope="module")
def facade_url(services: tuple[ServiceProcess, ServiceProcess]) -> str:
    return services[1].address


def screens(seed: int) -> list[Screen]:
    rng = random.Random(seed)
    return [draw_screen(rng, SCREEN_SIZES[index % len(SCREEN_SIZES)]) for index in range(SCREENS)]


@dataclass
class Run:
    """What one loop did: the actions asked for, in order, and how it ended."""

    actions: list[dict[str, Any]] = field(default_factory=list)
    final_text: str = ""

    def hit(self, screen: Screen) -> bool:
        """Screenshot first, then one left click inside the target square, then done."""
        kinds = [action["type"] for action in self.actions]
        if kinds != ["screenshot", "click"] or self.actions[1].get("button", "left") != "left":
            return False
        return screen.target_square.contains(self.actions[1]["x"], self.actions[1]["y"])


class LoopRuns:
    """Loops of one client kind over the screens of one seed, each run once (when first asked)
    and kept for the module: the first `count` (screen, run) pairs."""

    def __init__(self, seed: int, loop: Callable[[Screen], Run]) -> None:
        self._screens = screens(seed)
        self._loop = loop
        self._runs: list[tuple[Screen, Run]] = []

    def first(self, count: int) -> list[tuple[Screen, Run]]:
        for screen in self._screens[len(self._runs) : count]:
            self._runs.append((screen, self._loop(screen)))
        return self._runs[:count]


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


# ---- OpenAI: the guide's loop ------------------------------------------------------------------


def openai_loop(client: openai.OpenAI, screen: Screen, tool: dict[str, Any], *, blank: bool) -> Run:
    run = Run()

    def get_screenshot() -> bytes:
        return screen.blank_png() if blank else screen.png_bytes()

    def handle_model_action(action: Any) -> None:
        run.actions.append(action.model_dump(exclude_none=True))

    response = client.responses.create(
        model="default",
        tools=[tool],
        input=[{"role": "user", "content": prompt_for(screen.target)}],
        truncation="auto",
    )
    for _ in range(MAX_TURNS):
        computer_calls = [item for item in response.output if item.type == "computer_call"]
        if not computer_calls:
            break
        computer_call = computer_calls[0]
        actions = computer_call.actions if computer_call.actions else [computer_call.action]
        for action in actions:
            handle_model_action(action)
        assert computer_call.pending_safety_checks == []
        screenshot_base64 = base64.b64encode(get_screenshot()).decode("ascii")
        response = client.responses.create(
            model="default",
            previous_response_id=response.id,
            tools=[tool],
            input=[
                {
                    "call_id": computer_call.call_id,
                    "type": "computer_call_output",
                    "output": {
                        "type": "computer_screenshot",
                        "image_url": f"data:image/png;base64,{screenshot_base64}",
                    },
                }
            ],
            truncation="auto",
        )
    run.final_text = response.output_text
    return run


@pytest.fixture(scope="module")
def openai_client(facade_url: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{facade_url}/v1", api_key="unused", max_retries=0, timeout=120)
    yield client
    client.close()


def tool_for(kind: str, size: int) -> dict[str, Any]:
    if kind == "computer":
        return {"type": "computer"}
    return {
        "type": "computer_use_preview",
        "display_width": size,
        "display_height": size,
        "environment": "browser",
    }


def cell_centres(size: int) -> set[int]:
    """Where the fixture clicks on a `size` screen: a cell's centre (its 0-1000 answer, mapped)."""
    return {(2 * index + 1) * size // 8 for index in range(4)}


def closes_the_loop(run: Run, screen: Screen) -> bool:
    """Screenshot, one left click on a cell centre of this D x D screen (the model's 0-1000
    answer mapped onto the client's screen), then done."""
    kinds = [action["type"] for action in run.actions]
    if kinds != ["screenshot", "click"] or run.final_text != "Done.":
        return False
    click = run.actions[1]
    return click["x"] in cell_centres(screen.size) and click["y"] in cell_centres(screen.size)


def screen_loop(client: openai.OpenAI, kind: str, screen: Screen) -> Run:
    return openai_loop(client, screen, tool_for(kind, screen.size), blank=False)


@pytest.fixture(scope="module")
def openai_runs(openai_client: openai.OpenAI) -> dict[str, LoopRuns]:
    """The guide's loop per tool kind, on the screens of E2E_SEED."""
    return {
        kind: LoopRuns(E2E_SEED, functools.partial(screen_loop, openai_client, kind))
        for kind in ("computer", "computer_use_preview")
    }


@pytest.mark.parametrize("kind", ["computer", "computer_use_preview"])
def test_openai_sdk_loop_closes(openai_runs: dict[str, LoopRuns], kind: str) -> None:
    runs = openai_runs[kind].first(CLOSING_SCREENS)
    closed = [closes_the_loop(run, screen) for screen, run in runs]
    assert sum(closed) >= MIN_ACCURACY * len(closed), [run.actions for _, run in runs]


@pytest.mark.parametrize("kind", ["computer", "computer_use_preview"])
def test_openai_sdk_loop_clicks_the_named_square(openai_runs: dict[str, LoopRuns], kind: str) -> None:
    runs = openai_runs[kind].first(GROUNDING_SCREENS)
    hits = [run.hit(screen) for screen, run in runs]
    accuracy = sum(hits) / len(hits)
    print(f"\n{kind}: clicks inside the named square {accuracy:.3f} of {len(hits)} screens")
    assert accuracy >= MIN_ACCURACY


def test_openai_sdk_loop_with_blank_screenshots_is_no_better_than_chance(
    openai_client: openai.OpenAI,
) -> None:
    runs = [
        (screen, openai_loop(openai_client, screen, {"type": "computer"}, blank=True))
        for screen in screens(E2E_SEED + 1)
    ]
    accuracy = sum(run.hit(screen) for screen, run in runs) / len(runs)
    print(f"\nblank screenshots: clicks inside the named square {accuracy:.3f} of {len(runs)} screens")
    # It still asks for the screenshot: the screenshot, not the loop, is what was taken away.
    assert all(run.actions and run.actions[0]["type"] == "screenshot" for _, run in runs)
    assert accuracy <= MAX_BLANK_ACCURACY


# ---- Anthropic: the computer tool's loop -------------------------------------------------------


def anthropic_loop(client: anthropic.Anthropic, screen: Screen, tool_type: str) -> Run:
    run = Run()
    tool = {
        "type": tool_type,
        "name": "computer",
        "display_width_px": screen.size,
        "display_height_px": screen.size,
    }
    messages: list[dict[str, Any]] = [{"role": "user", "content": prompt_for(screen.target)}]
    for _ in range(MAX_TURNS):
        response = client.beta.messages.create(
            model="default",
            max_tokens=256,
            tools=[tool],  # type: ignore[list-item]
            messages=messages,  # type: ignore[arg-type]
            betas=["computer-use-2025-01-24"],
        )
        messages.append(
            {
                "role": "assistant",
                "content": [block.model_dump(exclude_none=True) for block in response.content],
            }
        )
        uses = [block for block in response.content if block.type == "tool_use"]
        if response.stop_reason != "tool_use" or not uses:
            run.final_text = "".join(block.text for block in response.content if block.type == "text")
            break
        results = []
        for use in uses:
            action = dict(use.input)  # type: ignore[arg-type]
            if action["action"] == "left_click":
                x, y = action["coordinate"]
                run.actions.append({"type": "click", "button": "left", "x": x, "y": y})
            else:
                run.actions.append({"type": action["action"]})
            image = {
                "type": "image",
                "source": {
                    "type": "base64",
                    "media_type": "image/png",
                    "data": base64.b64encode(screen.png_bytes()).decode("ascii"),
                },
            }
            results.append({"type": "tool_result", "tool_use_id": use.id, "content": [image]})
        messages.append({"role": "user", "content": results})
    return run


@pytest.fixture(scope="module")
def anthropic_client(facade_url: str) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=facade_url, api_key="unused", max_retries=0, timeout=120)
    yield client
    client.close()


@pytest.fixture(scope="module")
def anthropic_runs(anthropic_client: anthropic.Anthropic) -> dict[str, LoopRuns]:
    """The computer tool's loop per tool version, on the screens of E2E_SEED + 2."""
    return {
        tool_type: LoopRuns(
            E2E_SEED + 2, functools.partial(anthropic_loop, anthropic_client, tool_type=tool_type)
        )
        for tool_type in ("computer_20250124", "computer_20251124")
    }


@pytest.mark.parametrize("tool_type", ["computer_20250124", "computer_20251124"])
def test_anthropic_sdk_loop_closes(anthropic_runs: dict[str, LoopRuns], tool_type: str) -> None:
    runs = anthropic_runs[tool_type].first(CLOSING_SCREENS)
    closed = [closes_the_loop(run, screen) for screen, run in runs]
    assert sum(closed) >= MIN_ACCURACY * len(closed), [run.actions for _, run in runs]


def test_anthropic_sdk_loop_clicks_the_named_square(anthropic_runs: dict[str, LoopRuns]) -> None:
    runs = anthropic_runs["computer_20250124"].first(GROUNDING_SCREENS)
    accuracy = sum(run.hit(screen) for screen, run in runs) / len(runs)
    print(f"\nanthropic: clicks inside the named square {accuracy:.3f} of {len(runs)} screens")
    assert accuracy >= MIN_ACCURACY


def test_healthy_computer_use_traffic_logs_no_error(services: tuple[ServiceProcess, ServiceProcess]) -> None:
    """Every loop above succeeded (blank screenshots too: the model was answered, not refused):
    neither process logged an ERROR line for them. Last in the module: it reads what the loops
    left in the logs."""
    for service in services:
        errors = service.error_lines()
        assert errors == [], errors
