"""The committed fixture models the tests run on, beside the product's default
(`vlmserve.engine.model.DEFAULT_MODEL_PATH`, the trained squares model)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from vlmserve.engine.model import FIXTURE_MODELS_DIR

__all__ = ["RANDOM_MODEL_PATH", "small_context_model"]

# Same architecture and tokenizer as the squares model, random weights: it never ends a turn by
# itself, which plumbing tests (cancellation, streaming, limits) rely on.
RANDOM_MODEL_PATH = FIXTURE_MODELS_DIR / "qwen2-vl-tiny"


def small_context_model(context: int, folder: Path) -> Path:
    """A copy of the random tiny model in `folder`, with a context of `context` tokens (its
    positions cap it)."""
    model = folder / "model"
    shutil.copytree(RANDOM_MODEL_PATH, model)
    config_path = model / "config.json"
    config = json.loads(config_path.read_text())
    for holder in (config, config.get("text_config") or {}):
        if "max_position_embeddings" in holder:
            holder["max_position_embeddings"] = context
    config_path.write_text(json.dumps(config))
    return model
