"""Write the tiny random-weight Qwen2-VL fixture model (models/qwen2-vl-tiny/).

How it was made
---------------
``python -m training.make_fixture_model`` (a few seconds on 2 cores; byte-identical on rerun):

1. A byte-level BPE tokenizer (vocab 8192 including specials) is trained with the ``tokenizers``
   library on a fixed list of files from the Python 3.11 standard library (English documentation
   in ``pydoc_data/topics.py`` plus code), with Qwen2's exact pre-tokenizer (regex split + byte
   level) and NFC normalizer, then Qwen2-VL's special tokens are appended. Training is
   deterministic for a given stdlib; the committed ``tokenizer.json`` is the reference copy, and
   ``--reuse-tokenizer DIR`` copies an existing one instead of retraining.
2. ``config.json`` describes a real mlx-vlm ``qwen2_vl`` model: text hidden 128, 3 layers,
   4 heads / 2 KV heads, MLP 384, tied embeddings, M-RoPE, 65536 positions; vision embed 64,
   depth 2, 2 heads, patch 14, merge 2, temporal patch 2.
3. ``preprocessor_config.json`` pins min_pixels = max_pixels = 112*112, so a square image becomes
   112x112 -> 8x8 patches -> 16 image tokens after the 2x2 merge (other aspect ratios get
   fewer, e.g. 3:2 -> 12, from Qwen2-VL's smart resize).
4. A Qwen2.5-style chat template (system/user/assistant/tool turns, ``# Tools`` block,
   ``<tool_call>`` / ``<tool_response>``) goes into ``chat_template.json`` and
   ``tokenizer_config.json``.
5. Weights: mlx-vlm's own ``qwen2_vl.Model`` initialised from ``mx.random.seed(seed)``, stored as
   float16 in ``model.safetensors`` (1,914,112 parameters, 3.8 MB; the whole directory is 4.1 MB).

The file-writing step (:func:`write_model_files`) is separate from the weights
(:func:`write_random_weights`) so a trained checkpoint of the same architecture and tokenizer can
reuse it.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sysconfig
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_OUTPUT_DIR = REPO_ROOT / "models" / "qwen2-vl-tiny"

# Qwen2's pre-tokenizer regex (transformers' Qwen2Tokenizer uses the same one).
QWEN2_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Qwen2-VL's added tokens, in its order; appended after the BPE vocabulary as Qwen does.
SPECIAL_TOKENS: tuple[str, ...] = (
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<|object_ref_start|>",
    "<|object_ref_end|>",
    "<|box_start|>",
    "<|box_end|>",
    "<|quad_start|>",
    "<|quad_end|>",
    "<|vision_start|>",
    "<|vision_end|>",
    "<|vision_pad|>",
    "<|image_pad|>",
    "<|video_pad|>",
)
# Qwen2.5 marks the tool-call tags as added but not special, so they survive decoding.
NON_SPECIAL_ADDED_TOKENS: tuple[str, ...] = ("<tool_call>", "</tool_call>")

# Training text: stdlib files present in every CPython 3.11 install. English prose first
# (the pydoc topic index), then code and docstrings.
TOKENIZER_TRAINING_FILES: tuple[str, ...] = (
    "pydoc_data/topics.py",
    "LICENSE.txt",
    "argparse.py",
    "typing.py",
    "subprocess.py",
    "email/message.py",
    "http/client.py",
    "asyncio/base_events.py",
    "dataclasses.py",
    "pathlib.py",
    "logging/__init__.py",
    "unittest/case.py",
    "collections/__init__.py",
    "textwrap.py",
    "json/__init__.py",
    "json/decoder.py",
    "json/encoder.py",
    "inspect.py",
    "shutil.py",
    "tarfile.py",
    "zipfile.py",
    "urllib/request.py",
)

# Qwen2.5 conventions with Qwen2-VL's content lists. Content is a string or a list of
# {"type": "text", "text": ...} / {"type": "image"} parts. Tool-call arguments may be a mapping
# (rendered with tojson, as Qwen's own template does) or already-serialised JSON text.
CHAT_TEMPLATE = r"""{%- macro render_content(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content is iterable -%}
{%- for part in content -%}
{%- if part.type == 'image' or part.type == 'image_url' -%}<|vision_start|><|image_pad|><|vision_end|>
{%- elif part.type == 'video' -%}<|vision_start|><|video_pad|><|vision_end|>
{%- elif part.text is defined -%}{{ part.text }}
{%- endif -%}
{%- endfor -%}
{%- endif -%}
{%- endmacro -%}
{%- if tools -%}
{{- '<|im_start|>system\n' -}}
{%- if messages[0].role == 'system' -%}{{- render_content(messages[0].content) -}}
{%- else -%}{{- 'You are a helpful assistant.' -}}
{%- endif -%}
{{- '\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\n'
    ~ 'You are provided with function signatures within <tools></tools> XML tags:\n<tools>' -}}
{%- for tool in tools -%}{{- '\n' -}}{{- tool | tojson -}}{%- endfor -%}
{{- '\n</tools>\n\nFor each function call, return a json object with function name and arguments '
    ~ 'within <tool_call></tool_call> XML tags:\n<tool_call>\n'
    ~ '{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n' -}}
{%- elif messages[0].role == 'system' -%}
{{- '<|im_start|>system\n' + render_content(messages[0].content) + '<|im_end|>\n' -}}
{%- else -%}
{{- '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' -}}
{%- endif -%}
{%- for message in messages -%}
{%- if message.role == 'system' and loop.first -%}
{%- elif message.role == 'user' or message.role == 'system'
    or (message.role == 'assistant' and not message.tool_calls) -%}
{{- '<|im_start|>' + message.role + '\n' + render_content(message.content) + '<|im_end|>\n' -}}
{%- elif message.role == 'assistant' -%}
{{- '<|im_start|>assistant' -}}
{%- set text = render_content(message.content) -%}
{%- if text -%}{{- '\n' + text -}}{%- endif -%}
{%- for tool_call in message.tool_calls -%}
{%- if tool_call.function is defined -%}{%- set tool_call = tool_call.function -%}{%- endif -%}
{{- '\n<tool_call>\n{"name": "' + tool_call.name + '", "arguments": ' -}}
{%- if tool_call.arguments is string -%}{{- tool_call.arguments -}}
{%- else -%}{{- tool_call.arguments | tojson -}}
{%- endif -%}
{{- '}\n</tool_call>' -}}
{%- endfor -%}
{{- '<|im_end|>\n' -}}
{%- elif message.role == 'tool' -%}
{%- if loop.first or messages[loop.index0 - 1].role != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
{{- '\n<tool_response>\n' + render_content(message.content) + '\n</tool_response>' -}}
{%- if loop.last or messages[loop.index0 + 1].role != 'tool' -%}{{- '<|im_end|>\n' -}}{%- endif -%}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\n' -}}{%- endif -%}
"""

IMAGE_SIDE = 112  # pixels; min_pixels = max_pixels = IMAGE_SIDE**2


@dataclass(frozen=True)
class FixtureArchitecture:
    """Sizes of the tiny qwen2_vl; keep in one place so a trained model can reuse them."""

    vocab_size: int = 8192
    hidden_size: int = 128
    num_hidden_layers: int = 3
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 384
    max_position_embeddings: int = 65536
    rope_theta: float = 1_000_000.0
    # Qwen2-VL splits each head's rotary half into (temporal, height, width) sections.
    mrope_section: tuple[int, int, int] = (4, 6, 6)
    vision_embed_dim: int = 64
    vision_depth: int = 2
    vision_num_heads: int = 2
    vision_mlp_ratio: int = 4
    patch_size: int = 14
    spatial_merge_size: int = 2
    temporal_patch_size: int = 2
    torch_dtype: str = "float16"
    extra: dict[str, Any] = field(default_factory=dict)


def stdlib_training_files(names: Sequence[str] = TOKENIZER_TRAINING_FILES) -> list[Path]:
    """The tokenizer's training files, resolved in this interpreter's standard library."""
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    paths = [stdlib / name for name in names]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"stdlib training files missing: {missing}")
    return paths


def _iter_lines(paths: Sequence[Path]) -> Iterator[str]:
    for path in paths:
        yield from path.read_text(encoding="utf-8", errors="replace").splitlines(keepends=True)


def train_tokenizer(vocab_size: int = 8192, paths: Sequence[Path] | None = None) -> Tokenizer:
    """Train a Qwen2-style byte-level BPE and append Qwen2-VL's added tokens (total = vocab_size)."""
    files = list(paths) if paths is not None else stdlib_training_files()
    added = len(SPECIAL_TOKENS) + len(NON_SPECIAL_ADDED_TOKENS)
    tokenizer = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - added,
        min_frequency=2,
        show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        special_tokens=[],
    )
    tokenizer.train_from_iterator(_iter_lines(files), trainer=trainer, length=None)
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    tokenizer.add_tokens(list(NON_SPECIAL_ADDED_TOKENS))
    if tokenizer.get_vocab_size() != vocab_size:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} tokens, wanted {vocab_size}")
    return tokenizer


