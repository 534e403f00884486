"""A 5-turn agent loop as a computer-use client runs it, on a real engine: every turn the model's
answer comes back as an assistant turn (its thinking, its text, a `screenshot` tool call) followed
by the tool's output with a new screenshot, and the whole conversation is sent again. Each turn
must reuse what the previous one computed (`cached_tokens`, as the client sees it in usage).

On a hybrid model (Qwen3.5/3.6: Gated DeltaNet + attention) the recurrent state cannot be cut to
any shared prefix, so reuse rests on the boundaries the prefix cache keeps (the end of each
prompt and of each generated turn): the template renders the model's answer with a tool call it
never generated, so the previous prompt's end is the boundary the next turn shares. Gemma 4's
template drops its generation prompt's empty thought channel from the answer it renders, so there
the boundary is the end of the previous prompt's last message (loop/message_end.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from ._family_engine import (
    SCREENSHOT_TOOL,
    SYSTEM,
    greedy,
    image,
    png,
    running_engine,
    screenshot_turn,
    text,
    user,
)

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]

TURNS = 5
# Families whose restored turn is not compared with a fresh prefill, and why.
NOT_COMPARED = {
    # Gemma 3's vision tower runs a request's images still to encode together, as mlx-vlm does,
    # so a fresh prefill of turn 5 encodes five screenshots in one call where the agent's turns
    # encoded one each; the rounding differs (~1e-8), and the fixture's image features are of
    # that size (random weights), so it shows in the output.
    "gemma3": "the vision tower's rounding depends on the images run together",
}


def agent_loop(
    stub: pb_grpc.EngineServiceStub, turns: int
) -> tuple[list[pb.GenerateResult], list[pb.GenerateRequest]]:
    """Each turn's result and request."""
    # The task comes with the screen as it is (a computer-use loop's first turn). Without an image
    # in turn 1, Gemma 3's turn 2 would share only its first token: mlx-vlm's processor adds a
    # second <bos> to a prompt with images, which the text-only tokenization does not.
    messages = [
        SYSTEM,
        user(text("Open the settings page and check the display options."), image(png(64, 48, seed=99))),
    ]
    results, requests = [], []
    for turn in range(turns):
        request = greedy(messages, max_tokens=16)
        request.tools.append(SCREENSHOT_TOOL)
        result = stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=300).result
        results.append(result)
        requests.append(request)
        call_id = f"call_shot{turn:02d}"
        messages += screenshot_turn(result, call_id, seed=turn)
    return results, requests


@pytest.mark.parametrize(
    "name", ["qwen3_5", "qwen3_5_moe", "qwen3_vl", "gemma3", "gemma4", "llama4", "glm4v", "glm4v_moe"]
)
def test_every_turn_reuses_the_previous_one(name: str, family_models: dict[str, Path]) -> None:  # noqa: F811
    with running_engine(family_models[name]) as (_, stub):
        results, requests = agent_loop(stub, TURNS)
        last = requests[-1]
        # The last turn again for another tenant: nothing of it is cached there, so it is a fresh
        # prefill, and its tokens must be those of the turn that continued from kept states.
        last.partition_key = "another tenant"
        cold = stub.GenerateUnary(pb.GenerateUnaryRequest(request=last), timeout=300).result
    prompts = [r.usage.input_tokens for r in results]
    cached = [r.usage.cached_tokens for r in results]
    print(name, "prompt tokens", prompts, "cached", cached)
    assert cached[0] == 0
    for turn in range(1, TURNS):
        # At least 80 % of the previous turn's prompt (issue 33's goal), never all of this one.
        assert 0.8 * prompts[turn - 1] <= cached[turn] < prompts[turn]
    assert cold.usage.cached_tokens == 0
    if name in NOT_COMPARED:
        return
    assert (cold.text, cold.reasoning_text, list(cold.tool_calls)) == (
        results[-1].text,
        results[-1].reasoning_text,
        list(results[-1].tool_calls),
    )
