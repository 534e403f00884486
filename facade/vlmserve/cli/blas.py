"""mlx's Linux CPU wheel links the reference BLAS; Debian's OpenBLAS, preloaded, is ~15-20x faster
for matrix multiplication (README, "Linux: OpenBLAS"). `make run` sets LD_PRELOAD in the Makefile;
`vlmserve serve` and `vlmserve engine` do the same for an installed package, and `vlmserve doctor`
reports it. Pure apart from looking for the library on disk."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path

__all__ = ["NO_PRELOAD_ENV", "openblas_library", "openblas_preload"]

# Set (to anything) to leave LD_PRELOAD alone.
NO_PRELOAD_ENV = "VLMSERVE_NO_BLAS_PRELOAD"
_GLOB = "*/openblas-pthread/libblas.so.3"


def openblas_library(root: Path = Path("/usr/lib")) -> Path | None:
    """Debian's pthread OpenBLAS (package libopenblas0-pthread), if installed."""
    found = sorted(root.glob(_GLOB))
    return found[0] if found else None


def openblas_preload(environ: Mapping[str, str], root: Path = Path("/usr/lib")) -> str | None:
    """The LD_PRELOAD value that adds OpenBLAS, or None: not Linux, not installed, already
    preloaded, or turned off with $VLMSERVE_NO_BLAS_PRELOAD."""
    if not sys.platform.startswith("linux") or environ.get(NO_PRELOAD_ENV):
        return None
    current = environ.get("LD_PRELOAD", "")
    if "openblas" in current.lower():
        return None
    library = openblas_library(root)
    if library is None:
        return None
    return f"{library} {current}".strip()
