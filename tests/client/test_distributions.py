"""The distributions: one wheel, built by the project's build backend, whose extras split what each
machine installs — the client library alone (no extra), the facade without MLX (`[facade]`), and
everything `vlmserve serve` runs (`[engine]` on a Mac, `[cpu]` / `[cuda]` on Linux). Read from the
built wheel's own metadata, as pip reads it.

The slow test installs that wheel (not editable) into a fresh virtual environment and runs
`vlmserve serve` from it on the squares model: the model must count the squares it is shown.
The fresh environment borrows the already installed dependencies (a path line to this
interpreter's site-packages, whose own .pth files, the editable install's among them, are not
run) instead of downloading them, and first checks that they satisfy every requirement the
wheel declares for `[cpu]`.
"""

from __future__ import annotations

import email.parser
import os
import re
import signal
import subprocess
import sys
import tarfile
import time
import tomllib
import zipfile
from pathlib import Path

import httpx
import pytest

from tests._services import REPO, free_port
from vlmserve.cli.blas import openblas_library

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
MLX = {"mlx", "mlx-vlm", "mlx-cpu", "mlx-metal", "mlx-cuda", "transformers"}


# The wheel is built once (`built_wheel`, tests/conftest.py) for this module and
# test_client_install.py: one xdist group runs them on one worker.
pytestmark = pytest.mark.xdist_group("built_wheel")


def _metadata(wheel: Path) -> email.message.Message:
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        return email.parser.Parser().parsestr(archive.read(name).decode())


def _closure(wheel: Path, extras: set[str]) -> set[str]:
    """The distributions `pip install 'vlmserve[extras]'` asks for directly (self-references expanded;
    `name[extra]` kept as written, lower case)."""
    requires = _metadata(wheel).get_all("Requires-Dist") or []
    wanted, todo, seen = set(), set(extras) | {""}, set()
    while todo:
        extra = todo.pop()
        seen.add(extra)
        for requirement in requires:
            spec, _, marker = requirement.partition(";")
            found = re.search(r"extra == [\"']([^\"']+)[\"']", marker)
            if (found.group(1) if found else "") != extra:
                continue
            name = re.split(r"[\s<>=!~(]", spec.strip(), maxsplit=1)[0].lower()
            if name.startswith("vlmserve["):
                todo |= set(name[len("vlmserve[") : -1].split(",")) - seen
            else:
                wanted.add(name)
    return wanted


def _names(requirements: set[str]) -> set[str]:
    return {name.partition("[")[0] for name in requirements}


def test_the_version_is_the_wheel_s(built_wheel: Path) -> None:
    assert _metadata(built_wheel)["Version"] == PROJECT["version"]
    assert built_wheel.name.startswith(f"vlmserve-{PROJECT['version']}-py3-none-any")


def test_the_client_library_alone_is_small(built_wheel: Path) -> None:
    client = _names(_closure(built_wheel, set()))
    assert client == {
        "grpcio", "grpcio-status", "grpcio-health-checking", "protobuf", "pillow", "pydantic",
        "opentelemetry-api", "pypdfium2",
    }  # fmt: skip
    assert not client & (MLX | {"fastapi", "uvicorn", "numpy", "psycopg"})


def test_the_facade_installs_without_mlx(built_wheel: Path) -> None:
    facade = _names(_closure(built_wheel, {"facade"}))
    assert {"fastapi", "uvicorn", "httpx"} <= facade
    assert not facade & MLX, facade & MLX


@pytest.mark.parametrize(
    ("extra", "mlx"),
    [("engine", "mlx"), ("cpu", "mlx[cpu]"), ("cuda", "mlx[cuda]"), ("engine-cpu", "mlx[cpu]")],
)
def test_the_engine_extras_bring_mlx_and_the_facade(built_wheel: Path, extra: str, mlx: str) -> None:
    wanted = _closure(built_wheel, {extra})
    assert mlx in wanted and "mlx-vlm" in wanted
    assert _closure(built_wheel, {"facade"}) <= wanted  # `vlmserve serve` runs both


def test_the_wheel_s_commands(built_wheel: Path) -> None:
    with zipfile.ZipFile(built_wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(name).decode()
    for line in (
        "vlmserve = vlmserve.cli.main:main",
        "vlmserve-engine = vlmserve.engine.cli:main",
        "vlmserve-facade = vlmserve.facade.cli:main",
    ):
        assert line in scripts


# Two more builds (the sdist, a wheel from it): make test and `make dist` check it, not test-fast.
@pytest.mark.slow
def test_the_sdist_builds_the_same_wheel(built_wheel: Path, tmp_path: Path) -> None:
    """The sdist holds what the wheel is built from (and the contract), not tests or fixtures."""
    done = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "sdist", "-d", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (sdist,) = tmp_path.glob("vlmserve-*.tar.gz")
    with tarfile.open(sdist) as archive:
        names = archive.getnames()
        archive.extractall(tmp_path / "src", filter="data")
    tops = {name.split("/")[1] for name in names if name.count("/") >= 1}
    # (hatchling adds .gitignore and PKG-INFO itself)
    expected = {
        "clients",
        "service",
        "facade",
        "protos",
        "README.md",
        "pyproject.toml",
        "PKG-INFO",
        ".gitignore",
    }
    assert tops == expected, tops
    (source,) = (tmp_path / "src").iterdir()
    done = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path / "wheel")],
        cwd=source, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    (rebuilt,) = (tmp_path / "wheel").glob("vlmserve-*.whl")
    with zipfile.ZipFile(rebuilt) as again, zipfile.ZipFile(built_wheel) as first:
        assert sorted(again.namelist()) == sorted(first.namelist())
        assert "vlmserve/facade/routes/ui_files/index.html" in first.namelist()


