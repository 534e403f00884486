"""A start's progress: each phase logged as it begins, a reminder while one runs long, the
times of those done, and the one-line state the engine's "still loading" answer carries (and
the facade's /readyz passes on)."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import grpc
import pytest

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.load_progress import LoadProgress, weights_bytes
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.rpc.server import EngineServicer


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_phases_times_and_the_described_state(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "model.safetensors").write_bytes(bytes(2_500_000))
    clock = Clock()
    progress = LoadProgress(str(tmp_path), log_every_s=0, clock=clock)
    assert progress.describe() == "starting"
    with caplog.at_level(logging.INFO, logger="vlmserve.engine.load"):
        progress.enter("reading weights")
        clock.now += 4.0
        assert progress.describe() == "reading weights (step 1 of 3, 4.0 s)"
        progress.enter("building the engine")
        clock.now += 0.5
        progress.enter("warming up")
        clock.now += 1.25
        assert progress.describe() == (
            "warming up (step 3 of 3, 1.2 s; reading weights took 4.0 s; building the engine took 0.5 s)"
        )
        progress.done()
    assert progress.describe() == "ready"
    lines = [record.getMessage() for record in caplog.records]
    assert lines[0] == f"loading {tmp_path}: reading weights (step 1 of 3, 2.5 MB)"
    assert lines[2] == f"loading {tmp_path}: warming up (step 3 of 3)"
    assert lines[-1] == (
        f"loading {tmp_path}: done in 5.8 s "
        "(reading weights 4.0 s, building the engine 0.5 s, warming up 1.2 s)"
    )


def test_a_long_phase_is_logged_again(caplog: pytest.LogCaptureFixture) -> None:
    progress = LoadProgress("some/model", log_every_s=0.05)

    def reminders() -> int:
        return sum("still reading weights after" in r.getMessage() for r in caplog.records)

    with caplog.at_level(logging.INFO, logger="vlmserve.engine.load"):
        progress.enter("reading weights")
        deadline = time.monotonic() + 10
        while reminders() < 2:
            assert time.monotonic() < deadline, "no reminders"
            time.sleep(0.02)
        progress.done()
        said = reminders()
        time.sleep(0.2)  # none after the phase ended
        assert reminders() == said


def test_a_failure_is_described() -> None:
    progress = LoadProgress("m", log_every_s=0)
    progress.enter("reading weights")
    progress.fail(FileNotFoundError("no config.json"))
    assert progress.describe() == "reading weights failed: no config.json"


def test_weights_bytes_of_a_hub_id_is_unknown(tmp_path: Path) -> None:
    assert weights_bytes("mlx-community/some-model") is None
    assert weights_bytes(str(tmp_path)) is None


def test_the_still_loading_answer_says_how_far() -> None:
    generator = Generator(EngineConfig())  # not started: nothing is loaded
    servicer = EngineServicer(generator, workers=None)  # type: ignore[arg-type]
    with pytest.raises(RequestError) as refused:
        servicer._preparer()
    assert refused.value.code == grpc.StatusCode.UNAVAILABLE
    assert "the model is still loading: starting; retry shortly" in str(refused.value)
    generator.load_progress.log_every_s = 0
    generator.load_progress.enter("warming up")
    with pytest.raises(RequestError, match=r"still loading: warming up \(step 3 of 3, "):
        servicer._preparer()
