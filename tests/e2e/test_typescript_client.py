"""The contract's TypeScript stubs (clients/typescript/src/gen, protoc-gen-es pinned in package.json):
the committed ones are exactly what the generator writes (as `make proto-check` checks), they and
the tiny client compile under `tsc --strict`, and — on the squares model — the TypeScript client
sends a screenshot inside a tool output over gRPC and streams back the model's count of it.

Needs the npm packages (`make node-deps`); skips without them."""

from __future__ import annotations

import filecmp
import json
import subprocess
from pathlib import Path

import pytest

from tests._services import REPO
from training.squares import AGENT_PROMPT, make_samples
from training.squares_conversations import (
    CAPTURED_TEXT,
    SCREENSHOT_ARGUMENTS,
    SCREENSHOT_CALL_ID,
    SCREENSHOT_TOOL_NAME,
    SCREENSHOT_TOOL_VARIANTS,
)

BIN = REPO / "node_modules" / ".bin"
TS = REPO / "clients" / "typescript"
GENERATED = TS / "src" / "gen"

needs_npm = pytest.mark.skipif(
    not (BIN / "protoc-gen-es").exists() or not (BIN / "tsc").exists(),
    reason="the npm packages are not installed (make node-deps)",
)


def _files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file())


@needs_npm
def test_the_committed_stubs_are_what_the_generator_writes(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(BIN / "buf"), "generate", "--template", str(TS / "buf.gen.yaml"), "-o", str(tmp_path)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    fresh = tmp_path / "clients" / "typescript" / "src" / "gen"
    assert _files(fresh) == _files(GENERATED) == ["vlmserve/engine/v1/engine_pb.ts"]
    for name in _files(fresh):
        assert filecmp.cmp(fresh / name, GENERATED / name, shallow=False), (
            f"stale: run make proto-ts ({name})"
        )


@pytest.fixture(scope="module")
def compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The client and its example compiled by tsc (strict) into a folder that resolves the
    repository's node_modules, as ES modules."""
    out = tmp_path_factory.mktemp("ts")
    (out / "node_modules").symlink_to(REPO / "node_modules")
    (out / "package.json").write_text('{"type": "module"}', encoding="utf-8")
    done = subprocess.run(
        [str(BIN / "tsc"), "-p", str(TS / "tsconfig.json"), "--outDir", str(out / "dist")],
        capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    return out / "dist"


@needs_npm
@pytest.mark.slow
@pytest.mark.needs_model
def test_a_screenshot_in_a_tool_output_from_typescript(
    compiled: Path, squares_engine_address: str, tmp_path: Path
) -> None:
    description, parameters = SCREENSHOT_TOOL_VARIANTS[0]
    scenario = tmp_path / "scenario.json"
    scenario.write_text(
        json.dumps(
            {
                "prompt": AGENT_PROMPT,
                "tool": {"name": SCREENSHOT_TOOL_NAME, "description": description,
                         "parameters_json": json.dumps(parameters)},
                "call": {"id": SCREENSHOT_CALL_ID, "arguments": SCREENSHOT_ARGUMENTS},
                "tool_text": CAPTURED_TEXT,
                "max_tokens": 32,
            }
        ),
        encoding="utf-8",
    )  # fmt: skip
    for sample in make_samples(2718, 2):
        image = tmp_path / "screenshot.png"
        image.write_bytes(sample.png_bytes())
        done = subprocess.run(
            ["node", str(compiled / "examples" / "tool_screenshot.js"), squares_engine_address, str(image),
             str(scenario)],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
        *streamed, last = done.stdout.strip().splitlines()
        result = json.loads(last)
        assert result["text"].strip() == sample.answer, result
        assert "\n".join(streamed).strip() == result["text"].strip()  # printed as it streamed
        assert result["chunks"] >= 2 and result["usage"]["image_count"] == 1, result
        assert result["usage"]["output_tokens"] > 0