CHECK_REQUIREMENTS = """
import re, sys
from importlib import metadata
from packaging.requirements import Requirement
wanted = set(sys.argv[1].split(","))
missing = []
for text in metadata.requires("vlmserve") or []:
    requirement = Requirement(text)
    extras = {e for e in wanted if requirement.marker is None or requirement.marker.evaluate({"extra": e})}
    if requirement.name == "vlmserve" or not extras:
        continue
    try:
        found = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        missing.append(text); continue
    if not requirement.specifier.contains(found, prereleases=True):
        missing.append(f"{text} (found {found})")
dist = metadata.distribution("vlmserve")
print("location", dist.locate_file(""))
print("missing", missing)
"""


@pytest.mark.slow
@pytest.mark.needs_model
def test_the_installed_wheel_serves_the_squares_demo(built_wheel: Path, tmp_path: Path) -> None:
    from training.ask_squares import ask
    from training.squares import make_samples

    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    python = venv / "bin" / "python"
    subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--no-index",
         str(built_wheel)],
        check=True,
        timeout=120,
    )  # fmt: skip
    site = Path(
        subprocess.check_output([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
        .decode()
        .strip()
    )
    # Path lines only: the .pth files in those folders (the editable install's) do not run.
    borrowed = [entry for entry in sys.path if entry.endswith("site-packages")]
    (site / "borrowed_dependencies.pth").write_text("\n".join(borrowed) + "\n", encoding="utf-8")
    env = {"PATH": f"{venv / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    checked = subprocess.run(
        [str(python), "-c", CHECK_REQUIREMENTS, "cpu,engine,facade"],
        capture_output=True, text=True, timeout=60, check=True, env=env, cwd=tmp_path,
    ).stdout  # fmt: skip
    # The installed files, not the source tree, and nothing the extras need is missing.
    assert f"location {site}" in checked and "missing []" in checked, checked
    version = subprocess.run(
        [str(venv / "bin" / "vlmserve"), "--version"], capture_output=True, text=True, env=env, check=True
    )
    assert version.stdout.strip() == f"vlmserve {PROJECT['version']}"

    # An installed package has no fixture model: without one named, it says to name one.
    nameless = subprocess.run(
        [str(venv / "bin" / "vlmserve"), "engine", "--address", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120, check=False,
    )  # fmt: skip
    assert nameless.returncode == 2 and "no model given" in nameless.stderr, nameless.stderr[-2000:]

    port, engine_port = free_port(), free_port()
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen(
        [str(venv / "bin" / "vlmserve"), "serve", str(REPO / "models" / "qwen2-vl-squares"),
         "--port", str(port), "--engine-address", f"127.0.0.1:{engine_port}",
         "--store-path", str(tmp_path / "responses.sqlite3"), "--files-dir", str(tmp_path / "files")],
        cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()[-3000:]
            try:
                if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()[-3000:]
            time.sleep(0.2)
        samples = make_samples(3838, 6)
        answers = [ask(url, sample.png_bytes()).strip() for sample in samples]
        assert sum(a == s.answer for a, s in zip(answers, samples, strict=True)) >= 5, answers
    finally:
        serve.send_signal(signal.SIGTERM)
        try:
            serve.wait(timeout=60)
        finally:
            if serve.poll() is None:
                serve.kill()
                serve.wait()
            log.close()
    text = (tmp_path / "serve.log").read_text()
    # It ran from the fresh environment, with OpenBLAS preloaded where Debian has it.
    assert str(venv / "bin" / "vlmserve-engine") in text, text[-3000:]
    # The engine's start, phase by phase (engine/load_progress.py).
    for phase in (
        "reading weights (step 1 of 3",
        "building the engine (step 2 of 3",
        "warming up (step 3 of 3",
    ):
        assert phase in text, text[-3000:]
    assert re.search(r"loading \S+qwen2-vl-squares: done in [\d.]+ s \(reading weights", text), text[-3000:]
    if openblas_library() is not None:
        assert "OpenBLAS is not preloaded" not in text, text[-3000:]
    assert serve.returncode == 0, text[-3000:]
    assert os.path.exists(tmp_path / "responses.sqlite3")
