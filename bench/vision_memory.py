"""The vision tower's transient memory per image, per family, as a function of its image tokens
(docs/performance.md, "Vision memory"; issue 37 item 4).

For each family fixture (the committed qwen2-vl model and the random-weight family fixtures of
training/families, loaded by the real `mlx_vlm.load`), one screenshot-like image at each size runs
through mlx-vlm's own input path (`prepare_inputs`, then `get_input_embeddings`: the vision tower
and the merge into the text embeddings, what a prefill does before its first chunk). The transient
is MLX's peak memory during that call (`mx.reset_peak_memory` before, `mx.get_peak_memory` after)
less the memory active before it (the weights and the processor's arrays, which admission already
counts). The image tokens are the prompt's image placeholder tokens.

Each family's figures are fitted in activation widths (transient bytes / (vision hidden size x
dtype bytes)) as per_image + linear x t + quadratic x t^2 for an image of t tokens (the square: attention
within the image), least squares, scaled up to cover every measured point (`fit`). Admission
(engine/loop/vision_memory.py) applies them with a loaded model's own vision hidden size and
dtype: a width count carries over from the fixture to the real model where a byte count would not.

    nice -n 10 .venv/bin/python bench/vision_memory.py --out bench/results/vision-memory.json
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ and training/ helpers without installing them

SIZES = ((320, 240), (640, 480), (960, 640), (1280, 800), (1600, 1000))


def screenshot(width: int, height: int) -> Any:
    """A busy RGB image (stripes and noise): a screenshot's worth of detail."""
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(width * height)
    pixels = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
    pixels[:: max(1, height // 20)] = 255
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return Image.open(io.BytesIO(buffer.getvalue())).convert("RGB")


def uncap(processor: Any, width: int, height: int) -> None:
    """Let the image reach the tower at its own size: the fixtures' processors cap it small
    (qwen's 112x112 pixel budget), where a real model's would take a screenshot whole."""
    image_processor = getattr(processor, "image_processor", None)
    if image_processor is None:
        return
    if hasattr(image_processor, "max_pixels"):  # Qwen-VL: a pixel budget
        image_processor.max_pixels = width * height
        if isinstance(getattr(image_processor, "size", None), dict):
            image_processor.size = {**image_processor.size, "longest_edge": width * height}
    elif isinstance(getattr(image_processor, "size", None), dict) and "longest_edge" in image_processor.size:
        image_processor.size = {**image_processor.size, "longest_edge": max(width, height)}


def measure_family(name: str, path: Path, sizes: tuple[tuple[int, int], ...]) -> dict[str, Any]:
    import mlx.core as mx
    from mlx_vlm import load
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import prepare_inputs

    from vlmserve.engine.loop.vision_memory import vision_width

    model, processor = load(str(path))
    hidden, itemsize = vision_width(model)
    image_token = getattr(model.config, "image_token_id", None)
    if not isinstance(image_token, int):
        image_token = getattr(model.config, "image_token_index", None)
    prompt = apply_chat_template(processor, model.config, "Describe the screen.", num_images=1)
    points = []
    for width, height in sizes:
        uncap(processor, width, height)
        inputs = prepare_inputs(
            processor,
            images=[screenshot(width, height)],
            prompts=[prompt],
            image_token_index=getattr(model.config, "image_token_index", None),
        )
        input_ids = inputs["input_ids"]
        pixel_values = inputs.get("pixel_values")
        extra = {k: v for k, v in inputs.items() if k not in ("input_ids", "pixel_values", "attention_mask")}
        mx.eval(input_ids, pixel_values, *[v for v in extra.values() if isinstance(v, mx.array)])
        tokens = int((input_ids == image_token).sum().item()) if image_token is not None else 0
        mx.clear_cache()
        before = mx.get_active_memory()
        mx.reset_peak_memory()
        out = model.get_input_embeddings(input_ids, pixel_values, mask=inputs.get("attention_mask"), **extra)
        mx.eval(out.inputs_embeds)
        transient = int(mx.get_peak_memory()) - int(before)
        del out
        mx.clear_cache()
        points.append(
            {
                "width": width,
                "height": height,
                "image_tokens": tokens,
                "transient_bytes": transient,
            }
        )
        print(
            f"{name:18s} {width}x{height}: {tokens:5d} image tokens, transient {transient / 2**20:8.2f} MiB"
        )
    return {
        "model_type": model.config.model_type,
        "vision_hidden_size": hidden,
        "dtype_bytes": itemsize,
        "points": points,
        "fit": fit(points, hidden, itemsize),
    }


def fit(points: list[dict[str, Any]], hidden: int, itemsize: int) -> dict[str, Any]:
    """transient / (hidden x dtype bytes) = linear x t + quadratic x t^2 (t: the image's tokens;
    the square is attention within the image), least squares through the origin, then both
    scaled up by the largest measured/fitted ratio so the model covers every measured point.
    Under three distinct token counts (fixed-size processors): the linear term alone."""
    import numpy as np

    used = [p for p in points if p["image_tokens"] > 0]
    if not used:
        return {"per_image": None, "linear": None, "quadratic": None}
    t = np.array([p["image_tokens"] for p in used], dtype=np.float64)
    y = np.array([p["transient_bytes"] for p in used], dtype=np.float64) / (hidden * itemsize)
    if len(set(t.tolist())) >= 3:
        (base, linear, quadratic), *_ = np.linalg.lstsq(np.stack([t**0, t, t * t], axis=1), y, rcond=None)
        base, linear, quadratic = max(float(base), 0.0), max(float(linear), 0.0), max(float(quadratic), 0.0)
    else:
        base, linear, quadratic = 0.0, float(np.mean(y / t)), 0.0
    scale = float(np.max(y / (base + linear * t + quadratic * t * t)))
    return {
        "per_image": round(base * scale, 1),
        "linear": round(linear * scale, 3),
        "quadratic": round(quadratic * scale, 5),
        "envelope_scale": round(scale, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--families", nargs="*", default=None, help="default: all")
    parser.add_argument("--sizes", type=int, default=len(SIZES), help="the first N sizes")
    parser.add_argument(
        "--refit", type=Path, default=None, help="fit an earlier result again, measuring nothing"
    )
    args = parser.parse_args()
    if args.refit is not None:
        report = json.loads(args.refit.read_text())
        for result in report["families"].values():
            if "points" in result:
                result["fit"] = fit(result["points"], result["vision_hidden_size"], result["dtype_bytes"])
        _write(report, args.out)
        return
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from tests._fixture_models import RANDOM_MODEL_PATH
    from training.families import FAMILIES, build_family

    names = args.families or ["qwen2_vl", *sorted(FAMILIES)]
    results: dict[str, Any] = {}
    started = time.monotonic()
    with tempfile.TemporaryDirectory() as root:
        for name in names:
            path = (
                RANDOM_MODEL_PATH if name == "qwen2_vl" else build_family(FAMILIES[name], Path(root) / name)
            )
            try:
                results[name] = measure_family(name, path, SIZES[: args.sizes])
            except Exception as error:  # one family's failure is reported, not fatal
                results[name] = {"error": f"{type(error).__name__}: {error}"}
                print(f"{name}: {results[name]['error']}")
    report = {
        "bench": "vision_memory",
        "device": _device(),
        "sizes": [list(size) for size in SIZES[: args.sizes]],
        "seconds": round(time.monotonic() - started, 1),
        "families": results,
    }
    _write(report, args.out)


def _write(report: dict[str, Any], out: Path | None) -> None:
    if out is not None:
        out.write_text(json.dumps(report, indent=2) + "\n")
    for name, result in report["families"].items():
        print(f"{name:18s} {json.dumps(result.get('fit', result))}")


def _device() -> str:
    import mlx.core as mx

    return str(mx.default_device())


if __name__ == "__main__":
    main()
