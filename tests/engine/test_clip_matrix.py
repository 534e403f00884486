"""docs/models.md's video and audio columns say what the engine does: on each row's fixture, the
outcomes a cell names (video: native, frames as images, refused; audio: ✓, refused) are the ones
the engine's rule gives (`clip_support_for`, as the request preparer applies it), and a refused
clip is INVALID_ARGUMENT naming the part and the family before anything is decoded.

The rule runs on the loaded fixture (its processor and model), not on a table of family names, so
a new family or an mlx-vlm upgrade that changes a processor shows here as a cell to rewrite.
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import grpc
import pytest

from tests.engine._clips import build_gemma4_with_audio
from training import beeps, squares_video
from training.families import FAMILIES
from vlmserve.common.images import ImageLimits
from vlmserve.engine.jobs import JobKind
from vlmserve.engine.model import FIXTURE_MODELS_DIR, load_model
from vlmserve.engine.prep.clip_inputs import ClipSupport
from vlmserve.engine.prep.preparer import RequestPreparer
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.needs_model

MODELS_DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"
VIDEO_WORDS = ("native", "frames as images", "refused")
AUDIO_WORDS = ("✓", "refused")
# The fixtures a row stands for, where not its family fixture of the same name: the committed
# Qwen2-VL model, Qwen3-VL's thinking fixture, and for Gemma 4 both the family fixture (no video
# processor of its tower's sizes, no audio tower: 26B/31B) and one with both (E2B/E4B).
ROW_FIXTURES = {
    "qwen2_vl": ("qwen2_vl",),
    "qwen3_vl (thinking)": ("qwen3_vl_thinking",),
    "gemma4": ("gemma4", "gemma4_audio"),
}
WHERE = "messages[0].parts[0]"


def matrix_cells() -> dict[str, tuple[str, str]]:
    """Row name (`qwen3_vl (thinking)`) -> (its video cell, its audio cell), from "The matrix"."""
    section = MODELS_DOC.read_text(encoding="utf-8").split("## The matrix", 1)[1].split("\n## ", 1)[0]
    table = [line for line in section.splitlines() if line.startswith("|")]
    # Cells split at unescaped pipes (`<\|tool_call>` stays in its cell).
    header, *rows = ([cell.strip() for cell in re.split(r"(?<!\\)\|", line)[1:-1]] for line in table)
    video, audio = header.index("video"), header.index("audio")
    return {row[0].replace("`", ""): (row[video], row[audio]) for row in rows if row[0].startswith("`")}


CELLS = matrix_cells()


def row_fixtures(row: str) -> tuple[str, ...]:
    return ROW_FIXTURES.get(row, (row,))


@pytest.fixture(scope="module")
def fixture_dirs(family_models: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    audio_dir = build_gemma4_with_audio(tmp_path_factory.mktemp("clip-matrix") / "gemma4_audio")
    return family_models | {"qwen2_vl": FIXTURE_MODELS_DIR / "qwen2-vl-tiny", "gemma4_audio": audio_dir}


def named(cell: str, words: tuple[str, ...]) -> set[str]:
    return {word for word in words if word in cell}


def clip_request(part: pb.Part) -> pb.GenerateRequest:
    question = pb.Part(text=pb.TextPart(text="What is in it?"))
    return pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[part, question])],
        sampling=pb.SamplingParams(temperature=0.0, max_tokens=4),
    )


def assert_refused(preparer: RequestPreparer, part: pb.Part, kind: str, family: str) -> None:
    with pytest.raises(RequestError) as refused:
        preparer.prepare(clip_request(part), kind=JobKind.GENERATE)
    assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert refused.value.field == WHERE
    message = str(refused.value)
    assert message.startswith(f"{WHERE}: model ") and f"({family}) does not take {kind}" in message


def test_every_fixture_has_a_row() -> None:
    covered = {fixture for row in CELLS for fixture in row_fixtures(row)}
    assert covered == set(FAMILIES) | {"qwen2_vl", "gemma4_audio"}


@pytest.mark.parametrize("row", sorted(CELLS))
def test_the_cells_say_what_the_engine_does(row: str, fixture_dirs: dict[str, Path]) -> None:
    video_cell, audio_cell = CELLS[row]
    video_outcomes, audio_outcomes = set(), set()
    clip = squares_video.draw_clip(random.Random(5))
    video_part = pb.Part(video=pb.VideoPart(data=clip.mp4_bytes(), media_type="video/mp4"))
    wav = beeps.draw_clip(random.Random(5)).wav_bytes()
    audio_part = pb.Part(audio=pb.AudioPart(data=wav, media_type="audio/wav"))
    for fixture in row_fixtures(row):
        limits = ImageLimits()
        loaded = load_model(
            str(fixture_dirs[fixture]), max_output_tokens=8, image_limits=limits, max_images_per_request=16
        )
        preparer = RequestPreparer(loaded, max_request_pixels=1 << 24, decode_slots=1)
        support: ClipSupport = preparer._clips.support  # what it decided for this model
        video = {"native": "native", "frames": "frames as images", "": "refused"}[support.video]
        video_outcomes.add(video)
        audio_outcomes.add("✓" if support.audio else "refused")
        family = loaded.info.architecture
        if video == "refused":
            assert_refused(preparer, video_part, "video", family)
        if not support.audio:
            assert_refused(preparer, audio_part, "audio", family)
    assert named(video_cell, VIDEO_WORDS) == video_outcomes, (row, video_cell)
    assert named(audio_cell, AUDIO_WORDS) == audio_outcomes, (row, audio_cell)