def _token_id(tokenizer: Tokenizer, token: str) -> int:
    token_id = tokenizer.token_to_id(token)
    if token_id is None:
        raise KeyError(token)
    return token_id


def model_config(arch: FixtureArchitecture, tokenizer: Tokenizer) -> dict[str, Any]:
    """config.json for mlx-vlm's qwen2_vl (HF Qwen2VLForConditionalGeneration layout)."""
    im_end = _token_id(tokenizer, "<|im_end|>")
    endoftext = _token_id(tokenizer, "<|endoftext|>")
    return {
        "architectures": ["Qwen2VLForConditionalGeneration"],
        "model_type": "qwen2_vl",
        "vocab_size": arch.vocab_size,
        "hidden_size": arch.hidden_size,
        "num_hidden_layers": arch.num_hidden_layers,
        "num_attention_heads": arch.num_attention_heads,
        "num_key_value_heads": arch.num_key_value_heads,
        "intermediate_size": arch.intermediate_size,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-6,
        "max_position_embeddings": arch.max_position_embeddings,
        "max_window_layers": arch.num_hidden_layers,
        "rope_theta": arch.rope_theta,
        "rope_scaling": {"type": "mrope", "mrope_section": list(arch.mrope_section)},
        "sliding_window": arch.max_position_embeddings,
        "use_sliding_window": False,
        "tie_word_embeddings": True,
        "torch_dtype": arch.torch_dtype,
        "bos_token_id": endoftext,
        "eos_token_id": im_end,
        "pad_token_id": endoftext,
        "vision_start_token_id": _token_id(tokenizer, "<|vision_start|>"),
        "vision_end_token_id": _token_id(tokenizer, "<|vision_end|>"),
        "vision_token_id": _token_id(tokenizer, "<|vision_pad|>"),
        "image_token_id": _token_id(tokenizer, "<|image_pad|>"),
        "video_token_id": _token_id(tokenizer, "<|video_pad|>"),
        "vision_config": {
            "model_type": "qwen2_vl",
            "depth": arch.vision_depth,
            "embed_dim": arch.vision_embed_dim,
            "hidden_size": arch.hidden_size,
            "num_heads": arch.vision_num_heads,
            "mlp_ratio": arch.vision_mlp_ratio,
            "in_channels": 3,
            "in_chans": 3,
            "patch_size": arch.patch_size,
            "spatial_patch_size": arch.patch_size,
            "spatial_merge_size": arch.spatial_merge_size,
            "temporal_patch_size": arch.temporal_patch_size,
            "hidden_act": "quick_gelu",
        },
        **arch.extra,
    }


