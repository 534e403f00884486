"""Write one family's model directory: files, locally trained tokenizer, random weights."""

from __future__ import annotations

import importlib
import json
import shutil
from pathlib import Path
from typing import Any

from ._base import Family
from .vocab import build_tokenizer

__all__ = ["build_family", "random_model", "write_family_files"]


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def random_model(config: dict[str, Any], seed: int) -> Any:
    """mlx-vlm's own Model for this config, seeded; its parameters are lazy until evaluated (so a
    real-size one can be cast and quantized a shard at a time: bench/accelerator.py)."""
    import mlx.core as mx
    from mlx_vlm import utils

    model_class: Any
    model_class, _ = utils.get_model_and_args(config=dict(config))
    loaded = json.loads(json.dumps(config))
    loaded.setdefault("text_config", {})
    loaded.setdefault("vision_config", {})
    loaded.setdefault("audio_config", {})
    model_config = model_class.ModelConfig.from_dict(loaded)
    update_module_configs: Any = utils.update_module_configs  # unannotated in mlx-vlm
    model_config = update_module_configs(
        model_config, model_class, loaded, ["text", "vision", "perceiver", "projector", "audio"]
    )
    mx.random.seed(seed)
    return model_class.Model(model_config)


def _random_weights(out_dir: Path, config: dict[str, Any], seed: int) -> int:
    """The random Model saved as float16; returns the parameter count."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    model = random_model(config, seed)
    flat: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = {name: value.astype(mx.float16) for name, value in flat}
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    return sum(int(v.size) for v in weights.values())


def write_family_files(family: Family, out_dir: Path) -> dict[str, Any]:
    """Write one family's directory (replacing it) but its weights; returns its config."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    importlib.import_module(f"mlx_vlm.models.{family.model_type}")  # registers its processor
    tokenizer = build_tokenizer(family.tokenizer)
    files = family.files(tokenizer)
    _write_json(out_dir / "config.json", files.config)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=False)
    _write_json(out_dir / "tokenizer_config.json", files.tokenizer_config)
    _write_json(out_dir / "special_tokens_map.json", files.special_tokens_map)
    _write_json(out_dir / "generation_config.json", files.generation_config)
    _write_json(out_dir / "chat_template.json", {"chat_template": files.chat_template})
    for name, data in files.extra_json.items():
        _write_json(out_dir / name, data)
    return files.config


def build_family(family: Family, out_dir: Path, *, seed: int = 0) -> Path:
    """Write one family's model directory (replacing it); returns the directory."""
    _random_weights(out_dir, write_family_files(family, out_dir), seed)
    return out_dir
