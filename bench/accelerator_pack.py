"""The packages bench/accelerator.py needs that the device machine lacks, as one carried file
(`bench/accelerator.sh pack`; docs/performance.md, "On an accelerator").

The device machine reaches no package registry and takes at most 64 MiB of working tree and
carried paths together. Its image has PyTorch's CUDA 13 libraries (cuBLAS, cuDNN, NCCL, NVRTC,
...), transformers, tokenizers, numpy, pillow, httpx, but not mlx, mlx-vlm, FastAPI, pydantic or
the gRPC and OpenTelemetry packages the engine needs (/work/.library/device/KINDS.md, 2026-11-17).
So this installs CARRIED, at this venv's versions, for CPython 3.12 on manylinux x86_64 into a
folder, and writes it as `.accel/site.tar.xz` (name `.accel` in the device tool's `carry`).

`mlx-cuda-13` is 90 MB as a wheel, past the limit alone: its libmlx.so holds CUDA kernels for
seven targets (sm_75, 80, 90, 100, 120, 121 and PTX). Its symbol table is stripped (`strip
--strip-unneeded`: dynamic symbols stay) and every kernel image but the H100/H200's (sm_90) is
zeroed in place, headers kept, so the file's layout is unchanged and the driver picks the sm_90
image as before; the zeros compress to nothing: the library is ~16 MB under xz (90 as a wheel),
the whole bundle 36.8 MiB, 59.7 MiB with the 22.9 MiB tree (2026-12-07) of the 64 allowed
(`main` prints the sum and fails past it). A CPU rehearsal of `run` on CPython 3.12 with the
image's older protobuf and grpcio (`--backend cpu`, ACCEL_BUNDLE, PYTHON) passed on the fixtures.

    .venv/bin/python -m bench.accelerator_pack [--backend cuda13|cpu] [--out .accel/site.tar.xz]

`--backend cpu` packs mlx-cpu instead: the same bundle for a CPU rehearsal of `accelerator.sh run`.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import shutil
import struct
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Sequence
from pathlib import Path

# What the engine, the facade and mlx-vlm's server import at start that the device image lacks, or
# has at versions the project cannot use (protobuf: the generated code needs 7.35+; grpcio and
# typing-extensions: the pydantic and gRPC code here). mlx's backend is added by `--backend`.
CARRIED = (
    "mlx",
    "mlx-vlm",
    "mlx-audio",
    "miniaudio",
    "fastapi",
    "starlette",
    "uvicorn",
    "pydantic",
    "pydantic-core",
    "annotated-types",
    "typing-inspection",
    "typing-extensions",
    "sse-starlette",
    "python-multipart",
    "websockets",
    "cryptography",
    "cffi",
    "pycparser",
    "opentelemetry-api",
    "opentelemetry-sdk",
    "opentelemetry-exporter-otlp-proto-http",
    "opentelemetry-exporter-otlp-proto-common",
    "opentelemetry-exporter-http-transport",
    "opentelemetry-exporter-otlp-common",
    "opentelemetry-proto",
    "opentelemetry-semantic-conventions",
    "googleapis-common-protos",
    "protobuf",
    "grpcio",
    "grpcio-status",
    "grpcio-health-checking",
    "grpcio-reflection",
    "python-json-logger",
    "llguidance",
)
BACKENDS = {"cuda13": "mlx-cuda-13", "cpu": "mlx-cpu"}
# The image's Python is Ubuntu 24.04's 3.12.3 (glibc 2.39, likely; mlx's wheel needs 2.35); pip
# matches each tag exactly, so every glibc a carried wheel is built for is named.
PLATFORMS = (
    *(f"manylinux_2_{minor}_x86_64" for minor in (39, 35, 34, 31, 28, 27, 24, 17)),
    "manylinux2014_x86_64",
)
KEEP_ARCH = 90  # the H100's and H200's compute capability
DEVICE_LIMIT = 64 << 20  # the working tree and the carried paths, together, per device call
FATBIN_MAGIC = 0xBA55ED50
ELF_IMAGE = 2  # a fatbin entry's kind: 1 PTX, 2 a compiled (ELF) image


def pins(backend: str) -> list[str]:
    """`name==version` for each carried package, at this venv's versions (the backend at mlx's)."""
    versions = {name: importlib.metadata.version(name) for name in CARRIED}
    return [
        *(f"{name}=={version}" for name, version in versions.items()),
        f"{BACKENDS[backend]}=={versions['mlx']}",
    ]


def elf_section(data: bytes | bytearray, wanted: str) -> tuple[int, int] | None:
    """(file offset, size) of a 64-bit little-endian ELF file's section named `wanted`."""
    if data[:4] != b"\x7fELF" or data[4] != 2:
        return None
    shoff = struct.unpack_from("<Q", data, 0x28)[0]
    entsize, count, names_index = struct.unpack_from("<HHH", data, 0x3A)
    names_offset = struct.unpack_from("<Q", data, shoff + names_index * entsize + 0x18)[0]
    for index in range(count):
        header = shoff + index * entsize
        name_at = names_offset + struct.unpack_from("<I", data, header)[0]
        name = bytes(data[name_at : data.index(b"\0", name_at)]).decode()
        if name == wanted:
            offset, size = struct.unpack_from("<QQ", data, header + 0x18)
            return int(offset), int(size)
    return None


