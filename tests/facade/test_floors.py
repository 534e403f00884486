"""The facade's floors (docs/architecture.md): a module imports only from its own floor or the
floors below it, and no route module is a library for another."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "facade" / "vlmserve" / "facade"
# Lowest first. `settings` is below everything: every floor reads its settings, and the settings
# types (API keys, remote images, model routes) live there too.
# `state` is what the routes share (settings, engine client, store, services), made by the app.
FLOORS = [
    "settings", "http", "remote_images", "store", "documents",
    "engines", "responses", "state", "routes", "top",
]  # fmt: skip
TOP = {"__init__", "app", "cli", "launch"}


def floor_of(module: str) -> str:
    """`vlmserve.facade.http.errors` -> `http`; top-level modules are `top` (settings aside)."""
    head = module.removeprefix("vlmserve.facade").lstrip(".").split(".", 1)[0]
    if head in ("", *TOP):
        return "top"
    return head


def imports_of(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            if node.module == "vlmserve.facade":
                names.update(f"vlmserve.facade.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level:
            names.add(f"relative:{node.module}")
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return {name for name in names if name.startswith(("vlmserve.facade", "relative:"))}


MODULES = sorted(PACKAGE.rglob("*.py"))


def test_every_module_is_on_a_known_floor() -> None:
    floors = {
        floor_of("vlmserve.facade." + ".".join(p.relative_to(PACKAGE).with_suffix("").parts)) for p in MODULES
    }
    assert floors <= set(FLOORS), floors - set(FLOORS)


@pytest.mark.parametrize("path", MODULES, ids=[p.relative_to(PACKAGE).as_posix() for p in MODULES])
def test_imports_go_down_or_sideways(path: Path) -> None:
    relative = path.relative_to(PACKAGE).as_posix()
    own = floor_of("vlmserve.facade." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts))
    for name in sorted(imports_of(path)):
        assert not name.startswith("relative:"), f"{relative}: absolute imports only ({name})"
        target = floor_of(name)
        assert FLOORS.index(target) <= FLOORS.index(own), f"{relative} ({own}) imports up: {name}"
        if own == "routes" and target == "routes":
            pytest.fail(f"{relative}: a route module is not a library for another ({name})")


def test_the_check_sees_an_upward_import(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text("from vlmserve.facade.app import create_app\n", encoding="utf-8")
    assert floor_of(next(iter(imports_of(module)))) == "top"


def _all_imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
    return names


@pytest.mark.parametrize(
    ("relative", "foreign"),
    [
        # The engine call knows the engine, never the store.
        ("responses/engine_call.py", ("vlmserve.facade.store", "vlmserve.facade.responses.recorder")),
        # The recorder knows the store, never the engine client.
        ("responses/recorder.py", ("vlmserve.client", "grpc", "vlmserve.facade.responses.engine_call")),
    ],
)
def test_a_response_s_parts_keep_to_their_job(relative: str, foreign: tuple[str, ...]) -> None:
    imported = _all_imports(PACKAGE / relative)
    assert not {name for name in imported if name.startswith(foreign)}, relative
