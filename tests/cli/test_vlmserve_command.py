"""`vlmserve`: one command whose subcommands are the project's programs. Each `--help` is built
from that program's settings declaration (every declared flag shows up under the new name), the
old entry points stay, the version comes from pyproject.toml, and a subcommand whose extra is
missing says which extra to install."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path
from typing import Any

import pytest

from vlmserve.cli import main as cli
from vlmserve.cli.blas import openblas_preload
from vlmserve.facade.launch import LaunchSettings, parse_args, with_positional_models
from vlmserve.facade.settings import FacadeSettings
from vlmserve.server.settings import declared
from vlmserve.server.version import version

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    try:
        code: int | str | None = cli.main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out = capsys.readouterr()
    return (code if isinstance(code, int) else (0 if code is None else 1)), out.out + out.err


def test_the_entry_points() -> None:
    scripts = PROJECT["scripts"]
    assert scripts["vlmserve"] == "vlmserve.cli.main:main"
    # The old ones keep working.
    assert scripts["vlmserve-engine"] == "vlmserve.engine.cli:main"
    assert scripts["vlmserve-facade"] == "vlmserve.facade.cli:main"


def test_version_comes_from_pyproject(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--version")
    assert code == 0
    assert out.strip() == f"vlmserve {PROJECT['version']}" == f"vlmserve {version()}"


def test_help_lists_every_command(capsys: pytest.CaptureFixture[str]) -> None:
    code, out = run(capsys, "--help")
    assert code == 0
    for name in ("serve", "engine", "facade", "models", "doctor", "service"):
        assert f"    {name}" in out


def test_no_command_or_an_unknown_one_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    assert run(capsys)[0] == 2
    code, out = run(capsys, "frobnicate")
    assert code == 2 and "invalid choice" in out


def _flags(model: type[Any]) -> list[str]:
    return [str(s.flag) for s in declared(model) if s.flag is not None]


@pytest.mark.parametrize(
    ("command", "settings"),
    [("serve", LaunchSettings), ("facade", FacadeSettings), ("doctor", LaunchSettings)],
)
def test_each_help_is_generated_from_the_settings(
    capsys: pytest.CaptureFixture[str], command: str, settings: type[Any]
) -> None:
    code, out = run(capsys, command, "--help")
    assert code == 0
    assert out.startswith(f"usage: vlmserve {command} ")
    missing = [flag for flag in _flags(settings) if flag not in out]
    assert not missing and len(_flags(settings)) > 20


def test_engine_help_is_generated_from_the_settings(capsys: pytest.CaptureFixture[str]) -> None:
    from vlmserve.engine.cli import EngineCommand

    code, out = run(capsys, "engine", "--help")
    assert code == 0 and out.startswith("usage: vlmserve engine ")
    assert not [flag for flag in _flags(EngineCommand) if flag not in out]


def test_serve_takes_models_positionally() -> None:
    settings, _ = parse_args(["models/qwen2-vl-squares"], environ={})
    assert settings.model == "models/qwen2-vl-squares" and settings.models == ()
    settings, facade_flags = parse_args(["a=models/x", "b=models/y", "--port", "9000"], environ={})
    assert settings.models == ("a=models/x", "b=models/y") and settings.model is None
    assert facade_flags == ["--port", "9000"]


@pytest.mark.parametrize(
    ("given", "model", "why"),
    [
        (["a", "b"], None, "several models need ids"),
        (["a=x", "b"], None, "give one MODEL"),
        (["x"], "y", "both positionally and with --model"),
    ],
)
def test_positional_models_refused(given: list[str], model: str | None, why: str) -> None:
    with pytest.raises(ValueError, match=why):
        with_positional_models(LaunchSettings(model=model), given)


def test_a_missing_extra_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.import_module

    def without_mlx(name: str, package: str | None = None) -> Any:
        if name == "vlmserve.engine.cli":
            raise ModuleNotFoundError("No module named 'mlx'", name="mlx")
        return real(name, package)

    monkeypatch.setattr(cli.importlib, "import_module", without_mlx)
    monkeypatch.setenv("VLMSERVE_NO_BLAS_PRELOAD", "1")
    with pytest.raises(SystemExit, match=r"needs mlx.*vlmserve\[engine\] on macOS, vlmserve\[cpu\]"):
        cli.main(["engine", "--help"])


def test_openblas_preload(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.platform", "linux")
    assert openblas_preload({}, tmp_path) is None  # not installed
    library = tmp_path / "x86_64-linux-gnu" / "openblas-pthread" / "libblas.so.3"
    library.parent.mkdir(parents=True)
    library.touch()
    assert openblas_preload({}, tmp_path) == str(library)
    assert openblas_preload({"LD_PRELOAD": "/lib/other.so"}, tmp_path) == f"{library} /lib/other.so"
    assert openblas_preload({"LD_PRELOAD": str(library)}, tmp_path) is None  # already there
    assert openblas_preload({"VLMSERVE_NO_BLAS_PRELOAD": "1"}, tmp_path) is None
    monkeypatch.setattr("sys.platform", "darwin")
    assert openblas_preload({}, tmp_path) is None
