"""Write tiny random-weight models of the VLM families people run, one per family (docs/models.md).

    python -m training.make_family_fixtures --out DIR [--family NAME ...]

writes DIR/<name>/ for each family (all by default), each a directory laid out like a hub
checkout that ``mlx_vlm.load`` opens by path: ``config.json`` shaped like the real checkpoint's
(same keys, same nesting, small dimensions), ``generation_config.json`` with the real eos set,
the family's real processor files (``preprocessor_config.json``, ``processor_config.json``)
and chat template text (``chat_template.json`` and ``tokenizer_config.json``; sources in
training/families/chat_templates.py and docs/models.md), a tokenizer trained locally in the family's
style with every special token the processor needs (training/families/vocab.py), and
random float16 weights from mlx-vlm's own model class (``model.safetensors``).

Each model is under 2 MB and builds in about a second, so tests build them into a session
temporary directory instead of committing them (tests/_family_models.py). Image sizes are
shrunk with the model: every family turns an image into a few dozen tokens at most.

Families (directory name: what it stands for):
  qwen2_5_vl         Qwen2.5-VL-*-Instruct (M-RoPE, windowed vision attention, no tools in template)
  qwen3_vl           Qwen3-VL-*-Instruct (interleaved M-RoPE, deepstack, Hermes tool calls)
  qwen3_vl_thinking  Qwen3-VL-*-Thinking (as qwen3_vl; the template opens <think>)
  qwen3_vl_moe       Qwen3-VL-30B-A3B (as qwen3_vl, mixture-of-experts MLPs; mlx-vlm can shard it)
  gemma3             Gemma 3 *-it (sliding-window layers, no system role, fixed image tokens)
  gemma4             Gemma 4 26B-A4B-it (sliding + global layers, MoE, <|tool_call> calls)
  idefics3           SmolVLM-Instruct (image splitting into tiles + a global image)
  mistral3           Mistral Small 3.1 (Pixtral vision, [IMG_BREAK]/[IMG_END] rows, [TOOL_CALLS])
  llama4             Llama 4 Scout (MoE, chunked local attention + NoPE layers, image tiles)
  llava              LLaVA 1.5 (CLIP vision, USER:/ASSISTANT: template)
  qwen3_5            Qwen3.5/3.6 dense (Gated DeltaNet + full attention) and its MTP drafter
                     head in qwen3_5/mtp-drafter (speculative decoding's --draft-model)
  qwen3_5_moe        Qwen3.5/3.6-35B-A3B (as qwen3_5, mixture of experts + a shared expert)
  qwen3_5_dflash     the same Qwen3.5 and a DFlash drafter (mlx-vlm's qwen3_dflash) in
                     qwen3_5_dflash/dflash-drafter
  qwen3_5_eagle3     Qwen3.5 with 4 layers and an EAGLE-3 drafter (mlx-vlm's eagle3) in
                     qwen3_5_eagle3/eagle3-drafter
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from training.families import DRAFTER_FAMILIES, FAMILIES, build_drafter, build_family

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    parser.add_argument("--out", type=Path, required=True, help="directory to write DIR/<family>/ into")
    parser.add_argument(
        "--family",
        action="append",
        choices=sorted({**FAMILIES, **DRAFTER_FAMILIES}),
        help="a family to build (repeatable; default: all)",
    )
    parser.add_argument("--seed", type=int, default=0, help="weight initialisation seed")
    args = parser.parse_args(argv)
    families = {**FAMILIES, **DRAFTER_FAMILIES}
    for name in args.family or sorted(families):
        out_dir = build_family(families[name], args.out / name, seed=args.seed)
        if name in build_drafter:
            build_drafter[name](out_dir)
        size = sum(p.stat().st_size for p in out_dir.rglob("*") if p.is_file())
        print(f"wrote {out_dir} ({families[name].stands_for}, {size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
