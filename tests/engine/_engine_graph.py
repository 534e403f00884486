"""The engine's import graph, read with ast (nothing imported): every import at every level,
functions too, relative ones resolved. Shared by the cycle check and the floors check."""

from __future__ import annotations

import ast
from pathlib import Path

ENGINE = Path(__file__).resolve().parents[2] / "service" / "vlmserve" / "engine"


def module_name(path: Path, root: Path = ENGINE) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(("vlmserve", "engine", *parts))


def imports_in(source: str, name: str, package: str, known: set[str]) -> set[str]:
    """The modules of `known` that module `name` (in `package`) imports."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):  # every level, functions too
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            candidates = [base, *(f"{base}.{alias.name}" for alias in node.names)]
        elif isinstance(node, ast.Import):
            candidates = [alias.name for alias in node.names]
        else:
            continue
        found.update(c for c in candidates if c in known and c != name)
    return found


def engine_imports(root: Path = ENGINE) -> dict[str, set[str]]:
    modules = {module_name(path, root): path for path in root.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        graph[name] = imports_in(path.read_text(encoding="utf-8"), name, package, set(modules))
    return graph
