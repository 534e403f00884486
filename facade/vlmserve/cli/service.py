"""`vlmserve service install [SERVE OPTIONS]`: run `vlmserve serve` as a service of this user —
a launchd agent on macOS (~/Library/LaunchAgents, logs in ~/Library/Logs/vlmserve/), a systemd
user unit on Linux (~/.config/systemd/user, logs in the journal: `journalctl --user -u vlmserve`).
`vlmserve service uninstall` stops and removes it; `vlmserve service print` shows what install
would write.

The options are `vlmserve serve`'s (checked by its parser, so a bad one fails here, not at boot)
and are written as the environment variables their declaration names (`--port 8080` becomes
VLMSERVE_FACADE_PORT=8080): the unit runs a plain `vlmserve serve` and `systemctl --user show
vlmserve` / `launchctl print` list what it was given. The file is written mode 0600 (a setting
may be a secret). Rendering is pure (`render_systemd`, `render_launchd`); tests check the unit
with `systemd-analyze verify` and the plist with `plutil -lint` where those exist.
"""

from __future__ import annotations

import argparse
import os
import plistlib
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from vlmserve.facade.launch import LaunchSettings, build_parser, parse_args, stop_timeouts
from vlmserve.server.settings import declared

__all__ = ["ServiceSpec", "environment_of", "main", "render_launchd", "render_systemd", "service_spec"]

Platform = Literal["linux", "macos"]
LABEL_PREFIX = "dev.vlmserve."


@dataclass(frozen=True, slots=True)
class ServiceSpec:
    name: str
    command: tuple[str, ...]
    environment: dict[str, str]
    working_directory: Path
    stop_timeout_s: int
    home: Path

    @property
    def label(self) -> str:
        return LABEL_PREFIX + self.name

    def path(self, platform: Platform) -> Path:
        if platform == "macos":
            return self.home / "Library" / "LaunchAgents" / f"{self.label}.plist"
        return self.home / ".config" / "systemd" / "user" / f"{self.name}.service"

    @property
    def log_dir(self) -> Path:
        return self.home / "Library" / "Logs" / "vlmserve"


def _text(value: object) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, list | tuple):
        return ",".join(_text(item) for item in value)
    return str(value)


def environment_of(args: argparse.Namespace) -> dict[str, str]:
    """The settings given on the command line, as the environment variables that set them."""
    environment: dict[str, str] = {}
    for setting in declared(LaunchSettings):
        if hasattr(args, setting.dest):
            environment[setting.env] = _text(getattr(args, setting.dest))
    given = list(args.positional_models)
    if given and all("=" in value for value in given):
        environment[_env_of("models")] = ",".join(given)
    elif given:
        environment[_env_of("model")] = given[0]
    return environment


def _env_of(field: str) -> str:
    return next(s.env for s in declared(LaunchSettings) if s.path == (field,))


def _vlmserve_command() -> tuple[str, ...]:
    beside = Path(sys.executable).parent / "vlmserve"
    if beside.exists():
        return (str(beside), "serve")
    return (sys.executable, "-m", "vlmserve.cli", "serve")


def service_spec(
    argv: Sequence[str], *, name: str = "vlmserve", home: Path | None = None, cwd: Path | None = None
) -> ServiceSpec:
    """What a service running `vlmserve serve` with these options is: checked as serve checks them."""
    settings, _ = parse_args(argv, environ={}, prog="vlmserve service install")
    args = build_parser().parse_args(argv)
    timeouts = stop_timeouts(settings.facade)
    return ServiceSpec(
        name=name,
        command=_vlmserve_command(),
        environment=environment_of(args),
        working_directory=(cwd or Path.cwd()).resolve(),
        # The launcher stops the facade, then the engines (launch.py); then a margin.
        stop_timeout_s=int(timeouts["facade"] + timeouts["engine"]) + 10,
        home=home or Path.home(),
    )


def _systemd_quote(value: str) -> str:
    if "\n" in value or "\r" in value:
        raise ValueError("a setting for a service cannot hold a line break")
    # Inside Environment="...": backslash and quote escaped; % starts a specifier.
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%")


def _exec_word(word: str) -> str:
    escaped = word.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{escaped}"' if any(c in word for c in " \t'\"") else escaped


def render_systemd(spec: ServiceSpec) -> str:
    environment = "".join(
        f'Environment="{key}={_systemd_quote(value)}"\n' for key, value in sorted(spec.environment.items())
    )
    return (
        "[Unit]\n"
        "Description=vlmserve: vision-language models over gRPC and HTTP (vlmserve serve)\n"
        "After=network-online.target\n"
        "Wants=network-online.target\n"
        "\n"
        "[Service]\n"
        "Type=simple\n"
        f"ExecStart={' '.join(_exec_word(word) for word in spec.command)}\n"
        f"WorkingDirectory={_exec_word(str(spec.working_directory))}\n"
        f"{environment}"
        # The launcher stops its children in order on SIGTERM; only then is anything killed.
        "KillMode=mixed\n"
        f"TimeoutStopSec={spec.stop_timeout_s}\n"
        "Restart=on-failure\n"
        "RestartSec=5\n"
        "StandardOutput=journal\n"
        "StandardError=journal\n"
        f"SyslogIdentifier={spec.name}\n"
        "\n"
        "[Install]\n"
        "WantedBy=default.target\n"
    )


