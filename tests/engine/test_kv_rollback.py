"""Rolling back rejected draft positions (speculation/rollback.py, kv/rollback.py `roll_back_batch`)
in every batch layout a verify step runs on: full precision (`BatchKVCache`), uniform quantized
(`BatchQuantizedKVCache`, 8 and 4 bits) and turboquant (4 and 8 bits).

After a verify forward of width W, each row keeps its first W - rejected[i] positions; the batch
must then be, row by row, the cache that never saw the rejected ones: the same offsets, write
index and left padding as a batch merged from rows that stored only the kept positions, the same
stored values (packed data, scales, biases / norms, codes) in every row's visible positions, and
it must go on the same way (a next position lands where it would have)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.kv.layout import TURBOQUANT, KVLayout, new_prompt_cache
from vlmserve.engine.kv.merge import merge_rows
from vlmserve.engine.kv.rollback import trimmable_batch, verify_forward
from vlmserve.engine.speculation.rollback import begin_verify, can_roll_back, roll_back_rows

HEADS, HEAD_DIM = 2, 64


def _full() -> Any:
    from mlx_vlm.models.cache import KVCache

    return KVCache()  # type: ignore[no-untyped-call]


def _uniform(bits: int) -> Callable[[], Any]:
    def make() -> Any:
        from mlx_vlm.models.cache import QuantizedKVCache

        return QuantizedKVCache(group_size=32, bits=bits)

    return make


def _turbo(bits: int) -> Callable[[], Any]:
    def make() -> Any:
        from mlx_vlm.turboquant import TurboQuantKVCache

        return TurboQuantKVCache(bits=bits)

    return make


LAYOUTS = {
    "full": _full,
    "uniform-8": _uniform(8),
    "uniform-4": _uniform(4),
    "turboquant-4": _turbo(4),
    "turboquant-8": _turbo(8),
}


def _vectors(rows: int, tokens: int, seed: int) -> tuple[Any, Any]:
    import mlx.core as mx

    keys = mx.random.normal((rows, HEADS, tokens, HEAD_DIM), key=mx.random.key(seed))
    values = mx.random.normal((rows, HEADS, tokens, HEAD_DIM), key=mx.random.key(seed + 1000))
    return keys, values


def _parts(part: Any) -> list[np.ndarray]:
    return [np.asarray(p) for p in (part if isinstance(part, tuple) else (part,))]


def _visible(batch: Any, row: int) -> list[np.ndarray]:
    """A batch row's stored keys and values over its positions (after its left padding)."""
    pad = int(np.asarray(batch.left_padding)[row])
    end = batch._idx
    return [p[row, :, pad:end] for part in (batch.keys, batch.values) for p in _parts(part)]


def _assert_same(batch: Any, reference: Any) -> None:
    for name in ("offset", "left_padding"):
        np.testing.assert_array_equal(np.asarray(getattr(batch, name)), np.asarray(getattr(reference, name)))
    assert batch._idx == reference._idx
    assert type(batch.keys) is type(reference.keys)  # turboquant's attention dispatches on the state type
    for row in range(len(np.asarray(batch.offset))):
        for mine, theirs in zip(_visible(batch, row), _visible(reference, row), strict=True):
            np.testing.assert_array_equal(mine, theirs)


@pytest.mark.parametrize("new_row", list(LAYOUTS.values()), ids=list(LAYOUTS))
@pytest.mark.parametrize(
    "rejected",
    [[2, 0, 4], [3, 3, 3], [0, 0, 0], [4, 1, 4], [1, 4, 0]],
    ids=["ragged", "uniform", "nothing", "common-and-ragged", "padding-every-row-has-is-dropped"],
)
def test_rollback_leaves_the_cache_that_never_saw_the_rejected_positions(
    new_row: Callable[[], Any], rejected: list[int]
) -> None:
    import mlx.core as mx

    prompts = [5, 9, 3]  # rows of different lengths: left padding 4, 0, 6
    width = 5  # the verify forward: each row's latest token and 4 drafts (or padding)
    rows, references = [], []
    for index, length in enumerate(prompts):
        keys, values = _vectors(1, length, seed=index)
        row, reference = new_row(), new_row()
        row.update_and_fetch(keys, values)
        reference.update_and_fetch(keys, values)
        rows.append(row)
        references.append(reference)
    batch = merge_rows(rows)
    assert trimmable_batch(batch) and can_roll_back([batch])
    assert begin_verify([batch], width, [object()] * 3) is None  # no recurrent layer to record

    verify_keys, verify_values = _vectors(3, width, seed=7)
    batch.update_and_fetch(verify_keys, verify_values)
    roll_back_rows([batch], rejected)

    for index, reference in enumerate(references):
        kept = width - rejected[index]
        if kept:
            reference.update_and_fetch(
                verify_keys[index : index + 1, :, :kept], verify_values[index : index + 1, :, :kept]
            )
    _assert_same(batch, merge_rows(references))

    # ...and it goes on as that cache: the next position of every row lands after its kept ones.
    next_keys, next_values = _vectors(3, 1, seed=11)
    batch.update_and_fetch(next_keys, next_values)
    for index, reference in enumerate(references):
        reference.update_and_fetch(next_keys[index : index + 1], next_values[index : index + 1])
    _assert_same(batch, merge_rows(references))
    for index, reference in enumerate(references):
        back = batch.extract(index)
        assert int(back.offset) == int(reference.offset)
        for mine, theirs in zip(_parts(back.keys), _parts(reference.keys), strict=True):
            np.testing.assert_array_equal(mine, theirs[:, :, : int(reference.offset)])
    mx.eval(batch.keys)


