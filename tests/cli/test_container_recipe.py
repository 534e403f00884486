"""facade/Dockerfile: the facade alone, without MLX. This machine has no Docker daemon to build it,
so the recipe is checked as far as it can be here: its instructions parse; the bases are pinned
to a tag; every COPY source exists; it installs the wheel's `[facade]` extra and nothing of MLX
(that extra's closure has none: tests/client/test_distributions.py); it runs as a non-root user;
each ENV it sets is a declared facade setting with a value that setting accepts; it exposes the
port it sets and checks /healthz; it starts `vlmserve facade`. Where a daemon answers,
`docker build --check` lints it too."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from vlmserve.facade.settings import FacadeSettings
from vlmserve.server.settings import declared, load

ROOT = Path(__file__).resolve().parents[2]
RECIPE = ROOT / "facade" / "Dockerfile"


def instructions(text: str) -> list[tuple[str, str]]:
    joined = re.sub(r"\\\n\s*", " ", text)
    found = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            found.append((keyword.upper(), rest.strip()))
    return found


STEPS = instructions(RECIPE.read_text(encoding="utf-8"))
FINAL = STEPS[max(i for i, (keyword, _) in enumerate(STEPS) if keyword == "FROM") :]


def _env(steps: list[tuple[str, str]]) -> dict[str, str]:
    return dict(
        word.split("=", 1) for keyword, rest in steps if keyword == "ENV" for word in shlex.split(rest)
    )


def test_known_instructions_and_pinned_bases() -> None:
    known = {"FROM", "WORKDIR", "COPY", "RUN", "USER", "ENV", "VOLUME", "EXPOSE", "HEALTHCHECK", "ENTRYPOINT"}
    assert {keyword for keyword, _ in STEPS} <= known
    for keyword, rest in STEPS:
        if keyword == "FROM":
            image = rest.split()[0]
            assert ":" in image and not image.endswith(":latest"), image


def test_copied_sources_exist() -> None:
    for keyword, rest in STEPS:
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _destination = rest.split()
            for source in sources:
                assert (ROOT / source).exists(), source


def test_installs_the_facade_extra_and_no_mlx() -> None:
    runs = " ".join(rest for keyword, rest in FINAL if keyword == "RUN")
    assert '"${wheel}[facade]"' in runs
    assert "mlx" not in runs.lower()


def test_runs_as_a_user_and_starts_the_facade() -> None:
    users = [rest for keyword, rest in FINAL if keyword == "USER"]
    assert users and users[-1] not in ("root", "0")
    entry = next(rest for keyword, rest in FINAL if keyword == "ENTRYPOINT")
    assert json.loads(entry) == ["vlmserve", "facade"]


def test_its_settings_are_declared_and_valid() -> None:
    env = _env(FINAL)
    names = {setting.env for setting in declared(FacadeSettings)}
    assert set(env) <= names, set(env) - names
    settings = load(FacadeSettings, environ=env)
    assert settings.host == "0.0.0.0"
    exposed = [rest for keyword, rest in FINAL if keyword == "EXPOSE"]
    assert exposed == [str(settings.port)]
    check = next(rest for keyword, rest in FINAL if keyword == "HEALTHCHECK")
    assert f"127.0.0.1:{settings.port}/healthz" in check


def _daemon() -> bool:
    if shutil.which("docker") is None:
        return False
    return subprocess.run(["docker", "info"], capture_output=True, timeout=20, check=False).returncode == 0


@pytest.mark.slow
@pytest.mark.skipif(not _daemon(), reason="no Docker daemon here")
def test_docker_build_check() -> None:
    done = subprocess.run(
        ["docker", "build", "--check", "-f", str(RECIPE), str(ROOT)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