def zero_other_images(data: bytearray, start: int, size: int, keep_arch: int = KEEP_ARCH) -> int:
    """Zero, in `data[start:start + size]` (a .nv_fatbin section: fatbins one after another, each
    a header and entries of kind, header size, payload size and target), the payload of every
    entry but the compiled images for `keep_arch`; headers stay. Returns the bytes zeroed."""
    zeroed, position, end = 0, start, start + size
    while position + 16 <= end:
        magic, _, header_size, fat_size = struct.unpack_from("<IHHQ", data, position)
        if magic != FATBIN_MAGIC:
            position += 8  # fatbins are 8-byte aligned, padding between them
            continue
        entry, fat_end = position + header_size, position + header_size + fat_size
        while entry < fat_end:
            kind, _, entry_header, payload = struct.unpack_from("<HHIQ", data, entry)
            arch = struct.unpack_from("<I", data, entry + 28)[0]
            if not (kind == ELF_IMAGE and arch == keep_arch):
                body = entry + entry_header
                data[body : body + payload] = bytes(payload)
                zeroed += payload
            entry += entry_header + payload
        position = fat_end
    return zeroed


def slim_library(path: Path) -> int:
    """Strip `path`'s symbol table and zero its kernels for other targets; returns bytes zeroed."""
    if shutil.which("strip"):
        subprocess.run(["strip", "--strip-unneeded", str(path)], check=True)
    data = bytearray(path.read_bytes())
    section = elf_section(data, ".nv_fatbin")
    if section is None:
        return 0
    zeroed = zero_other_images(data, *section)
    path.write_bytes(bytes(data))
    return zeroed


def install(target: Path, requirements: Sequence[str]) -> None:
    """pip install --target for CPython 3.12 on manylinux x86_64, wheels only, no dependencies."""
    platforms = [flag for platform in PLATFORMS for flag in ("--platform", platform)]
    command = [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--only-binary=:all:"]
    command += ["--python-version", "3.12", "--implementation", "cp", *platforms, "--target", str(target)]
    subprocess.run([*command, *requirements], check=True)


def pack(out: Path, backend: str) -> int:
    """Install, slim, write `out` (xz); returns its size."""
    with tempfile.TemporaryDirectory(prefix="vlmserve-accel-pack-") as work:
        site = Path(work) / "site"
        install(site, pins(backend))
        library = site / "mlx" / "lib" / "libmlx.so"
        if backend == "cuda13" and library.is_file():
            print(f"libmlx.so: {slim_library(library) / 1e6:.0f} MB of other targets' kernels zeroed")
        for dropped in [*site.rglob("__pycache__"), site / "mlx" / "share", site / "bin"]:
            shutil.rmtree(dropped, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(out, "w:xz", preset=6) as bundle:
            for child in sorted(site.iterdir()):
                bundle.add(child, arcname=child.name)
    return out.stat().st_size


def tree_bytes(repo: Path) -> int:
    """What of `repo` travels to the device besides the carried paths: tracked files and
    untracked ones git does not ignore."""
    listed = subprocess.run(
        ["git", "-C", str(repo), "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        check=True,
        capture_output=True,
    ).stdout
    paths = (repo / name for name in listed.decode().split("\0") if name)
    return sum(path.stat().st_size for path in paths if path.is_file() and not path.is_symlink())


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--backend", choices=list(BACKENDS), default="cuda13")
    parser.add_argument("--out", type=Path, default=Path(".accel/site.tar.xz"))
    args = parser.parse_args(argv)
    size = pack(args.out, args.backend)
    tree = tree_bytes(Path.cwd())
    print(f"{args.out}: {size / (1 << 20):.1f} MiB; with this tree's {tree / (1 << 20):.1f} MiB", end=" ")
    print(f"{(size + tree) / (1 << 20):.1f} of the device call's {DEVICE_LIMIT >> 20} MiB")
    return 0 if size + tree <= DEVICE_LIMIT else 1


if __name__ == "__main__":
    raise SystemExit(main())