@pytest.mark.needs_model
@pytest.mark.parametrize("prompts", [[50, 20], [12, 20]], ids=["past the window", "inside the window"])
def test_windowed_rows_roll_back_to_what_they_compute_alone(
    family_models: dict[str, Path],  # noqa: F811
    prompts: list[int],
) -> None:
    """Gemma 3's fixture (sliding-window layers of 32 positions, `BatchRotatingKVCache`, between
    full-attention ones): rounds of a verify forward of 5 positions with random rejections per
    row, then two one-position steps (which rotate a full window's buffer), give every row the
    logits it gets stepping alone through the positions it kept: inside the window and past it
    (the case mlx-vlm's `is_trimmable` refuses, `_roll_back_windowed`)."""
    import mlx.core as mx
    from mlx_vlm.utils import load

    language_model = load(str(family_models["gemma3"]))[0].language_model
    # float32 (the fixture is float16): rounding then stays ~1e-6, where a wrong position shows.
    language_model.set_dtype(mx.float32)
    rng = np.random.default_rng(0)
    rows = [rng.integers(10, 200, size=n).tolist() for n in prompts]
    alone = [language_model.make_cache() for _ in rows]
    for ids, cache in zip(rows, alone, strict=True):
        language_model(mx.array([ids]), cache=cache)
    own = [language_model.make_cache() for _ in rows]
    for ids, cache in zip(rows, own, strict=True):
        language_model(mx.array([ids]), cache=cache)
    batch = [merge_rows(list(layers)) for layers in zip(*own, strict=True)]
    assert can_roll_back(batch)
    width = 5
    for _ in range(6):
        tokens = rng.integers(10, 200, size=(len(rows), width)).tolist()
        with verify_forward(batch):
            verify = language_model(mx.array(tokens), cache=batch).logits
        kept = [int(k) for k in rng.integers(1, width + 1, size=len(rows))]
        roll_back_rows(batch, [width - k for k in kept])
        for index, cache in enumerate(alone):
            for position in range(kept[index]):
                logits = language_model(mx.array([[tokens[index][position]]]), cache=cache).logits
                np.testing.assert_allclose(
                    np.asarray(verify[index, position]), np.asarray(logits[0, -1]), rtol=0, atol=1e-4
                )
        for _ in range(2):
            step = rng.integers(10, 200, size=len(rows)).tolist()
            stepped = language_model(mx.array([[t] for t in step]), cache=batch).logits
            for index, cache in enumerate(alone):
                logits = language_model(mx.array([[step[index]]]), cache=cache).logits
                np.testing.assert_allclose(
                    np.asarray(stepped[index, -1]), np.asarray(logits[0, -1]), rtol=0, atol=1e-4
                )


@pytest.fixture(scope="module")
def language_model() -> Any:
    from mlx_vlm.utils import load

    from tests._fixture_models import RANDOM_MODEL_PATH

    model, _ = load(str(RANDOM_MODEL_PATH))
    return model.language_model


VERIFY_LAYOUTS = {
    "full": KVLayout(),
    "uniform-8": KVLayout(8, 32),
    "uniform-4": KVLayout(4, 32),
    "turboquant-4": KVLayout(4, 64, TURBOQUANT),
    "turboquant-8": KVLayout(8, 64, TURBOQUANT),
}


@pytest.mark.needs_model
@pytest.mark.parametrize("layout", list(VERIFY_LAYOUTS.values()), ids=list(VERIFY_LAYOUTS))
@pytest.mark.parametrize("prompts", [[40], [40, 25]], ids=["one row", "two rows"])
def test_a_verify_forward_gives_the_logits_of_the_steps_it_replaces(
    language_model: Any, layout: KVLayout, prompts: list[int]
) -> None:
    """On the random fixture: what makes speculation lossless for seeded rows too. A
    single unpadded turboquant row is where mlx-vlm's multi-query attention rounds otherwise
    (`verify_forward`); its next layers' keys are quantized from that (8e-3 seen)."""
    import mlx.core as mx

    rng = np.random.default_rng(0)
    prompt_ids = [rng.integers(100, 3000, size=n).tolist() for n in prompts]
    tokens = rng.integers(100, 3000, size=(len(prompts), 6)).tolist()

    def batch() -> list[Any]:
        rows = []
        for ids in prompt_ids:
            cache = new_prompt_cache(language_model, layout)
            language_model(mx.array([ids]), cache=cache)
            rows.append(cache)
        return [merge_rows(list(layers)) for layers in zip(*rows, strict=True)]

    stepped, verified = batch(), batch()
    steps = [
        language_model(mx.array([[row[i]] for row in tokens]), cache=stepped).logits[:, -1] for i in range(6)
    ]
    with verify_forward(verified):
        verify = language_model(mx.array(tokens), cache=verified).logits
    # Bitwise on this CPU; 1e-5 leaves room for a backend whose matmuls round by shape (the
    # turboquant row without `verify_forward`: 8e-3).
    np.testing.assert_allclose(np.asarray(mx.stack(steps, axis=1)), np.asarray(verify), rtol=0, atol=1e-5)
