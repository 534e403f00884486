"""The committed fixture models the tests run on, beside the product's default
(`vlmserve.engine.model.DEFAULT_MODEL_PATH`, the trained squares model)."""

from __future__ import annotations

from vlmserve.engine.model import FIXTURE_MODELS_DIR

__all__ = ["RANDOM_MODEL_PATH"]

# Same architecture and tokenizer as the squares model, random weights: it never ends a turn by
# itself, which plumbing tests (cancellation, streaming, limits) rely on.
RANDOM_MODEL_PATH = FIXTURE_MODELS_DIR / "qwen2-vl-tiny"
