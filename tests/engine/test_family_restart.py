"""The prefix cache's disk tier on the families whose layers are not all plain KV (issue 33):
Qwen3.5's recurrent layers and Gemma 3/4's sliding-window layers are written with their boundary
states at shutdown, so an agent's next turn after a restart starts from them — as cached as it
was without the restart, with the same output, which is a fresh prefill's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.v1 import engine_pb2 as pb

from ._family_engine import running_engine
from .test_agent_loop_reuse import NOT_COMPARED, agent_loop

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


@pytest.mark.parametrize("name", ["qwen3_5", "gemma3", "gemma4", "glm4v"])
def test_the_next_turn_after_a_restart_comes_from_disk(
    name: str,
    tmp_path: Path,
    family_models: dict[str, Path],  # noqa: F811
) -> None:
    with running_engine(family_models[name]) as (_, stub):
        results, requests = agent_loop(stub, 3)  # no disk tier: what turn 3 is without a restart
    with running_engine(family_models[name], prefix_cache_dir=str(tmp_path)) as (_, stub):
        agent_loop(stub, 2)
    assert list(tmp_path.rglob("*.safetensors")), "written at shutdown"
    with running_engine(family_models[name], prefix_cache_dir=str(tmp_path)) as (engine, stub):
        restarted = stub.GenerateUnary(pb.GenerateUnaryRequest(request=requests[2]), timeout=300).result
        cache = engine.server.generator.prefix_cache
        assert cache is not None and cache.hits == {"memory": 0, "disk": 1}
        requests[2].partition_key = "another tenant"
        cold = stub.GenerateUnary(pb.GenerateUnaryRequest(request=requests[2]), timeout=300).result
    print(
        name,
        "turn 3 cached",
        results[2].usage.cached_tokens,
        "after a restart",
        restarted.usage.cached_tokens,
    )
    assert (
        restarted.usage.cached_tokens == results[2].usage.cached_tokens >= 0.8 * results[1].usage.input_tokens
    )
    assert (restarted.text, list(restarted.tool_calls)) == (results[2].text, list(results[2].tool_calls))
    assert cold.usage.cached_tokens == 0
    if name not in NOT_COMPARED:
        assert (cold.text, list(cold.tool_calls)) == (restarted.text, list(restarted.tool_calls))
