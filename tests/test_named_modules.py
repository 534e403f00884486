"""Comments and docstrings name modules that exist: a dotted `vlmserve.…` name resolves to a
module (and its first attribute to a name that module defines), and a file path such as
`loop/batch.py` ends the path of a file in this repository, or of mlx-vlm's, mlx-lm's,
transformers' or the standard library's, which comments also cite. The Markdown documents' file
paths too (their dotted names are often not modules: gRPC services, span attributes). A rename
that leaves an old name behind in prose fails here."""

from __future__ import annotations

import ast
import importlib.util
import io
import re
import sysconfig
import tokenize
from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = ("clients", "service", "facade")  # each holds a `vlmserve/` tree
SCANNED = ("clients", "service", "facade", "tests", "bench", "training", "scripts")
SKIPPED_PARTS = {"__pycache__", "node_modules", ".venv"}
CITED_PACKAGES = ("mlx_vlm", "mlx_lm", "transformers")

PATH = re.compile(r"(?<![\w./-])([\w./-]*\w\.py)\b")
DOTTED = re.compile(r"(?<![\w.])(vlmserve(?:\.\w+)+)")


def _python_files() -> list[Path]:
    files = []
    for top in SCANNED:
        for path in (ROOT / top).rglob("*.py"):
            if SKIPPED_PARTS.isdisjoint(path.parts) and not path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
                files.append(path)
    return sorted(files)


def prose(source: str) -> Iterator[tuple[int, str]]:
    """(first line, text) of every comment and docstring."""
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                yield node.body[0].lineno, docstring


@cache
def _path_tails() -> frozenset[str]:
    """Every tail of every file's path here: `loop/batch.py` and `batch.py` for
    service/vlmserve/engine/loop/batch.py."""
    tails: set[str] = {path.name for path in ROOT.glob("*.py")}
    for top in ROOT.iterdir():
        if top.is_dir() and top.name not in SKIPPED_PARTS | {".git"}:
            for path in top.rglob("*.py"):
                parts = path.relative_to(ROOT).parts
                tails.update("/".join(parts[i:]) for i in range(len(parts)))
    return frozenset(tails)


@cache
def _libraries() -> list[Path]:
    """The cited libraries' folders (found, not imported) and the standard library's."""
    found = [Path(sysconfig.get_paths()["stdlib"])]
    for name in CITED_PACKAGES:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations:
            found += [Path(location) for location in spec.submodule_search_locations]
    return found


def _in_a_library(name: str) -> bool:
    """A path in a cited library, from its package's folder (`speculative/cache_state.py`,
    `mlx_vlm/speculative/cache_state.py`, `models/llama4/processing_llama4.py`); a bare file
    name is one of ours."""
    return "/" in name and any(
        (library / name).is_file() or (library.parent / name).is_file() for library in _libraries()
    )


@cache
def _modules() -> dict[str, Path]:
    """`vlmserve.engine.loop` -> its folder; `vlmserve.engine.loop.batch` -> its file."""
    found: dict[str, Path] = {}
    for top in SOURCE_ROOTS:
        base = ROOT / top
        for path in (base / "vlmserve").rglob("*"):
            if not SKIPPED_PARTS.isdisjoint(path.parts):
                continue
            if path.is_dir():
                found[".".join(path.relative_to(base).parts)] = path
            elif path.suffix in (".py", ".pyi") and path.stem != "__init__":
                found[".".join(path.relative_to(base).with_suffix("").parts)] = path
    found["vlmserve"] = ROOT / SOURCE_ROOTS[0] / "vlmserve"
    return found


@cache
def _defined(path: Path) -> frozenset[str]:
    """Names a module (or a package's `__init__.py`) defines at its top level."""
    if path.is_dir():
        path = path / "__init__.py"
        if not path.exists():
            return frozenset()
    names: set[str] = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((alias.asname or alias.name).split(".")[0] for alias in node.names)
    return frozenset(names)


