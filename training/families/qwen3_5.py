"""Qwen3.5 (hybrid Gated DeltaNet + full attention), its MTP drafter head and a DFlash drafter.

Qwen3.5 checkpoints ship a multi-token-prediction head (`mtp.*` tensors, `mtp_num_hidden_layers`)
that mlx-vlm runs as a speculative drafter (`speculative/drafters/qwen3_5_mtp`). The fixture is
the target plus that head, both as a standalone drafter directory (`model_type: qwen3_5_mtp`, the
layout mlx-vlm's `split_mtp` writes) and inside the target's weights (`mtp.*`, as shipped), so
`--draft-model` is tested on the code paths a real Qwen3.5 + MTP pair takes. DFlash drafters
(z-lab's `Qwen3.5-*-DFlash`, mlx-vlm's `speculative/drafters/qwen3_dflash`) read chosen target
layers' hidden states: `build_dflash_drafter` writes one, laid out as those checkpoints are
(`model_type: qwen3` + `dflash_config`), in `dflash-drafter`. Its chat template is Qwen3-VL's
(the fixture tests the engine, not the template).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from . import chat_templates as templates
from ._base import HEAD_DIM, HIDDEN, KV_HEADS, Family, FamilyFiles, text_sizes
from .qwen import _QWEN3_TOKENIZER, _qwen3_vl_files
from .vocab import token_ids

__all__ = [
    "DEEP_FAMILY",
    "DFLASH_DRAFTER_DIR",
    "EAGLE3_DRAFTER_DIR",
    "FAMILIES",
    "MTP_DRAFTER_DIR",
    "SERVED_FAMILIES",
    "build_dflash_drafter",
    "build_eagle3_drafter",
    "build_mtp_drafter",
]

# Where the family's drafters are written, inside the target's directory.
MTP_DRAFTER_DIR = "mtp-drafter"
DFLASH_DRAFTER_DIR = "dflash-drafter"
EAGLE3_DRAFTER_DIR = "eagle3-drafter"


def _text_config(vocab_size: int, eos: int) -> dict[str, Any]:
    return {
        "model_type": "qwen3_5_text",
        **text_sizes(vocab_size),
        "head_dim": HEAD_DIM,
        # Layer 0 linear attention (Gated DeltaNet), layer 1 full attention: both cache kinds.
        "full_attention_interval": 2,
        "linear_num_value_heads": 2,
        "linear_num_key_heads": KV_HEADS,
        "linear_key_head_dim": HIDDEN // 4,
        "linear_value_head_dim": HIDDEN // 4,
        "linear_conv_kernel_dim": 4,
        # Half the head rotated, interleaved M-RoPE over its 4 pairs (the real [11, 11, 10]).
        "rope_parameters": {
            "rope_type": "default",
            "mrope_section": [2, 1, 1],
            "mrope_interleaved": True,
            "rope_theta": 10_000_000.0,
            "partial_rotary_factor": 0.5,
        },
        "attention_bias": False,
        "tie_word_embeddings": True,
        "mtp_num_hidden_layers": 1,
        "mtp_use_dedicated_embeddings": False,
        "eos_token_id": eos,
        "dtype": "bfloat16",
    }


def _qwen3_5(tokenizer: Tokenizer) -> FamilyFiles:
    files = _qwen3_vl_files(tokenizer, templates.QWEN3_VL)
    ids = token_ids(tokenizer, ("<|im_end|>",))
    config = files.config
    config["architectures"] = ["Qwen3_5ForConditionalGeneration"]
    config["model_type"] = "qwen3_5"
    config["text_config"] = _text_config(tokenizer.get_vocab_size(), ids["<|im_end|>"])
    vision = config["vision_config"]
    vision["model_type"] = "qwen3_5"
    vision["deepstack_visual_indexes"] = []
    return files


def _fresh_drafter(
    out_dir: Path, config: dict[str, Any], build: Callable[[], Any], seed: int
) -> dict[str, Any]:
    """Write `config` as `out_dir`'s config.json; the weights of the model `build()` makes, seeded."""
    import mlx.core as mx
    from mlx.utils import tree_flatten

    out_dir.mkdir(exist_ok=True)
    (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    mx.random.seed(seed)
    flat: list[tuple[str, Any]] = tree_flatten(build().parameters())  # type: ignore[assignment]
    return dict(flat)


def _quiet_layer(weights: dict[str, Any]) -> None:
    """Scale the drafter layer's output projections down, so it adds little to what fc passes."""
    for name in weights:
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            weights[name] = weights[name] * 0.05


def _save_weights(out_dir: Path, weights: dict[str, Any]) -> dict[str, Any]:
    """`weights` as float16 in `out_dir`/model.safetensors; returns them."""
    import mlx.core as mx

    saved = {name: value.astype(mx.float16) for name, value in weights.items()}
    mx.save_safetensors(str(out_dir / "model.safetensors"), saved, metadata={"format": "mlx"})
    return saved


def build_mtp_drafter(target_dir: Path, *, seed: int = 1) -> Path:
    """Write the target's MTP head (random weights) as a drafter directory next to its weights
    (`target_dir/mtp-drafter`), and into the target's weights as `mtp.*`; returns the directory."""
    import mlx.core as mx
    from mlx_vlm.speculative.drafters.qwen3_5_mtp import ModelConfig, Qwen3_5MTPDraftModel

    target = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))
    config = {"model_type": "qwen3_5_mtp", "text_config": target["text_config"]}
    out_dir = target_dir / MTP_DRAFTER_DIR
    weights = _fresh_drafter(
        out_dir, config, lambda: Qwen3_5MTPDraftModel(ModelConfig.from_dict(config)), seed
    )
    # Random weights would never propose what the random target writes, and a test of the drafter
    # path needs drafts accepted as well as rejected. So the head passes the target's hidden state
    # through (fc: [0 | I]) and its layer adds little (small output projections): it proposes the
    # target's own prediction for the last position again, right on the fixture's loops and wrong
    # elsewhere, while its attention still reads and writes the drafter's KV cache.
    hidden = weights["fc.weight"].shape[0]
    weights["fc.weight"] = mx.concatenate([mx.zeros((hidden, hidden)), mx.eye(hidden)], axis=1)
    _quiet_layer(weights)
    weights = _save_weights(out_dir, weights)
    # Real Qwen3.5 checkpoints carry the head inside (`mtp.*`, which the target's load drops):
    # the same tensors go there too, so `--draft-model` on the target's own directory (mlx-vlm's
    # native-checkpoint splitter) is the same drafter.
    target_weights = target_dir / "model.safetensors"
    native = dict(mx.load(str(target_weights)))
    native.update({f"mtp.{name}": value for name, value in weights.items()})
    mx.save_safetensors(str(target_weights), native, metadata={"format": "mlx"})
    return out_dir


