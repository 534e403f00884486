"""Large request bodies give their memory back to the OS when they are done with.

glibc serves blocks over its mmap threshold with mmap, and returns them on free; but the
threshold is dynamic: after such a block is freed it rises to that block's size (up to 32 MiB),
so the next body's 30 MiB string, its protobuf copy and its serialized request are allocated on
the heap, where freed memory mostly stays in the process and the copies of consecutive bodies
pile up. A fixed threshold keeps every large block an mmap of its own. Measured with four 30 MiB
bodies at once (bench/big_bodies.py --per-byte): facade peak growth 9.5x the accepted bytes ->
6.9x (docs/hardening.md, "Memory per request byte").
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

__all__ = ["MMAP_THRESHOLD_BYTES", "return_large_blocks_to_the_os"]

# Blocks of 1 MiB or more (base64 images, long texts, serialized requests) are mmapped; small
# objects stay on the heap as before.
MMAP_THRESHOLD_BYTES = 1024 * 1024
_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter

logger = logging.getLogger("vlmserve.facade")


def return_large_blocks_to_the_os() -> bool:
    """Fix glibc's mmap threshold for this process; False where the C library is not glibc."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    done = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if not done:
        logger.info("mallopt(M_MMAP_THRESHOLD) refused; large bodies may stay in the heap")
    return done