def render_launchd(spec: ServiceSpec) -> bytes:
    log = spec.log_dir / f"{spec.name}.log"
    return plistlib.dumps(
        {
            "Label": spec.label,
            "ProgramArguments": list(spec.command),
            "EnvironmentVariables": dict(sorted(spec.environment.items())),
            "WorkingDirectory": str(spec.working_directory),
            "RunAtLoad": True,
            # Restarted when it fails, not after a clean stop.
            "KeepAlive": {"SuccessfulExit": False},
            "ThrottleInterval": 5,
            "ExitTimeOut": spec.stop_timeout_s,
            "StandardOutPath": str(log),
            "StandardErrorPath": str(log),
        }
    )


def _host_platform() -> Platform:
    return "macos" if sys.platform == "darwin" else "linux"


def _activation(spec: ServiceSpec, platform: Platform, action: Literal["start", "stop"]) -> list[list[str]]:
    if platform == "macos":
        domain = f"gui/{os.getuid()}"
        if action == "start":
            return [["launchctl", "bootstrap", domain, str(spec.path(platform))]]
        return [["launchctl", "bootout", f"{domain}/{spec.label}"]]
    if action == "start":
        # restart, not start: a reinstall's new settings take effect
        return [
            ["systemctl", "--user", "daemon-reload"],
            ["systemctl", "--user", "enable", spec.name],
            ["systemctl", "--user", "restart", spec.name],
        ]
    return [["systemctl", "--user", "disable", "--now", spec.name], ["systemctl", "--user", "daemon-reload"]]


def _run_all(commands: list[list[str]], *, must: bool) -> bool:
    for command in commands:
        if shutil.which(command[0]) is None:
            print(f"{command[0]} not found; run: {' '.join(command)}", file=sys.stderr)
            return False
        done = subprocess.run(command, check=False, capture_output=True, text=True)
        if done.returncode != 0:
            print(f"{' '.join(command)}: {done.stderr.strip() or done.returncode}", file=sys.stderr)
            if must:
                return False
    return True


def rendered(spec: ServiceSpec, platform: Platform) -> bytes:
    return render_launchd(spec) if platform == "macos" else render_systemd(spec).encode()


def install(spec: ServiceSpec, platform: Platform, *, start: bool) -> Path:
    path = spec.path(platform)
    if start and platform == "macos" and path.exists():
        # launchd keeps the agent it loaded: unload it, so the new file is the one that runs.
        _run_all(_activation(spec, platform, "stop"), must=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    if platform == "macos":
        spec.log_dir.mkdir(parents=True, exist_ok=True)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as out:
        out.write(rendered(spec, platform))
    os.chmod(path, 0o600)
    if start:
        _run_all(_activation(spec, platform, "start"), must=True)
    return path


def uninstall(spec: ServiceSpec, platform: Platform, *, stop: bool) -> Path | None:
    path = spec.path(platform)
    if not path.exists():
        return None
    if stop:
        _run_all(_activation(spec, platform, "stop"), must=False)
    path.unlink()
    return path


def main(argv: Sequence[str] | None = None, prog: str = "vlmserve service") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    parser.add_argument("action", choices=("install", "uninstall", "print"))
    parser.add_argument("--name", default="vlmserve", help="the service's name (default: vlmserve)")
    parser.add_argument(
        "--platform", choices=("linux", "macos"), default=_host_platform(), help="whose service file to write"
    )
    parser.add_argument(
        "--no-start", action="store_true", help="write (or remove) the file only; do not start (or stop) it"
    )
    parser.epilog = "Every other option is `vlmserve serve`'s (vlmserve serve --help)."
    args, serve_argv = parser.parse_known_args(argv)
    platform: Platform = args.platform
    try:
        spec = service_spec(serve_argv if args.action != "uninstall" else [], name=args.name)
    except (ValueError, OSError) as error:
        parser.error(str(error))
    if args.action == "print":
        sys.stdout.buffer.write(rendered(spec, platform))
        return 0
    if args.action == "install":
        path = install(spec, platform, start=not args.no_start and platform == _host_platform())
        where = (
            f"logs in {spec.log_dir}" if platform == "macos" else f"logs: journalctl --user -u {spec.name}"
        )
        print(f"wrote {path} ({where})")
        return 0
    removed = uninstall(spec, platform, stop=not args.no_start and platform == _host_platform())
    print(f"removed {removed}" if removed else f"no {spec.path(platform)} to remove")
    return 0
