"""A checkpoint of a family the engine cannot serve is refused at load, before any weight is
read, naming its model type and the families it can serve (issue 33, bad input)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from training.families import FAMILIES
from vlmserve.common.images import ImageLimits
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.model import TESTED_FAMILIES, UnsupportedFamily, check_family, load_model
from vlmserve.engine.rpc.server import EngineServer


def checkpoint(tmp_path: Path, config: dict[str, object]) -> Path:
    """A model directory with only its config.json: a load that got past the check would fail
    on the missing weights and tokenizer, not with UnsupportedFamily."""
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "config.json").write_text(json.dumps(config), encoding="utf-8")
    return model_dir


def load(model_dir: Path) -> None:
    load_model(str(model_dir), max_output_tokens=8, image_limits=ImageLimits(), max_images_per_request=1)


@pytest.mark.parametrize(
    "config",
    [
        {"model_type": "blip_2", "architectures": ["Blip2ForConditionalGeneration"]},
        {"model_type": "../../etc"},
        {"architectures": ["SomethingForCausalLM"]},
    ],
    ids=["unknown", "path-like", "no-model-type"],
)
def test_an_unknown_family_is_refused_naming_it_and_the_supported_ones(
    tmp_path: Path, config: dict[str, object]
) -> None:
    model_dir = checkpoint(tmp_path, config)
    with pytest.raises(UnsupportedFamily) as refused:
        load(model_dir)
    message = str(refused.value)
    named = config.get("model_type")
    assert (f"model_type {named!r}" if named else "no model_type") in message
    assert str(model_dir / "config.json") in message
    for family in TESTED_FAMILIES:
        assert family in message
    assert "gemma4" in message  # mlx-vlm's other families are listed too (untested here)


def test_a_drafter_is_refused_as_a_model_to_serve(tmp_path: Path) -> None:
    model_dir = checkpoint(tmp_path, {"model_type": "qwen3_5_mtp", "text_config": {}})
    with pytest.raises(UnsupportedFamily, match=r"qwen3_5_mtp.*speculative drafter.*--draft-model"):
        load(model_dir)


@pytest.mark.parametrize("model_type", [*TESTED_FAMILIES, "gemma4", "moondream1"])
def test_every_family_mlx_vlm_loads_passes(model_type: str) -> None:
    check_family({"model_type": model_type}, "config.json")  # moondream1: mlx-vlm's alias


def test_the_engine_fails_its_start_with_the_reason(tmp_path: Path) -> None:
    """The engine's load (on its generation thread) reports the refusal, as the CLI prints it."""
    model_dir = checkpoint(tmp_path, {"model_type": "blip_2"})

    async def start() -> BaseException | None:
        server = EngineServer(EngineConfig(model=str(model_dir), warmup=False))
        await server.start("127.0.0.1:0")
        try:
            server.load()
            await server.wait_loaded()
        except UnsupportedFamily as error:
            return error
        finally:
            await server.shutdown(grace_seconds=1)
        return None

    error = asyncio.run(start())
    assert isinstance(error, UnsupportedFamily)
    assert "'blip_2'" in str(error) and "qwen3_5_moe" in str(error)


def test_the_tested_families_are_the_fixture_families() -> None:
    """The list the refusal names is the matrix's: every fixture family (and qwen2_vl, the
    suite's own fixture models), nothing else."""
    assert set(TESTED_FAMILIES) == {family.model_type for family in FAMILIES.values()} | {"qwen2_vl"}