def unresolved_dotted(name: str) -> str | None:
    """Why a dotted `vlmserve` name names nothing, or None: its longest module prefix must
    define the next part (deeper parts, a class's attributes, are not checked)."""
    parts = name.split(".")
    modules = _modules()
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in modules:
            if end == len(parts) or parts[end] in _defined(modules[prefix]):
                return None
            return f"{prefix} has no {parts[end]!r}"
    return "no such module"


def unresolved_path(name: str) -> str | None:
    name = name.lstrip("./")
    return None if name in _path_tails() or _in_a_library(name) else "no such file"


def _unresolved(text: str) -> Iterator[tuple[int, str, str]]:
    """(offset, name, why) of each name in `text` that resolves to nothing."""
    for match in PATH.finditer(text):
        if reason := unresolved_path(match.group(1)):
            yield match.start(), match.group(1), reason
    for match in DOTTED.finditer(text):
        if reason := unresolved_dotted(match.group(1)):
            yield match.start(), match.group(1), reason


def stale_names(path: Path) -> list[str]:
    source = path.read_text(encoding="utf-8")
    if next(_unresolved(source), None) is None:
        return []  # nothing unresolved anywhere in the file: no need to tell prose from code
    return [
        f"{first + text.count(chr(10), 0, offset)}: {name} ({reason})"
        for first, text in prose(source)
        for offset, name, reason in _unresolved(text)
    ]


def test_comments_name_modules_that_exist() -> None:
    files = _python_files()
    assert len(files) > 300  # the walk sees the repository
    stale = [f"{path.relative_to(ROOT)}:{entry}" for path in files for entry in stale_names(path)]
    assert not stale, "\n".join(stale)


def _markdown_files() -> list[Path]:
    found = [path for path in ROOT.glob("*.md")]
    for top in ("docs", "models", "bench", "training", "tests"):
        found += [path for path in (ROOT / top).rglob("*.md") if SKIPPED_PARTS.isdisjoint(path.parts)]
    return sorted(found)


def test_documents_name_files_that_exist() -> None:
    stale = []
    for path in _markdown_files():
        text = path.read_text(encoding="utf-8")
        for match in PATH.finditer(text):
            if reason := unresolved_path(match.group(1)):
                line = text.count("\n", 0, match.start()) + 1
                stale.append(f"{path.relative_to(ROOT)}:{line}: {match.group(1)} ({reason})")
    assert not stale, "\n".join(stale)


@pytest.mark.parametrize(
    ("name", "resolves"),
    [
        ("vlmserve.engine.loop.batch", True),
        ("vlmserve.engine.kv.layout.KVLayout", True),
        ("vlmserve.engine.kv.layout.KVLayout.bits", True),
        ("vlmserve.engine.loop.kv_cache", False),  # moved to kv/
        ("vlmserve.engine.kv.layout.NoSuchThing", False),
    ],
)
def test_a_dotted_name_resolves_to_a_module_and_a_name(name: str, resolves: bool) -> None:
    assert (unresolved_dotted(name) is None) is resolves


@pytest.mark.parametrize(
    ("name", "resolves"),
    [
        ("loop/batch.py", True),
        ("kv/rollback.py", True),
        ("tests/engine/test_floors.py", True),
        ("mlx_vlm/utils.py", True),  # a library the comments cite
        ("loop/kv_cache.py", False),
        ("kv_cache.py", False),
    ],
)
def test_a_path_resolves_to_a_file(name: str, resolves: bool) -> None:
    assert (unresolved_path(name) is None) is resolves


def test_comments_and_docstrings_are_read(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text(
        '"""See loop/kv_cache.py."""\n\n'
        "# vlmserve.engine.no_such_module\n"
        'X = "loop/kv_cache.py"  # strings are not prose\n',
        encoding="utf-8",
    )
    assert sorted(entry.split(":")[0] for entry in stale_names(module)) == ["1", "3"]
