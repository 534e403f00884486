"""docs/architecture.md is the engine's table of contents (`vlmserve.engine` is a namespace package,
with no `__init__.py` to list its modules) and lists the facade's floors: every module of both is
listed, and every file the request paths name exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")


def test_every_engine_module_is_listed() -> None:
    engine = ROOT / "service" / "vlmserve" / "engine"
    modules = sorted(
        path.relative_to(engine).as_posix() for path in engine.rglob("*.py") if path.name != "__init__.py"
    )
    missing = [name for name in modules if f"| `{name}` |" not in DOC]
    assert not missing, f"add them to docs/architecture.md: {missing}"
    assert not (ROOT / "service" / "vlmserve" / "engine" / "__init__.py").exists()


def test_the_hops_name_files_that_exist() -> None:
    named = set(re.findall(r"`([\w/]+\.py)`", DOC))
    sources = {path.relative_to(ROOT).as_posix() for path in ROOT.glob("*/vlmserve/**/*.py")}
    sources |= {path.relative_to(ROOT).as_posix() for path in ROOT.glob("tests/**/*.py")}
    missing = [name for name in named if not any(source.endswith(name) for source in sources)]
    assert not missing, missing


def test_every_facade_module_is_in_its_floor_row() -> None:
    facade = ROOT / "facade" / "vlmserve" / "facade"
    rows = {line.split("|")[1].strip(): line for line in DOC.splitlines() if line.startswith("| `")}
    missing = []
    for path in sorted(facade.rglob("*.py")):
        if path.name == "__init__.py":
            continue
        relative = path.relative_to(facade)
        if len(relative.parts) == 1:
            found = any(f"`{path.name}`" in row.split("|")[1] for row in rows.values())
        else:
            row = rows.get(f"`{relative.parts[0]}/`", "")
            found = f"`{path.name}`" in row
        if not found:
            missing.append(relative.as_posix())
    assert not missing, f"add them to docs/architecture.md's facade floors: {missing}"
