"""Start engine + facade on loopback (fixture model unless --model), run bench/load.py against them
with both PIDs tracked, print the table, write the JSON, and stop both processes.

    python bench/load_stack.py --requests 200 --concurrency 16 --stream --image \\
        --out bench/results/load-200x16-stream.json

Every flag except --model, --engine-arg and --keep-logs goes to load.py (see its --help).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from dataclasses import asdict, replace
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.load import format_table, parse_args, run_load  # noqa: E402
from tests._services import start_engine, start_facade  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--model", default=None, help="model path or id (default: the fixture model)")
    parser.add_argument("--engine-arg", action="append", default=[], help="extra engine flag (repeatable)")
    parser.add_argument("--keep-logs", type=Path, default=None, help="directory for the service logs")
    own, rest = parser.parse_known_args(argv)
    config, out = parse_args(["--base-url", "http://127.0.0.1:1", *rest])
    logs = own.keep_logs or Path(tempfile.mkdtemp(prefix="vlmserve-load-"))
    logs.mkdir(parents=True, exist_ok=True)
    engine = start_engine(logs, model=own.model, extra=tuple(own.engine_arg))
    try:
        facade = start_facade(logs, engine.address, store_path=logs / "store.sqlite3")
        try:
            pids = (engine.process.pid, facade.process.pid)
            config = replace(config, base_url=facade.address, pids=pids)
            report = asyncio.run(run_load(config))
        finally:
            facade.stop()
    finally:
        engine.stop()
    print(format_table(report))
    print(f"pids: engine {pids[0]}, facade {pids[1]}; logs in {logs}")
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(asdict(report), indent=2) + "\n")
        print(f"wrote {out}")
    return 0 if report.ok == config.requests else 1


if __name__ == "__main__":
    sys.exit(main())
