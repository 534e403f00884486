"""Run the pinned Codex CLIs against a Responses endpoint, loopback only: the long-pinned one
(`node_modules/.bin/codex`) and the newest beside it (the npm alias `codex-new`, package.json:
two versions of one package cannot share its name in node_modules)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
CODEX_BIN = REPO / "node_modules" / ".bin" / "codex"
PINNED_VERSION = "0.169.0"


@dataclass(frozen=True)
class CodexPin:
    version: str
    bin: Path


# Every pinned Codex CLI; the tests that run the CLI run each (ids: the versions).
CODEX_PINS = (
    CodexPin(PINNED_VERSION, CODEX_BIN),
    CodexPin("0.171.0", REPO / "node_modules" / "codex-new" / "bin" / "codex.js"),
)

# The message Codex gives when a turn ends `response.incomplete` / max_output_tokens: a tiny model
# running out of tokens is a protocol pass (docs/codex-shapes.md).
INCOMPLETE_MAX_OUTPUT = "Incomplete response returned, reason: max_output_tokens"
# Codex reports these as `error` items but carries on; they are not protocol errors.
BENIGN_ITEM_ERRORS = ("Model metadata for `",)


def codex_unavailable_reason(codex_bin: Path = CODEX_BIN) -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH (`.ci/run` installs it; locally: apt-get install nodejs npm)"
    if not codex_bin.exists():
        return f"{codex_bin} is missing: run `make node-deps` (npm ci installs the pinned @openai/codex)"
    return None


def write_config(codex_home: Path, base_url: str, model: str, idle_timeout_ms: int) -> None:
    """A provider pointed at `base_url`; retries off so the first protocol error surfaces as is."""
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f"""model = {json.dumps(model)}
model_provider = "vlmserve"
check_for_update_on_startup = false
approval_policy = "never"
sandbox_mode = "read-only"
model_context_window = 32768

[model_providers.vlmserve]
name = "vlmserve"
base_url = {json.dumps(base_url)}
wire_api = "responses"
env_key = "VLMSERVE_API_KEY"
request_max_retries = 0
stream_max_retries = 0
stream_idle_timeout_ms = {idle_timeout_ms}

[analytics]
enabled = false

[features]
plugins = false
remote_plugin = false
"""
    )


def loopback_only_env(codex_home: Path, dead_port: int) -> dict[str, str]:
    """Codex's environment: its own home, a dummy key, and every proxy pointed at a closed loopback
    port, so anything it might try beyond 127.0.0.1 fails at once instead of leaving the machine."""
    keep = ("PATH", "LANG", "LC_ALL", "TERM", "TMPDIR", "USER", "LOGNAME", "SHELL")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    proxy = f"http://127.0.0.1:{dead_port}"
    env.update(
        HOME=str(codex_home.parent),
        CODEX_HOME=str(codex_home),
        VLMSERVE_API_KEY="dummy-key",
        HTTP_PROXY=proxy,
        HTTPS_PROXY=proxy,
        ALL_PROXY=proxy,
        http_proxy=proxy,
        https_proxy=proxy,
        all_proxy=proxy,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
        NO_COLOR="1",
    )
    return env


@dataclass
class CodexRun:
    returncode: int
    events: list[dict[str, Any]]
    stdout: str
    stderr: str

    def turn_results(self) -> list[dict[str, Any]]:
        return [event for event in self.events if event.get("type") in ("turn.completed", "turn.failed")]

    def errors(self) -> list[str]:
        """Top-level `error` events and failed turns: the errors that ended or broke a turn."""
        found = [str(event.get("message")) for event in self.events if event.get("type") == "error"]
        found += [
            str(event.get("error", {}).get("message"))
            for event in self.events
            if event.get("type") == "turn.failed"
        ]
        return found

    def item_errors(self) -> list[str]:
        return [
            str(event["item"].get("message"))
            for event in self.events
            if event.get("type") == "item.completed" and event.get("item", {}).get("type") == "error"
        ]

    def protocol_problems(self) -> list[str]:
        """Why this run is not a clean Codex turn; empty when the turn completed, or ended only
        because the model ran out of output tokens."""
        problems: list[str] = []
        if not any(event.get("type") == "turn.started" for event in self.events):
            problems.append("no turn.started event")
        results = self.turn_results()
        if len(results) != 1:
            problems.append(f"expected one turn result, got {[r.get('type') for r in results]}")
        problems += [f"error: {message}" for message in self.errors() if message != INCOMPLETE_MAX_OUTPUT]
        problems += [f"item error: {m}" for m in self.item_errors() if not m.startswith(BENIGN_ITEM_ERRORS)]
        if results and results[0]["type"] == "turn.completed" and self.returncode != 0:
            problems.append(f"turn completed but exit code {self.returncode}")
        return problems

    def describe(self) -> str:
        return f"rc={self.returncode}\nstdout:\n{self.stdout[-6000:]}\nstderr:\n{self.stderr[-6000:]}"


def run_codex_exec(
    prompt: str,
    workdir: Path,
    env: dict[str, str],
    timeout_s: float,
    *,
    options: tuple[str, ...] = (),
    codex_bin: Path = CODEX_BIN,
) -> CodexRun:
    """`codex exec` once; `options` go before the prompt (e.g. `--output-schema FILE`)."""
    command = [
        str(codex_bin),
        "exec",
        "--skip-git-repo-check",
        "--strict-config",
        "--ephemeral",
        "--json",
        "--color",
        "never",
        "--cd",
        str(workdir),
        *options,
        prompt,
    ]
    completed = subprocess.run(
        command,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout_s,
        check=False,
    )
    events = []
    for line in completed.stdout.splitlines():
        if line.startswith("{"):
            try:
                events.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return CodexRun(completed.returncode, events, completed.stdout, completed.stderr)


def codex_version(env: dict[str, str], codex_bin: Path = CODEX_BIN) -> str:
    completed = subprocess.run(
        [str(codex_bin), "--version"], capture_output=True, text=True, env=env, timeout=60, check=False
    )
    return completed.stdout.strip()
