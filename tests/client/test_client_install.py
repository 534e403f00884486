"""The client install (`pip install vlmserve`, no extras) is enough for the client library: its
modules import with only the base dependencies (and what those depend on) — no mlx, no facade
stack (fastapi, uvicorn, prometheus, psycopg), no server-only shared code (settings, logs,
lifeline, secrets)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLIENT_MODULES = ["vlmserve.client", "vlmserve.responses", "vlmserve.chat", "vlmserve.anthropic"]
# Shared code that only the engine and the facade use: a client import must not load it.
SERVER_ONLY = [
    "vlmserve.server",
    "vlmserve.engine.rpc",
    "vlmserve.facade",
]


def _name(requirement: str) -> str:
    return re.split(r"[\s\[<>=!~;]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _base_distributions() -> set[str]:
    """The base dependencies of pyproject.toml and, recursively, theirs (extras left out)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    todo = [_name(requirement) for requirement in project["dependencies"]]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        for requirement in metadata.requires(name) or []:
            if "extra ==" not in requirement:
                todo.append(_name(requirement))
    return seen


def _allowed_top_level_modules() -> set[str]:
    allowed = _base_distributions()
    return {
        module
        for module, distributions in metadata.packages_distributions().items()
        if any(d.lower().replace("_", "-") in allowed for d in distributions)
    }


GUARD = """
import importlib.abc, sys
allowed = set(sys.argv[1].split(","))
class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        top = name.partition(".")[0]
        if top in sys.stdlib_module_names or top in allowed or top == "vlmserve" or top.startswith("_"):
            return None
        raise ImportError(f"not in the client install: {name}")
sys.meta_path.insert(0, Refuse())
import importlib
for module in sys.argv[2].split(","):
    importlib.import_module(module)
print(",".join(sorted(name for name in sys.modules if name.startswith("vlmserve"))))
"""


def test_base_dependencies_are_the_client_s_own() -> None:
    base = _base_distributions()
    for server_package in ("mlx", "mlx-vlm", "fastapi", "uvicorn", "prometheus-client", "psycopg"):
        assert server_package not in base


def test_client_modules_import_with_the_base_install_only() -> None:
    allowed = _allowed_top_level_modules()
    assert "grpc" in allowed and "pydantic" in allowed  # the resolution above works
    assert "mlx" not in allowed and "fastapi" not in allowed
    done = subprocess.run(
        [sys.executable, "-c", GUARD, ",".join(sorted(allowed)), ",".join(CLIENT_MODULES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.strip().split(","))
    assert set(CLIENT_MODULES) <= loaded
    pulled = sorted(name for name in loaded for server in SERVER_ONLY if name.startswith(server))
    assert not pulled, f"a client import loads server-only code: {pulled}"


def test_the_guard_refuses_what_the_client_install_lacks() -> None:
    """The check above can fail: importing the facade under the same guard is refused."""
    allowed = _allowed_top_level_modules()
    done = subprocess.run(
        [sys.executable, "-c", GUARD, ",".join(sorted(allowed)), "vlmserve.facade.app"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode != 0
    assert "not in the client install" in done.stderr
