"""`vlmserve models PATH`: what a models folder (a Hugging Face hub cache too), one model's folder,
or a models file holds — each model's family (config `model_type`), size (parameters counted from
the safetensors headers, and bytes on disk), context length and modalities — read from the files
alone: no weights are loaded and nothing is imported from MLX, so it runs anywhere in a second.

The context length is read as the engine reads it once loaded (text_config, then the top level:
max_position_embeddings, max_sequence_length, seq_length; engine/model.py `_context_length`).
"""

from __future__ import annotations

import argparse
import json
import os
import struct
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["ModelSummary", "describe", "find_models", "main", "table"]

_CONTEXT_NAMES = ("max_position_embeddings", "max_sequence_length", "seq_length")
# A safetensors header is JSON; one larger than this is not a model file.
_MAX_HEADER_BYTES = 100 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class ModelSummary:
    name: str
    path: str
    family: str
    parameters: int | None
    bytes_on_disk: int
    context: int | None
    modalities: tuple[str, ...]
    quantization_bits: int | None
    # Why the folder could not be described (then the fields above are what could be read).
    problem: str | None = None


def _context(config: Mapping[str, Any]) -> int | None:
    text = config.get("text_config")
    for holder in (text if isinstance(text, Mapping) else {}, config):
        for name in _CONTEXT_NAMES:
            value = holder.get(name)
            if isinstance(value, int) and value > 0:
                return value
    return None


def _modalities(config: Mapping[str, Any]) -> tuple[str, ...]:
    keys = set(config)
    found = ["text"]
    if "vision_config" in keys or keys & {"image_token_id", "image_token_index"}:
        found.append("image")
    if keys & {"video_token_id", "video_token_index"}:
        found.append("video")
    if "audio_config" in keys or keys & {"audio_token_id", "audio_token_index"}:
        found.append("audio")
    return tuple(found)


def _header(path: Path) -> dict[str, Any]:
    with path.open("rb") as stream:
        (length,) = struct.unpack("<Q", stream.read(8))
        if length > _MAX_HEADER_BYTES:
            raise ValueError(f"{path.name}: a safetensors header of {length} bytes")
        header: dict[str, Any] = json.loads(stream.read(length))
    return header


def _parameters(folder: Path, bits: int | None) -> int | None:
    """Elements of every tensor; quantized weights (uint32 words packing 32/bits values each)
    are counted unpacked, and their scales and biases are left out."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        return None
    total = 0
    for path in files:
        for name, tensor in _header(path).items():
            if name == "__metadata__" or not isinstance(tensor, Mapping):
                continue
            elements = 1
            for size in tensor.get("shape", []):
                elements *= int(size)
            if bits and name.endswith((".scales", ".biases")):
                continue
            if bits and tensor.get("dtype") == "U32":
                elements = elements * 32 // bits
            total += elements
    return total


def describe(folder: Path, name: str | None = None) -> ModelSummary:
    """One model's folder (its config.json and safetensors files)."""
    name = name or folder.name
    size = sum(path.stat().st_size for path in folder.rglob("*") if path.is_file())
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
        quantization = config.get("quantization") or config.get("quantization_config") or {}
        bits = quantization.get("bits") if isinstance(quantization, Mapping) else None
        return ModelSummary(
            name=name,
            path=str(folder),
            family=str(config.get("model_type", "?")),
            parameters=_parameters(folder, bits if isinstance(bits, int) else None),
            bytes_on_disk=size,
            context=_context(config),
            modalities=_modalities(config),
            quantization_bits=bits if isinstance(bits, int) else None,
        )
    except (OSError, ValueError, struct.error, AttributeError) as error:
        return ModelSummary(name, str(folder), "?", None, size, None, (), None, problem=str(error))


def find_models(path: Path) -> list[tuple[str, Path]]:
    """(name, folder) of each model `path` names: a model folder (it has config.json), a folder
    of model folders, or a models file (TOML/JSON, `[[models]]` with `id` and `model`; an entry
    whose `model` is no local folder, a hub id, is listed with the problem said)."""
    if path.is_dir():
        if (path / "config.json").is_file():
            return [(path.name, path)]
        found = [(child.name, child) for child in sorted(path.iterdir()) if (child / "config.json").is_file()]
        return found + _hub_cache_models(path)
    from vlmserve.facade.settings.model_routes import read_models_file

    # A relative `model` is taken from the current folder, as `vlmserve serve --models-file` does.
    return [
        (entry.id, Path(entry.model)) for entry in read_models_file(path).models if entry.model is not None
    ]


def _hub_cache_models(path: Path) -> list[tuple[str, Path]]:
    """A Hugging Face hub cache (`models--ORG--NAME/snapshots/REVISION/`): each model by its hub
    id, at its newest snapshot that has a config.json (what `vlmserve serve ORG/NAME` loads)."""
    found = []
    for child in sorted(path.glob("models--*")):
        snapshots = [s for s in (child / "snapshots").glob("*") if (s / "config.json").is_file()]
        if snapshots:
            newest = max(snapshots, key=lambda snapshot: snapshot.stat().st_mtime)
            found.append((child.name.removeprefix("models--").replace("--", "/"), newest))
    return found


def default_path(environ: Mapping[str, str]) -> Path:
    """`models` (a checkout's fixtures) when it exists, else the Hugging Face hub cache."""
    if Path("models").is_dir():
        return Path("models")
    if environ.get("HF_HUB_CACHE"):
        return Path(environ["HF_HUB_CACHE"])
    home = Path(environ["HF_HOME"]) if environ.get("HF_HOME") else Path.home() / ".cache" / "huggingface"
    return home / "hub"


def _count(value: int | None) -> str:
    if value is None:
        return "?"
    for unit, size in (("T", 10**12), ("B", 10**9), ("M", 10**6), ("K", 10**3)):
        if value >= size:
            return f"{value / size:.1f}{unit}"
    return str(value)


def _bytes(value: int) -> str:
    for unit, size in (("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{value} B"


def table(summaries: Sequence[ModelSummary]) -> str:
    header = ("MODEL", "FAMILY", "PARAMS", "ON DISK", "CONTEXT", "MODALITIES")
    rows = [header]
    for s in summaries:
        params = _count(s.parameters) + (f" ({s.quantization_bits}-bit)" if s.quantization_bits else "")
        rows.append(
            (
                s.name,
                s.family if s.problem is None else f"? ({s.problem})",
                params,
                _bytes(s.bytes_on_disk),
                str(s.context or "?"),
                "+".join(s.modalities) or "?",
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip() for row in rows
    )


def main(argv: Sequence[str] | None = None, prog: str = "vlmserve models") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument(
        "path",
        type=Path,
        nargs="?",
        default=None,
        help="a folder of models (or a Hugging Face hub cache), one model's folder, or a models file "
        "(default: ./models if it exists, else the hub cache)",
    )
    parser.add_argument("--json", action="store_true", help="one JSON object per model instead of a table")
    args = parser.parse_args(argv)
    if args.path is None:
        args.path = default_path(os.environ)
    if not args.path.exists():
        parser.error(f"{args.path}: no such file or folder")
    try:
        found = find_models(args.path)
    except ValueError as error:
        parser.error(str(error))
    summaries = [describe(folder, name) for name, folder in found]
    if args.json:
        for summary in summaries:
            print(json.dumps(asdict(summary)))
    elif summaries:
        print(table(summaries))
    else:
        print(f"no models in {args.path} (a model folder holds config.json and *.safetensors)")
    return 0 if summaries and not any(s.problem for s in summaries) else 1
