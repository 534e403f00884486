"""`vlmserve doctor`: what this machine gives the engine and whether `vlmserve serve` can start —
MLX and its backend (Metal, CUDA or the CPU), mlx-vlm, memory, OpenBLAS on Linux, and whether
the facade's port and the engine's address are free. It takes `vlmserve serve`'s options (the same
declaration), so `vlmserve doctor --port 8080` checks what `vlmserve serve --port 8080` would use.

Each check is `ok`, `warn` (works, but slower or odd) or `fail` (`vlmserve serve` would not
start); the exit status is 1 when any fails. `--json` prints the checks as one JSON list.
"""

from __future__ import annotations

import importlib
import json
import os
import platform
import socket
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path
from typing import Literal

from vlmserve.cli.blas import openblas_library, openblas_preload
from vlmserve.server.version import version

__all__ = ["Check", "checks", "main"]

Status = Literal["ok", "warn", "fail"]


@dataclass(frozen=True, slots=True)
class Check:
    name: str
    status: Status
    detail: str


def _installed(distribution: str) -> str | None:
    try:
        return metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return None


def mlx_checks() -> list[Check]:
    try:
        mx = importlib.import_module("mlx.core")
    except ImportError as error:
        return [
            Check(
                "mlx",
                "warn",
                f"not importable ({error}): this install can run the facade and the client, not the engine "
                "(install vlmserve[engine] on macOS, vlmserve[cpu] or vlmserve[cuda] on Linux)",
            )
        ]
    metal = bool(getattr(getattr(mx, "metal", None), "is_available", lambda: False)())
    cuda = bool(getattr(getattr(mx, "cuda", None), "is_available", lambda: False)())
    backend = "Metal" if metal else "CUDA" if cuda else "CPU"
    found = [
        Check(
            "mlx",
            "ok",
            f"mlx {getattr(mx, '__version__', '?')}, default device {mx.default_device()}, backend {backend}",
        )
    ]
    vlm = _installed("mlx-vlm")
    found.append(
        Check("mlx-vlm", "ok", f"mlx-vlm {vlm}") if vlm else Check("mlx-vlm", "fail", "not installed")
    )
    if metal:
        info = mx.metal.device_info()
        found.append(
            Check(
                "gpu memory",
                "ok",
                f"{info.get('device_name', 'GPU')}: {_gb(int(info.get('memory_size', 0)))}, "
                f"recommended working set {_gb(int(info.get('max_recommended_working_set_size', 0)))}",
            )
        )
    return found


def _gb(value: int) -> str:
    return f"{value / 2**30:.1f} GiB"


def memory_check() -> Check:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return Check("memory", "warn", "unknown")
    available = None
    meminfo = Path("/proc/meminfo")
    if meminfo.is_file():
        for line in meminfo.read_text(encoding="utf-8").splitlines():
            if line.startswith("MemAvailable:"):
                available = int(line.split()[1]) * 1024
    detail = f"{_gb(total)} total" + (f", {_gb(available)} available" if available is not None else "")
    return Check("memory", "ok", f"{detail}, {os.cpu_count()} CPUs")


def blas_check() -> Check:
    if not sys.platform.startswith("linux"):
        return Check("blas", "ok", "not needed off Linux (Accelerate / Metal)")
    preloaded = "openblas" in os.environ.get("LD_PRELOAD", "").lower()
    library = openblas_library()
    if preloaded:
        return Check("blas", "ok", f"OpenBLAS preloaded ({os.environ['LD_PRELOAD']})")
    if library is not None and openblas_preload(os.environ) is not None:
        return Check("blas", "ok", f"OpenBLAS at {library}: `vlmserve serve` / `vlmserve engine` preload it")
    if library is not None:
        return Check(
            "blas", "warn", f"OpenBLAS at {library} is not preloaded ($VLMSERVE_NO_BLAS_PRELOAD is set)"
        )
    return Check(
        "blas",
        "warn",
        "no OpenBLAS: mlx's CPU backend uses its reference BLAS, ~15x slower matmul "
        "(apt-get install libopenblas0-pthread)",
    )


def port_check(name: str, host: str, port: int) -> Check:
    """Free when this process can bind it now (the check a server's own bind makes)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            return Check(name, "fail", f"{host}:{port} is not free ({error.strerror or error})")
    return Check(name, "ok", f"{host}:{port} is free")


def address_check(name: str, address: str) -> Check:
    if address.startswith("unix:"):
        path = Path(address.removeprefix("unix:").removeprefix("//"))
        if path.exists():
            return Check(name, "warn", f"{path} exists (a running engine, or a stale socket)")
        return Check(name, "ok", f"{path} is free")
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit() or "," in address or "/" in address:
        return Check(name, "ok", f"{address} (not a local HOST:PORT; not checked)")
    return port_check(name, host.strip("[]") or "127.0.0.1", int(port))


def checks(host: str, port: int, engine_address: str) -> list[Check]:
    return [
        Check(
            "vlmserve",
            "ok",
            f"vlmserve {version()}, Python {platform.python_version()}, {platform.platform()}",
        ),
        *mlx_checks(),
        memory_check(),
        blas_check(),
        port_check("facade port", host, port),
        address_check("engine address", engine_address),
    ]


def main(argv: Sequence[str] | None = None, prog: str = "vlmserve doctor") -> int:
    from vlmserve.facade.launch import build_parser, parse_args

    parser = build_parser(prog)
    parser.description = __doc__
    parser.add_argument("--json", action="store_true", help="print the checks as one JSON list")
    argv = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in argv
    if "-h" in argv or "--help" in argv:
        parser.print_help()
        return 0
    settings, _ = parse_args([arg for arg in argv if arg != "--json"], prog=prog)
    found = checks(settings.facade.host, settings.facade.port, settings.facade.engine_address)
    if as_json:
        print(json.dumps([asdict(check) for check in found]))
    else:
        width = max(len(check.name) for check in found)
        for check in found:
            print(f"{check.status:4}  {check.name.ljust(width)}  {check.detail}")
    return 1 if any(check.status == "fail" for check in found) else 0
