"""The facade's allocator setting (http/body_memory.py): large blocks are mmapped and given back."""

from __future__ import annotations

import platform

import pytest

from vlmserve.facade.http.body_memory import return_large_blocks_to_the_os


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="a glibc setting")
def test_the_mmap_threshold_is_fixed_on_glibc() -> None:
    assert return_large_blocks_to_the_os() is True
