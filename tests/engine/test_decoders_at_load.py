"""The clip decoding workers start as the model loads, where the model takes clips (issue 34): the
real `vlmserve-engine` has its workers once it is ready, its first clip is decoded by one of them
(no process started for it), and SIGTERM ends them with the engine, without an ERROR. A model that
takes no clip (image-only) starts none: `ClipSupport.takes_clips` decides, a table here."""

from __future__ import annotations

import signal
import tempfile
from pathlib import Path

import cv2
import numpy as np
import pytest

from tests._services import start_engine
from vlmserve.client import EngineClient
from vlmserve.engine.media import worker
from vlmserve.engine.prep.clip_inputs import ClipSupport
from vlmserve.engine.v1 import engine_pb2 as pb

WORKER_MODULE = b"vlmserve.engine.media.worker_process"


@pytest.mark.parametrize(
    ("video", "audio", "takes"),
    [
        ("", False, False),  # image-only (or text-only): no workers, no memory spent on them
        ("native", False, True),  # Qwen-VL, Gemma 4 video
        ("frames", False, True),  # frames as images: a container is still decoded
        ("", True, True),  # audio only
        ("native", True, True),
    ],
)
def test_which_models_start_decoders(video: str, audio: bool, takes: bool) -> None:
    assert ClipSupport(family="f", video=video, audio=audio).takes_clips is takes


def decoding_workers(parent: int) -> set[int]:
    """Alive processes whose parent is `parent` and that run the decoding worker."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if int(fields[1]) == parent and fields[0] != "Z" and WORKER_MODULE in cmdline:
            found.add(int(stat.parent.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def mp4_clip() -> bytes:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "clip.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), 2.0, (64, 48))
        for index in range(4):
            writer.write(np.full((48, 64, 3), 60 * index, dtype=np.uint8))
        writer.release()
        return path.read_bytes()


@pytest.mark.needs_model
def test_engine_starts_its_decoders_at_load_and_ends_them_at_shutdown(tmp_path: Path) -> None:
    service = start_engine(tmp_path)  # qwen2-vl-tiny: Qwen2-VL takes video
    try:
        started = decoding_workers(service.process.pid)
        assert len(started) == worker.DECODE_SLOTS, service.log()[-2000:]
        request = pb.GenerateRequest(
            messages=[
                pb.Message(
                    role=pb.ROLE_USER,
                    parts=[
                        pb.Part(text=pb.TextPart(text="What happens?")),
                        pb.Part(video=pb.VideoPart(data=mp4_clip(), media_type="video/mp4")),
                    ],
                )
            ],
            sampling=pb.SamplingParams(max_tokens=1),
        )
        with EngineClient(service.address) as client:
            result = client.generate_unary(request)
        assert result.usage.input_tokens > 0
        # The first clip was decoded by a worker started at load: no other was started for it.
        assert decoding_workers(service.process.pid) == started
        service.process.send_signal(signal.SIGTERM)
        assert service.process.wait(timeout=60) == 0
    finally:
        service.stop()
    assert not [pid for pid in started if alive(pid)], "a decoding worker outlived the engine"
    log = service.log()
    assert "stopped" in log
    assert " ERROR " not in log and "Traceback" not in log, log[-3000:]