def build_dflash_drafter(target_dir: Path, *, seed: int = 2) -> Path:
    """Write a DFlash drafter (random weights, shaped as mlx-vlm's `qwen3_dflash`) for the target
    at `target_dir` into `target_dir/dflash-drafter`; returns the directory."""
    import mlx.core as mx
    from mlx_vlm.speculative.drafters.qwen3_dflash import DFlashDraftModel, ModelConfig

    target = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))["text_config"]
    layers = int(target["num_hidden_layers"])
    tokenizer = json.loads((target_dir / "tokenizer.json").read_text(encoding="utf-8"))
    mask = next(t["id"] for t in tokenizer["added_tokens"] if t["content"] == "<|object_ref_end|>")
    config = {
        "model_type": "qwen3",
        "architectures": ["DFlashDraftModel"],
        "hidden_size": target["hidden_size"],
        "intermediate_size": target["intermediate_size"],
        "num_hidden_layers": 1,
        # As many KV heads as heads: the value path below is an identity.
        "num_attention_heads": HIDDEN // HEAD_DIM,
        "num_key_value_heads": HIDDEN // HEAD_DIM,
        "head_dim": HEAD_DIM,
        "rms_norm_eps": 1e-6,
        "vocab_size": target["vocab_size"],
        "max_position_embeddings": target["max_position_embeddings"],
        "rope_theta": 10_000_000.0,
        "tie_word_embeddings": True,
        "block_size": 16,
        "num_target_layers": layers,
        # Every target layer, as the real checkpoints take several spread over the depth.
        "dflash_config": {"mask_token_id": mask, "target_layer_ids": list(range(layers))},
    }
    out_dir = target_dir / DFLASH_DRAFTER_DIR
    weights = _fresh_drafter(out_dir, config, lambda: DFlashDraftModel(ModelConfig.from_dict(config)), seed)
    # Random weights would never propose what the random target writes. So the drafter averages
    # its context: no queries (uniform attention), the block's own tokens silenced (a zero input
    # norm: they add nothing to the keys and values), values the identity, fc picking the last
    # target layer's hidden states (before the final norm, which the drafter's own norm stands
    # in for), a large output projection and no MLP: each draft is the argmax of the target's
    # hidden states averaged over the positions the drafter has been fed. Right where the target
    # keeps writing what it mostly predicted (the fixture's greedy loops), wrong elsewhere (its
    # sampled rows), and only if every row's context is its own.
    hidden = int(target["hidden_size"])
    fc = mx.zeros((hidden, hidden * layers))
    weights["fc.weight"] = mx.concatenate([fc[:, : hidden * (layers - 1)], mx.eye(hidden)], axis=1)
    for name in list(weights):
        if name.endswith(("q_proj.weight", "down_proj.weight", "input_layernorm.weight")):
            weights[name] = mx.zeros_like(weights[name])
        elif name.endswith("v_proj.weight"):
            weights[name] = mx.eye(hidden)
        elif name.endswith("o_proj.weight"):
            weights[name] = mx.eye(hidden) * 100.0
    _save_weights(out_dir, weights)
    return out_dir


