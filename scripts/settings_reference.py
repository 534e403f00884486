"""Rewrite the settings tables in docs/configuration.md from the declarations (run after adding a
setting; tests/server/test_settings.py fails while the doc is stale).

    .venv/bin/python -m scripts.settings_reference
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from vlmserve.engine.cli import EngineCommand
from vlmserve.facade.launch import LaunchSettings
from vlmserve.facade.settings import FacadeSettings
from vlmserve.server.settings import reference

DOC = Path(__file__).resolve().parent.parent / "docs" / "configuration.md"
TABLES = {
    "engine": reference(EngineCommand),
    "facade": reference(FacadeSettings),
    "launcher": reference(LaunchSettings, without=("facade",)),
}
_BLOCK = re.compile(r"(<!-- settings:(\w+) -->\n).*?(<!-- /settings -->)", re.DOTALL)


def rendered(text: str) -> str:
    return _BLOCK.sub(lambda match: match[1] + "\n".join(TABLES[match[2]]) + "\n" + match[3], text)


def main() -> int:
    text = DOC.read_text(encoding="utf-8")
    DOC.write_text(rendered(text), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
