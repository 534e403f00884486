"""Tiny random-weight fixtures of the VLM families people run (docs/models.md, "Fixtures").

`FAMILIES` maps a fixture name (the directory it is written to) to its `Family`; `build_family`
writes one. The command line is ``python -m training.make_family_fixtures``.
"""

from __future__ import annotations

from . import gemma, idefics, llama, mistral, qwen
from ._base import Family, FamilyFiles
from .build import build_family

__all__ = ["FAMILIES", "Family", "FamilyFiles", "build_family"]

FAMILIES: dict[str, Family] = {
    family.name: family for module in (qwen, gemma, idefics, mistral, llama) for family in module.FAMILIES
}