def build_eagle3_drafter(target_dir: Path, *, seed: int = 3) -> Path:
    """Write an EAGLE-3 drafter (random weights, a Speculators-style `eagle3` checkpoint as mlx-vlm
    loads it) for the (4-layer, `DEEP_FAMILY`) target at `target_dir` into
    `target_dir/eagle3-drafter`; returns the directory."""
    import mlx.core as mx
    from mlx_vlm.speculative.drafters.eagle3 import Eagle3DraftModel, ModelConfig

    target = json.loads((target_dir / "config.json").read_text(encoding="utf-8"))["text_config"]
    layers = int(target["num_hidden_layers"])
    hidden = int(target["hidden_size"])
    config = {
        "model_type": "eagle3",
        "speculators_model_type": "eagle3",
        "transformer_layer_config": {
            "model_type": "llama",
            "hidden_size": hidden,
            "intermediate_size": target["intermediate_size"],
            "num_hidden_layers": 1,
            "num_attention_heads": HIDDEN // HEAD_DIM,
            "num_key_value_heads": KV_HEADS,
            "head_dim": HEAD_DIM,
            "rms_norm_eps": 1e-6,
            "vocab_size": target["vocab_size"],
            "max_position_embeddings": target["max_position_embeddings"],
            "rope_theta": 10_000.0,
            "tie_word_embeddings": True,
        },
        "draft_vocab_size": target["vocab_size"],
        "target_hidden_size": hidden,
        "tie_word_embeddings": True,
        # The three layers EAGLE-3 reads (HF hidden-state indexes: the outputs of layers 1-3).
        "eagle_aux_hidden_state_layer_ids": [layers - 2, layers - 1, layers],
        "block_size": 5,
    }
    out_dir = target_dir / EAGLE3_DRAFTER_DIR
    weights = _fresh_drafter(out_dir, config, lambda: Eagle3DraftModel(ModelConfig.from_dict(config)), seed)
    # As the MTP head above: fc passes the last target layer's hidden state through and the
    # layer adds little, so it proposes the target's own last prediction again (right on the
    # fixture's greedy loops, wrong elsewhere), while its attention reads and writes its KV cache.
    weights["fc.weight"] = mx.concatenate([mx.zeros((hidden, 2 * hidden)), mx.eye(hidden)], axis=1)
    _quiet_layer(weights)
    _save_weights(out_dir, weights)
    return out_dir


def _qwen3_5_deep(tokenizer: Tokenizer) -> FamilyFiles:
    """Qwen3.5 with 4 layers (linear, full, linear, full): EAGLE-3 reads three target layers."""
    files = _qwen3_5(tokenizer)
    files.config["text_config"]["num_hidden_layers"] = 4
    return files


DEEP_FAMILY = Family(
    "qwen3_5", "qwen3_5", "Qwen/Qwen3.5-9B, 4 layers (+ an EAGLE-3 drafter)", _QWEN3_TOKENIZER, _qwen3_5_deep
)


def _qwen3_5_moe(tokenizer: Tokenizer) -> FamilyFiles:
    """Qwen3.5/3.6-35B-A3B's shape: the hybrid text model with a sparse mixture of experts (top-2
    of 4 here; 8 of 256 there) plus a gated shared expert in every layer, no MTP head."""
    files = _qwen3_5(tokenizer)
    config = files.config
    config["architectures"] = ["Qwen3_5MoeForConditionalGeneration"]
    config["model_type"] = "qwen3_5_moe"
    config["vision_config"]["model_type"] = "qwen3_5_moe"
    text = config["text_config"]
    text["model_type"] = "qwen3_5_moe_text"
    for key in ("intermediate_size", "mtp_num_hidden_layers", "mtp_use_dedicated_embeddings"):
        del text[key]
    text.update(
        {
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": HIDDEN // 2,
            "shared_expert_intermediate_size": HIDDEN // 2,
            "norm_topk_prob": True,
            "router_aux_loss_coef": 0.001,
        }
    )
    return files


FAMILIES = (Family("qwen3_5", "qwen3_5", "Qwen/Qwen3.5-9B (+ its MTP head)", _QWEN3_TOKENIZER, _qwen3_5),)

# Served rows of the family matrix (training/families FAMILIES): Qwen3.5/3.6 dense and MoE.
SERVED_FAMILIES = (
    Family("qwen3_5", "qwen3_5", "Qwen/Qwen3.5-9B, Qwen3.6-27B (dense)", _QWEN3_TOKENIZER, _qwen3_5),
    Family(
        "qwen3_5_moe",
        "qwen3_5_moe",
        "Qwen/Qwen3.5-35B-A3B, Qwen3.6-35B-A3B (mixture of experts)",
        _QWEN3_TOKENIZER,
        _qwen3_5_moe,
    ),
)
