"""The facade installs and runs without MLX (`pip install 'vlmserve[facade]'` on a Linux box in front
of engines on Macs): with mlx, mlx_vlm and transformers made unimportable, the facade's app, its
programs and `vlmserve facade / models / doctor` still import and answer. The same guard refuses
the engine, so the check can fail."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

GUARD = """
import importlib.abc, sys
class NoMlx(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("mlx", "mlx_vlm", "transformers"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None
sys.meta_path.insert(0, NoMlx())
"""

FACADE = (
    GUARD
    + """
import importlib
for module in ("vlmserve.facade.app", "vlmserve.facade.cli", "vlmserve.facade.launch", "vlmserve.cli.main",
               "vlmserve.cli.models", "vlmserve.cli.doctor", "vlmserve.cli.service"):
    importlib.import_module(module)
from vlmserve.cli.main import main
from vlmserve.cli.doctor import mlx_checks
assert mlx_checks()[0].status == "warn", mlx_checks()
for argv in (["facade", "--help"], ["serve", "--help"], ["doctor", "--help"]):
    try:
        main(argv)
    except SystemExit as exit_:
        assert exit_.code in (0, None), (argv, exit_.code)
assert main(["models", "models"]) == 0
print("loaded:", sorted(name for name in sys.modules if name.partition(".")[0] in ("mlx", "mlx_vlm")))
"""
)

ENGINE = (
    GUARD
    + """
from vlmserve.cli.main import main
main(["engine", "--help"])
"""
)


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "VLMSERVE_NO_BLAS_PRELOAD": "1"},
    )


def test_the_facade_and_the_command_need_no_mlx() -> None:
    done = _run(FACADE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "loaded: []" in done.stdout
    assert "usage: vlmserve facade" in done.stdout and "qwen2-vl-squares" in done.stdout


def test_the_guard_refuses_the_engine_and_the_command_names_the_extra() -> None:
    done = _run(ENGINE)
    assert done.returncode != 0
    assert "vlmserve engine needs mlx" in done.stderr and "vlmserve[cpu]" in done.stderr
