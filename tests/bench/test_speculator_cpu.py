"""bench/speculator_cpu.py's scenarios make the decisions they are named for (a short run)."""

from __future__ import annotations

import json
from pathlib import Path

from bench import speculator_cpu


def test_the_scenarios_verify_where_verifies_are_cheap_and_rarely_where_nothing_is_copied(
    tmp_path: Path,
) -> None:
    out = tmp_path / "speculator_cpu.json"
    speculator_cpu.main(["--steps", "400", "--repeats", "1", "--out", str(out)])
    results = {entry["scenario"]: entry for entry in json.loads(out.read_text())}
    assert set(results) == set(speculator_cpu.SCENARIOS)
    assert results["copy, verify cheap"]["verify_steps"] > 300
    assert results["nothing"]["verify_steps"] < 40
    assert all(entry["us_per_step"] > 0 and entry["rows"] == 16 for entry in results.values())
