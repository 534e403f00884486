"""The family fixture models (training/families), built once per test session into a temp dir.

Building all of them takes a few seconds, so nothing is committed: `family_models` maps each
family name to its model directory, laid out like a hub checkout.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from training.families import DRAFTER_FAMILIES, FAMILIES, build_drafter, build_family

FAMILY_NAMES = tuple(sorted(FAMILIES))


@pytest.fixture(scope="session")
def family_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("family-models")
    return {name: build_family(FAMILIES[name], root / name) for name in FAMILY_NAMES}


@pytest.fixture(scope="session")
def drafter_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Each drafter family's (target directory, drafter directory)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("drafter-models")
    built = {}
    for name, family in DRAFTER_FAMILIES.items():
        target = build_family(family, root / name)
        built[name] = (target, build_drafter[name](target))
    return built
