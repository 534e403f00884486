"""`vlmserve service`: a systemd user unit (Linux) or a launchd agent (macOS) running `vlmserve serve`
with the options given as the environment their declaration names. The environment written
reproduces exactly the settings the options give; the unit passes `systemd-analyze verify` and
the plist `plutil -lint` where those tools exist (plistlib reads it back everywhere); install
writes the file mode 0600 and uninstall removes it."""

from __future__ import annotations

import plistlib
import re
import shutil
import stat
import subprocess
from pathlib import Path

import pytest

from vlmserve.cli import service
from vlmserve.facade.launch import LaunchSettings, parse_args
from vlmserve.server.settings import load

ARGV = [
    "models/qwen2-vl-squares",
    "--port", "8080",
    "--max-tools", "5",
    "--allow-remote-images-from", "a.example", "--allow-remote-images-from", "b.example",
    "--remote-images-enabled",
    "--engine-flags", 'say "hi" 100% \\o/ $HOME',
]  # fmt: skip


def spec(tmp_path: Path, argv: list[str] = ARGV) -> service.ServiceSpec:
    return service.service_spec(argv, home=tmp_path / "home", cwd=tmp_path)


def test_the_environment_gives_the_same_settings(tmp_path: Path) -> None:
    given, _ = parse_args(ARGV, environ={})
    written = spec(tmp_path).environment
    assert (
        written["VLMSERVE_FACADE_PORT"] == "8080" and written["VLMSERVE_MODEL"] == "models/qwen2-vl-squares"
    )
    assert load(LaunchSettings, environ=written) == given
    several = service.service_spec(["a=m/x", "b=m/y"], home=tmp_path, cwd=tmp_path).environment
    assert load(LaunchSettings, environ=several).models == ("a=m/x", "b=m/y")


def _unquote(value: str) -> str:
    return re.sub(r"\\(.)", r"\1", value).replace("%%", "%")


def test_the_systemd_unit(tmp_path: Path) -> None:
    the_spec = spec(tmp_path)
    unit = service.render_systemd(the_spec)
    assert f"ExecStart={' '.join(the_spec.command)}\n" in unit
    env = dict(
        _unquote(m).split("=", 1)
        for m in re.findall(r'^Environment="((?:[^"\\]|\\.)*)"$', unit, re.MULTILINE)
    )
    assert env == the_spec.environment
    assert "StandardOutput=journal" in unit and "KillMode=mixed" in unit
    assert "WantedBy=default.target" in unit
    with pytest.raises(ValueError, match="line break"):
        service.render_systemd(service.service_spec(["--engine-flags", "a\nb"], home=tmp_path, cwd=tmp_path))


def _verify(unit_text: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "vlmserve.service"
    path.write_text(unit_text, encoding="utf-8")
    return subprocess.run(
        ["systemd-analyze", "verify", str(path)], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="systemd-analyze not installed")
def test_systemd_analyze_verifies_the_unit(tmp_path: Path) -> None:
    done = _verify(service.render_systemd(spec(tmp_path)), tmp_path)
    assert done.returncode == 0 and not done.stderr.strip(), done.stderr
    # It can fail: an environment line systemd would ignore, and a program that does not exist.
    broken = service.render_systemd(spec(tmp_path)).replace('Environment="', "Environment=VLM SERVE ", 1)
    assert "ignoring" in _verify(broken, tmp_path).stderr
    missing = re.sub(r"^ExecStart=\S+", "ExecStart=/nonexistent/vlmserve", broken, flags=re.MULTILINE)
    assert _verify(missing, tmp_path).returncode != 0


def test_the_launchd_agent(tmp_path: Path) -> None:
    the_spec = spec(tmp_path)
    agent = plistlib.loads(service.render_launchd(the_spec))
    assert agent["Label"] == "dev.vlmserve.vlmserve"
    assert agent["ProgramArguments"] == list(the_spec.command) and agent["ProgramArguments"][-1] == "serve"
    assert agent["EnvironmentVariables"] == the_spec.environment
    assert agent["StandardOutPath"] == str(
        tmp_path / "home" / "Library" / "Logs" / "vlmserve" / "vlmserve.log"
    )
    assert agent["KeepAlive"] == {"SuccessfulExit": False} and agent["RunAtLoad"] is True
    if shutil.which("plutil"):
        path = tmp_path / "agent.plist"
        path.write_bytes(service.render_launchd(the_spec))
        assert subprocess.run(["plutil", "-lint", str(path)], check=False, timeout=60).returncode == 0


@pytest.mark.parametrize("platform", ["linux", "macos"])
def test_install_and_uninstall(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], platform: str
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    assert service.main(["install", "--platform", platform, "--no-start", "--port", "9001"]) == 0
    expected = (
        tmp_path / "Library" / "LaunchAgents" / "dev.vlmserve.vlmserve.plist"
        if platform == "macos"
        else tmp_path / ".config" / "systemd" / "user" / "vlmserve.service"
    )
    assert f"wrote {expected}" in capsys.readouterr().out
    assert stat.S_IMODE(expected.stat().st_mode) == 0o600
    assert b"VLMSERVE_FACADE_PORT" in expected.read_bytes()
    assert service.main(["uninstall", "--platform", platform, "--no-start"]) == 0
    assert not expected.exists()
    assert service.main(["uninstall", "--platform", platform, "--no-start"]) == 0
    assert "no " in capsys.readouterr().out


def test_a_bad_option_fails_at_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(SystemExit):
        service.main(["install", "--no-start", "--port", "not-a-port"])
    assert not (tmp_path / ".config").exists()


def test_activation_commands(tmp_path: Path) -> None:
    the_spec = spec(tmp_path)
    start = service._activation(the_spec, "linux", "start")
    assert start[-1] == ["systemctl", "--user", "restart", "vlmserve"]  # a reinstall takes effect
    assert ["systemctl", "--user", "disable", "--now", "vlmserve"] in service._activation(
        the_spec, "linux", "stop"
    )
    mac = service._activation(the_spec, "macos", "start")
    assert mac[0][:2] == ["launchctl", "bootstrap"] and mac[0][-1].endswith("dev.vlmserve.vlmserve.plist")
