"""The client install (`pip install vlmserve`, no extras) is enough for the client library: its
modules import with only the base dependencies (and what those depend on) — no mlx, no facade
stack (fastapi, uvicorn, prometheus, psycopg), no server-only shared code (`vlmserve.server`:
settings, logs, lifeline, secrets). The built wheel shows it on the installed files: the client's
packages carry no server-only module, and they import on their own, the server's files taken away.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

# The wheel is built once (`built_wheel`, tests/conftest.py) for this module and
# test_distributions.py: one xdist group runs them on one worker.
pytestmark = pytest.mark.xdist_group("built_wheel")
ROOT = Path(__file__).resolve().parents[2]
CLIENT_MODULES = ["vlmserve.client", "vlmserve.responses", "vlmserve.chat", "vlmserve.anthropic"]
# What the client library is made of in the wheel: its modules, what they share with the servers,
# and the contract's generated code.
CLIENT_PACKAGES = [*(m.replace(".", "/") for m in CLIENT_MODULES), "vlmserve/common", "vlmserve/engine/v1"]
SOURCE_ROOTS = [ROOT / "clients", ROOT / "service", ROOT / "facade"]
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
import importlib.abc, os, sys
allowed = set(sys.argv[1].split(","))
if os.environ.get("CLIENT_SITE"):  # only the unpacked wheel, not the editable source roots
    roots = set(os.environ["SOURCE_ROOTS"].split(os.pathsep))
    sys.path[:] = [os.environ["CLIENT_SITE"], *(p for p in sys.path if os.path.realpath(p) not in roots)]
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


@pytest.fixture(scope="module")
def wheel(built_wheel: Path) -> zipfile.ZipFile:
    """The project's wheel (`built_wheel`, tests/conftest.py: built once with test_distributions)."""
    return zipfile.ZipFile(built_wheel)


def _modules_in(names: list[str], package: str) -> set[str]:
    return {name.removesuffix(".py").replace("/", ".") for name in names if name.startswith(package + "/")}


def test_the_wheel_s_client_packages_carry_no_server_only_module(wheel: zipfile.ZipFile) -> None:
    names = [name for name in wheel.namelist() if name.endswith(".py")]
    client = set().union(*(_modules_in(names, package) for package in CLIENT_PACKAGES))
    assert "vlmserve.client._sync" in client and "vlmserve.common.images" in client
    assert _modules_in(names, "vlmserve/common") == {
        "vlmserve.common.__init__",
        "vlmserve.common.clips",
        "vlmserve.common.documents",
        "vlmserve.common.images",
        "vlmserve.common.tracing",
        "vlmserve.common.wire_encode",
        "vlmserve.common.wire_size",
    }
    leaked = sorted(m for m in client for server in SERVER_ONLY if m.startswith(server))
    assert not leaked, leaked
    # The engine and the facade still get theirs, from the server package.
    server = _modules_in(names, "vlmserve/server")
    for module in ("settings", "logs", "lifeline", "secrets", "netaddr"):
        assert f"vlmserve.server.{module}" in server


def _import_client_from(site: Path) -> subprocess.CompletedProcess[str]:
    allowed = _allowed_top_level_modules()
    env = {
        **os.environ,
        "CLIENT_SITE": str(site),
        "SOURCE_ROOTS": os.pathsep.join(os.path.realpath(root) for root in SOURCE_ROOTS),
    }
    return subprocess.run(
        [sys.executable, "-c", GUARD, ",".join(sorted(allowed)), ",".join(CLIENT_MODULES)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=env,
        cwd=site,
    )


def test_the_wheel_s_client_packages_import_with_the_server_s_files_taken_away(
    wheel: zipfile.ZipFile, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    kept = [n for n in wheel.namelist() if any(n.startswith(package + "/") for package in CLIENT_PACKAGES)]
    wheel.extractall(site, members=kept)
    assert not (site / "vlmserve" / "server").exists() and not (site / "vlmserve" / "facade").exists()
    done = _import_client_from(site)
    assert done.returncode == 0, done.stderr[-2000:]
    loaded = set(done.stdout.strip().split(","))
    assert set(CLIENT_MODULES) <= loaded
    assert not any(name.startswith(tuple(SERVER_ONLY)) for name in loaded)


def test_the_unpacked_client_is_what_is_imported(wheel: zipfile.ZipFile, tmp_path: Path) -> None:
    """The check above can fail: the editable source roots are off the path, so a client package
    missing from the unpacked files is missing."""
    site = tmp_path / "site"
    kept = [n for n in wheel.namelist() if n.startswith(("vlmserve/client/", "vlmserve/engine/v1/"))]
    wheel.extractall(site, members=kept)
    done = _import_client_from(site)
    assert done.returncode != 0
    assert "vlmserve.responses" in done.stderr or "vlmserve.common" in done.stderr
