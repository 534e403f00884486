"""Loading an mlx-vlm model and the facts the engine reports about it.

`load_model` must run on the generation thread (MLX state is thread-local); everything else
here is plain data.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from vlmserve.common.images import SUPPORTED_MEDIA_TYPES, ImageLimits
from vlmserve.engine.grammar.compiler import GrammarCompiler
from vlmserve.engine.kv.layout import KVLayout
from vlmserve.engine.template_fit import ChatTemplate, probe
from vlmserve.engine.toolcalls.registry import TEXT_TOOLS_FORMAT, format_for_model, tool_format

__all__ = [
    "DEFAULT_MODEL_PATH",
    "FIXTURE_MODELS_DIR",
    "TESTED_FAMILIES",
    "Distribution",
    "Dtype",
    "LoadedModel",
    "ModelInfo",
    "UnsupportedFamily",
    "check_family",
    "fresh_weights",
    "load_model",
    "model_id_for",
    "prompt_needs_special_tokens",
]

log = logging.getLogger(__name__)

# Committed fixture models (in a checkout); VLMSERVE_MODEL (or --model) points elsewhere.
FIXTURE_MODELS_DIR = Path(__file__).resolve().parents[3] / "models"
# Trained to count coloured squares (models/qwen2-vl-squares/README.md): it really sees, so a
# dropped image shows.
DEFAULT_MODEL_PATH = FIXTURE_MODELS_DIR / "qwen2-vl-squares"


def model_id_for(model: str) -> str:
    """A local directory is known by its name; a hub id by itself."""
    path = Path(model)
    return path.resolve().name if path.exists() else model


@dataclass(frozen=True, slots=True)
class ModelInfo:
    model_id: str
    # The --model argument as given (a request may name the model either way).
    source: str
    architecture: str
    context_length: int
    has_chat_template: bool
    tool_call_format: str
    image_limits: ImageLimits
    max_images_per_request: int
    max_output_tokens: int
    loaded_at: float
    media_types: tuple[str, ...] = SUPPORTED_MEDIA_TYPES
    # The template can think: it leaves `<think>` open, has an `enable_thinking` switch, or
    # the output is harmony's (reasoning in its analysis channel).
    thinking: bool = False
    # Part of every cache key (prefix KV, vision features): the model, where its weights came
    # from and as what dtype, so no cached entry is ever used with other weights.
    cache_namespace: str = ""


@dataclass(slots=True)
class LoadedModel:
    """The model and its processor. Touch only from the generation thread."""

    model: Any
    processor: Any
    # What renders prompts: the tokenizer when it has a chat template, else the processor.
    template: ChatTemplate | None
    tokenizer: Any
    info: ModelInfo
    eos_token_ids: frozenset[int]
    # The tokenizer in llguidance form (built once; read-only, shared with the gRPC side).
    grammar: GrammarCompiler
    # Special tokens the detokenizer keeps as text: the tool-call format's markup.
    kept_tokens: Mapping[int, str] = field(default_factory=dict)
    # How its KV is stored (--kv-bits); set by the generation thread once loaded.
    kv_layout: KVLayout = field(default_factory=KVLayout)


def _check_no_checkpoint_code(model_dir: Path) -> None:
    """mlx-vlm imports `model_file` from a checkpoint; that is remote code, refused by default."""
    config_path = model_dir / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if config.get("model_file"):
            raise ValueError(
                f"{config_path} declares model_file={config['model_file']!r} (code shipped with the "
                "checkpoint); pass --trust-remote-code to run it"
            )


# The families every per-family test runs on a fixture (docs/models.md, the matrix).
TESTED_FAMILIES = (
    "gemma3",
    "gemma4",
    "glm4v",
    "glm4v_moe",
    "idefics3",
    "llama4",
    "llava",
    "mistral3",
    "qwen2_5_vl",
    "qwen2_vl",
    "qwen3_5",
    "qwen3_5_moe",
    "qwen3_vl",
    "qwen3_vl_moe",
)


class UnsupportedFamily(ValueError):
    """A checkpoint whose `model_type` this engine cannot serve."""


def _mlx_vlm_packages(subpackage: str) -> frozenset[str]:
    """The model packages of `mlx_vlm.<subpackage>`, found without importing any of them."""
    import importlib
    import pkgutil

    return frozenset(
        found.name
        for found in pkgutil.iter_modules(importlib.import_module(f"mlx_vlm.{subpackage}").__path__)
        if found.ispkg
    )


def check_family(config: Mapping[str, Any], where: str) -> None:
    """Refuse, before any weight is read, a config (`where`: its file, for the message) whose
    model type mlx-vlm has no model for (mlx-vlm's own error comes after its ERROR log and names
    no alternative) or which is a speculative drafter, not a model to serve."""
    from importlib.metadata import version

    from mlx_vlm.utils import get_model_type

    raw = config.get("model_type") or config.get("speculators_model_type")
    model_type = get_model_type(dict(config)) if isinstance(raw, str) else None
    families = _mlx_vlm_packages("models")
    if model_type in families:
        return
    named = f"model_type {raw!r}" if raw is not None else "no model_type"
    if model_type in _mlx_vlm_packages("speculative.drafters"):
        raise UnsupportedFamily(
            f"{where} has {named}: a speculative drafter, not a model to serve; serve its target "
            "and pass this directory as --draft-model"
        )
    others = sorted(families - set(TESTED_FAMILIES))
    raise UnsupportedFamily(
        f"{where} has {named}, a family mlx-vlm {version('mlx-vlm')} cannot load. Supported: "
        f"{', '.join(TESTED_FAMILIES)} (tested here, docs/models.md); also loaded by mlx-vlm, "
        f"untested here: {', '.join(others)}"
    )


def _context_length(model: Any, tokenizer: Any) -> int:
    config = getattr(model, "config", None)
    for holder in (getattr(config, "text_config", None), config):
        for name in ("max_position_embeddings", "max_sequence_length", "seq_length"):
            value = getattr(holder, name, None)
            if isinstance(value, int) and value > 0:
                return value
    value = getattr(tokenizer, "model_max_length", None)
    if isinstance(value, int) and 0 < value < 10**9:
        return value
    return 4096


def _chat_template_holder(processor: Any, tokenizer: Any) -> ChatTemplate | None:
    if getattr(tokenizer, "chat_template", None):
        template: ChatTemplate = tokenizer
        return template
    if getattr(processor, "chat_template", None):
        holder: ChatTemplate = processor
        return holder
    return None


def prompt_needs_special_tokens(prompt: str, tokenizer: Any) -> bool:
    """Whether tokenizing a rendered prompt should add the tokenizer's specials (its BOS).

    Not when the chat template already wrote the BOS token: Gemma 3's, Mistral's and Llama 4's
    templates do, and their tokenizers add it again. (mlx-vlm's `should_add_special_tokens`
    knows only Gemma's case, and misses it when the processor carries no template, so those
    prompts began with two BOS tokens.)
    """
    bos = getattr(tokenizer, "bos_token", None)
    return not (isinstance(bos, str) and bos and prompt.startswith(bos))


# --dtype choices: "auto" casts half-precision weights to float32 on the CPU backend, where
# MLX's float16 kernels are 2-4x slower than float32 through BLAS; on a GPU it keeps them.
Dtype = Literal["auto", "keep", "float32", "float16", "bfloat16"]
# --distributed choices: off, or how mlx-vlm's sharded_load splits the model over the group.
Distribution = Literal["off", "tensor", "pipeline"]


def _apply_dtype(model: Any, dtype: str) -> str:
    """Cast floating weights as asked; returns what was done, for the log."""
    import mlx.core as mx

    if dtype == "keep":
        return "kept"
    if dtype == "auto":
        if mx.default_device() != mx.cpu:
            return "kept (GPU)"
        dtype = "float32"
    target = {"float32": mx.float32, "float16": mx.float16, "bfloat16": mx.bfloat16}[dtype]
    model.set_dtype(target)
    return dtype


def load_model(
    source: str,
    *,
    trust_remote_code: bool = False,
    dtype: str = "auto",
    max_output_tokens: int,
    image_limits: ImageLimits,
    max_images_per_request: int,
    distributed: str = "off",
    lazy: bool = False,
) -> LoadedModel:
    """`mlx_vlm.load` on a local path or hub id, plus the engine's view of the model.

    `distributed` "tensor" or "pipeline": mlx-vlm's `sharded_load` over the `mx.distributed`
    world group (distributed.py), each process keeping its share of the language model.
    `lazy`: the weights are not read yet (mlx-vlm's lazy load; model_lifecycle.py reads them).
    """
    from mlx_vlm.utils import load

    local = Path(source)
    if local.exists() and not trust_remote_code:
        _check_no_checkpoint_code(local)
    config_path = local / "config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
        if not (trust_remote_code and config.get("model_file")):
            check_family(config, str(config_path))
    started = time.perf_counter()
    if distributed == "off":
        model, processor = load(source, lazy=lazy, trust_remote_code=trust_remote_code)
    else:
        from vlmserve.engine.process_group import sharded_model

        model, processor = sharded_model(source, distributed)
    dtype_done = _apply_dtype(model, dtype)
    tokenizer: Any = getattr(processor, "tokenizer", processor)
    template = _chat_template_holder(processor, tokenizer)
    chat_template_text = getattr(tokenizer, "chat_template", None) or getattr(
        processor, "chat_template", None
    )
    architecture = str(getattr(model.config, "model_type", "") or "")
    criteria = getattr(tokenizer, "stopping_criteria", None)
    eos = set(getattr(criteria, "eos_token_ids", None) or [])
    if isinstance(tokenizer.eos_token_id, int):
        eos.add(tokenizer.eos_token_id)
    format_name = format_for_model(
        architecture, chat_template_text if isinstance(chat_template_text, str) else None
    )
    if not format_name and template is not None and not probe(template).renders_tools:
        # The template drops tools, so the prompt describes them in the registry's text-tools
        # format (its `prompt`, template_fit.py) and the output is parsed in it.
        format_name = TEXT_TOOLS_FORMAT
    record = tool_format(format_name)
    eos_ids = frozenset(int(i) for i in eos)
    grammar_started = time.perf_counter()
    grammar = GrammarCompiler(tokenizer, eos_ids)
    log.info("grammar tokenizer built in %.2fs", time.perf_counter() - grammar_started)
    info = ModelInfo(
        model_id=model_id_for(source),
        source=source,
        architecture=architecture,
        context_length=_context_length(model, tokenizer),
        has_chat_template=template is not None,
        tool_call_format=format_name,
        image_limits=image_limits,
        max_images_per_request=max_images_per_request,
        max_output_tokens=max_output_tokens,
        loaded_at=time.time(),
        thinking=record.reasons or _thinks(template, chat_template_text),
        cache_namespace=f"{model_id_for(source)}@{_weights_origin(source)}:{dtype}",
    )
    log.info(
        "loaded %s (%s, context %d, tool format %r, weights %s%s) in %.2fs",
        info.model_id,
        architecture,
        info.context_length,
        format_name,
        dtype_done,
        ", not read yet" if lazy else "",
        time.perf_counter() - started,
    )
    return LoadedModel(
        model=model,
        processor=processor,
        template=template,
        tokenizer=tokenizer,
        info=info,
        eos_token_ids=eos_ids,
        grammar=grammar,
        kept_tokens=_markup_tokens(tokenizer, record.markers),
    )


def _weights_origin(source: str) -> str:
    path = Path(source)
    return str(path.resolve()) if path.exists() else source


def fresh_weights(source: str, *, trust_remote_code: bool = False, dtype: str = "auto") -> Any:
    """A new lazy model object over the same weights (nothing read yet): what an unload puts in
    place of the loaded one (model_lifecycle.py)."""
    from mlx_vlm.utils import get_model_path
    from mlx_vlm.utils import load_model as load_mlx_model

    model = load_mlx_model(get_model_path(source), lazy=True, trust_remote_code=trust_remote_code)
    _apply_dtype(model, dtype)
    return model


def _thinks(template: ChatTemplate | None, template_text: object) -> bool:
    """Whether the template lets the model's output carry reasoning (GetModelInfo's `thinking`)."""
    from vlmserve.engine.output.assembler import prompt_leaves_thinking

    if isinstance(template_text, str) and "enable_thinking" in template_text:
        return True
    if template is None:
        return False
    try:
        prompt = template.apply_chat_template(
            [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False
        )
    except Exception:  # a template that cannot render this says nothing about thinking
        return False
    return isinstance(prompt, str) and prompt_leaves_thinking(prompt)


def _markup_tokens(tokenizer: Any, markup: tuple[str, ...]) -> dict[int, str]:
    """Added tokens whose text is part of the format's markup, by id."""
    added: dict[str, int] = getattr(tokenizer, "get_added_vocab", dict)()
    return {int(i): text for text, i in added.items() if any(text in marker for marker in markup)}
