"""`buf breaking` against the released contract, with a reviewed list of accepted changes.

    .venv/bin/python -m scripts.contract_breaking        (what `make buf-breaking` runs)

buf's FILE rules (buf.yaml) compare protos/ with protos/released/engine-v1.binpb. A flagged change
passes only when protos/released/accepted-breaks.json lists it (rule and buf's message, with the
reason); an entry that buf no longer reports fails too, so the list never outlives its change.
buf's own `ignore_only` would exempt a rule for the whole file, which is far wider than one field.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RELEASED = "protos/released/engine-v1.binpb"
ACCEPTED = REPO / "protos" / "released" / "accepted-breaks.json"


def flagged() -> set[tuple[str, str]]:
    completed = subprocess.run(
        ["npx", "--no-install", "buf", "breaking", "--against", RELEASED, "--error-format", "json"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if completed.returncode not in (0, 100):  # 100: breaking changes found
        sys.exit(f"buf breaking failed to run:\n{completed.stderr}")
    found = set()
    for line in completed.stdout.splitlines():
        if line.strip():
            violation = json.loads(line)
            found.add((violation["type"], violation["message"]))
    return found


def main() -> int:
    accepted = {(entry["type"], entry["message"]) for entry in json.loads(ACCEPTED.read_text())["accepted"]}
    found = flagged()
    unexpected = sorted(found - accepted)
    stale = sorted(accepted - found)
    for rule, message in unexpected:
        print(f"breaking change ({rule}): {message}", file=sys.stderr)
    for rule, message in stale:
        print(
            f"{ACCEPTED.relative_to(REPO)} lists a change buf no longer reports ({rule}): {message}",
            file=sys.stderr,
        )
    if unexpected:
        print(
            "v1 takes additions only (docs/engine-contract.md); a change that breaks callers goes to "
            "vlmserve.engine.v2.",
            file=sys.stderr,
        )
    if unexpected or stale:
        return 1
    print(f"contract: no breaking change against {RELEASED} ({len(accepted)} accepted, listed)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