def _preprocessor_config(arch: FixtureArchitecture) -> dict[str, Any]:
    pixels = IMAGE_SIDE * IMAGE_SIDE
    return {
        "image_processor_type": "Qwen2VLImageProcessor",
        "processor_class": "Qwen2VLProcessor",
        "do_convert_rgb": True,
        "do_resize": True,
        "do_rescale": True,
        "rescale_factor": 1 / 255,
        "do_normalize": True,
        "image_mean": [0.48145466, 0.4578275, 0.40821073],
        "image_std": [0.26862954, 0.26130258, 0.27577711],
        "min_pixels": pixels,
        "max_pixels": pixels,
        "size": {"shortest_edge": pixels, "longest_edge": pixels},
        "patch_size": arch.patch_size,
        "temporal_patch_size": arch.temporal_patch_size,
        "merge_size": arch.spatial_merge_size,
    }


def _tokenizer_config(tokenizer: Tokenizer, context_length: int) -> dict[str, Any]:
    added: dict[str, dict[str, Any]] = {}
    for token in (*SPECIAL_TOKENS, *NON_SPECIAL_ADDED_TOKENS):
        added[str(_token_id(tokenizer, token))] = {
            "content": token,
            "lstrip": False,
            "normalized": False,
            "rstrip": False,
            "single_word": False,
            "special": token in SPECIAL_TOKENS,
        }
    return {
        "tokenizer_class": "Qwen2Tokenizer",
        "add_prefix_space": False,
        "added_tokens_decoder": added,
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>", *SPECIAL_TOKENS[3:]],
        "bos_token": None,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "unk_token": None,
        "errors": "replace",
        "clean_up_tokenization_spaces": False,
        "split_special_tokens": False,
        "model_max_length": context_length,
        "chat_template": CHAT_TEMPLATE,
    }


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def write_model_files(out_dir: Path, tokenizer: Tokenizer, arch: FixtureArchitecture) -> dict[str, Any]:
    """Write everything but the weights: config, tokenizer, processor, template, generation config.

    Returns the config dict. Reusable for a trained checkpoint of the same architecture.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    config = model_config(arch, tokenizer)
    _write_json(out_dir / "config.json", config)
    tokenizer.save(str(out_dir / "tokenizer.json"), pretty=False)
    _write_json(out_dir / "tokenizer_config.json", _tokenizer_config(tokenizer, arch.max_position_embeddings))
    _write_json(
        out_dir / "special_tokens_map.json",
        {
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "additional_special_tokens": ["<|im_start|>", "<|im_end|>", *SPECIAL_TOKENS[3:]],
        },
    )
    _write_json(out_dir / "chat_template.json", {"chat_template": CHAT_TEMPLATE})
    preprocessor = _preprocessor_config(arch)
    _write_json(out_dir / "preprocessor_config.json", preprocessor)
    # Present so mlx-vlm's Qwen loader finds every file locally and never asks the Hub.
    _write_json(out_dir / "video_preprocessor_config.json", preprocessor)
    _write_json(out_dir / "processor_config.json", {"processor_class": "Qwen2VLProcessor"})
    _write_json(
        out_dir / "generation_config.json",
        {
            "bos_token_id": config["bos_token_id"],
            "eos_token_id": [config["eos_token_id"], config["pad_token_id"]],
            "pad_token_id": config["pad_token_id"],
            "do_sample": False,
        },
    )
    return config


def write_random_weights(out_dir: Path, config: dict[str, Any], seed: int = 0, dtype: str = "float16") -> int:
    """Initialise mlx-vlm's qwen2_vl Model from the seed and save its weights; returns #params."""
    import importlib

    import mlx.core as mx
    from mlx.utils import tree_flatten

    # mlx-vlm's model packages re-export without __all__; typed loosely here.
    qwen2_vl: Any = importlib.import_module("mlx_vlm.models.qwen2_vl")
    mx.random.seed(seed)
    model_config_obj = qwen2_vl.ModelConfig.from_dict(dict(config))
    model_config_obj.vision_config = qwen2_vl.VisionConfig.from_dict(config["vision_config"])
    model_config_obj.text_config = qwen2_vl.TextConfig.from_dict(config)
    model = qwen2_vl.Model(model_config_obj)
    flat: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    weights = {name: value.astype(getattr(mx, dtype)) for name, value in flat}
    mx.save_safetensors(str(out_dir / "model.safetensors"), weights, metadata={"format": "mlx"})
    return sum(int(v.size) for v in weights.values())


def copy_tokenizer_from(model_dir: Path) -> Tokenizer:
    """Load the tokenizer committed in another model dir (so retraining weights keeps token ids)."""
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_OUTPUT_DIR, help="output model directory")
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    parser.add_argument(
        "--reuse-tokenizer",
        type=Path,
        default=None,
        help="copy tokenizer.json from this model dir instead of training one",
    )
    args = parser.parse_args(argv)
    arch = FixtureArchitecture()
    if args.reuse_tokenizer is not None:
        tokenizer = copy_tokenizer_from(args.reuse_tokenizer)
    else:
        tokenizer = train_tokenizer(arch.vocab_size)
    out_dir: Path = args.out
    if out_dir.exists():
        shutil.rmtree(out_dir)
    config = write_model_files(out_dir, tokenizer, arch)
    n_params = write_random_weights(out_dir, config, seed=args.seed)
    size = sum(p.stat().st_size for p in out_dir.iterdir())
    print(f"wrote {out_dir}: {n_params} parameters, {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
