"""The vendored Open Responses schema is the team's reference copy."""

from __future__ import annotations

import pytest

from tests._openresponses import SHARED_SPEC_PATH, SPEC_PATH


def test_vendored_schema_matches_shared() -> None:
    if not SHARED_SPEC_PATH.exists():
        pytest.skip("no ../shared checkout beside the repo (a fresh clone): nothing to compare")
    assert SPEC_PATH.read_bytes() == SHARED_SPEC_PATH.read_bytes()
