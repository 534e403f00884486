"""Tiny random-weight fixtures of the VLM families people run (docs/models.md, "Fixtures").

`FAMILIES` maps a fixture name (the directory it is written to) to its `Family`; `build_family`
writes one; the per-family engine tests run every member. `DRAFTER_FAMILIES` are targets with a
drafter model (`build_drafter` writes it into the target's directory), for speculative decoding's
`--draft-model`; `qwen3_5` is in both (built without its drafter in `FAMILIES`). The command line is
``python -m training.make_family_fixtures``.
"""

from __future__ import annotations

from . import gemma, gemma4, glm, idefics, llama, mistral, qwen, qwen3_5
from ._base import Family, FamilyFiles
from .build import build_family

__all__ = ["DRAFTER_FAMILIES", "FAMILIES", "Family", "FamilyFiles", "build_drafter", "build_family"]

_MODULES = (qwen, gemma, gemma4, idefics, mistral, llama, glm)
FAMILIES: dict[str, Family] = {
    **{family.name: family for module in _MODULES for family in module.FAMILIES},
    **{family.name: family for family in qwen3_5.SERVED_FAMILIES},
}

# Target with a drafter (its directory name) -> the function writing the drafter into the
# target's directory (returns it): Qwen3.5 with its MTP head, with a DFlash drafter, and (4
# layers) with an EAGLE-3 drafter.
DRAFTER_FAMILIES = {
    **{family.name: family for family in qwen3_5.FAMILIES},
    **{f"{family.name}_dflash": family for family in qwen3_5.FAMILIES},
    "qwen3_5_eagle3": qwen3_5.DEEP_FAMILY,
}
build_drafter = {
    "qwen3_5": qwen3_5.build_mtp_drafter,
    "qwen3_5_dflash": qwen3_5.build_dflash_drafter,
    "qwen3_5_eagle3": qwen3_5.build_eagle3_drafter,
}
