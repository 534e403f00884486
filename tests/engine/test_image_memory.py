"""Engine memory under big legal images (docs/images.md, "Memory"), on a real engine process.

Found on the old engine: four legal 7000x7000 PNGs (160 KB each) took its RSS from 846 to 2418
MiB, because every image was decoded at full size (140 MiB of RGB) and kept until the generation
thread ran the processor on it, and freed pixels stayed in per-thread malloc arenas. Now an image
is decoded reduced, at most `--image-decode-slots` of them are full size at once, and freed
pixels go back to the system. Judged by the engine's peak RSS (VmHWM) and its RSS afterwards.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from tests._services import ServiceProcess, start_engine
from vlmserve.client import channel_options
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from .test_request_prep import big_png

pytestmark = [
    pytest.mark.needs_model,
    pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc"),
]

SIDE = 7000  # 49 Mpx: under the per-image limit (50 Mpx)
FULL_SIZE_MIB = SIDE * SIDE * 3 / 2**20  # one decoded RGB image: 140 MiB
CONCURRENT = 6


def memory_mib(pid: int) -> dict[str, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    return {name: int(kib) / 1024 for name, kib in re.findall(r"(VmRSS|VmHWM):\s+(\d+)", status)}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    service = start_engine(
        tmp_path_factory.mktemp("image-memory"),
        model=str(RANDOM_MODEL_PATH),
        extra=("--image-decode-slots", "1", "--no-warmup"),
    )
    yield service
    service.stop()


def generate(stub: pb_grpc.EngineServiceStub, *parts: pb.Part) -> pb.GenerateResult:
    request = pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=list(parts))], sampling=pb.SamplingParams(max_tokens=2)
    )
    return stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=300).result


def test_concurrent_big_images_stay_within_one_full_size_decode(engine: ServiceProcess) -> None:
    image = pb.Part(image=pb.ImagePart(data=big_png(SIDE), media_type="image/png"))
    question = pb.Part(text=pb.TextPart(text="?"))
    pid = engine.process.pid
    with grpc.insecure_channel(engine.address, options=channel_options()) as channel:
        stub = pb_grpc.EngineServiceStub(channel)
        generate(stub, question)  # the first request's one-off allocations, before measuring
        before = memory_mib(pid)["VmRSS"]
        Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM restarts from the current RSS
        with ThreadPoolExecutor(CONCURRENT) as pool:
            results = list(pool.map(lambda _: generate(stub, image, question), range(CONCURRENT)))
        after = memory_mib(pid)
    assert [result.usage.image_count for result in results] == [1] * CONCURRENT
    peak_growth, kept = after["VmHWM"] - before, after["VmRSS"] - before
    print(
        f"{CONCURRENT} x {SIDE}x{SIDE} PNG: RSS {before:.0f} MiB, peak +{peak_growth:.0f}, after +{kept:.0f}"
    )
    # One decode slot: one full-size image at a time (the old engine held all six: +840 MiB
    # and more), and nothing of them kept once answered.
    assert peak_growth < 2 * FULL_SIZE_MIB
    assert kept < FULL_SIZE_MIB / 2


def test_four_such_images_in_one_request_are_refused_from_their_headers(engine: ServiceProcess) -> None:
    image = pb.Part(image=pb.ImagePart(data=big_png(SIDE), media_type="image/png"))
    pid = engine.process.pid
    with grpc.insecure_channel(engine.address, options=channel_options()) as channel:
        stub = pb_grpc.EngineServiceStub(channel)
        before = memory_mib(pid)["VmRSS"]
        Path(f"/proc/{pid}/clear_refs").write_text("5")
        with pytest.raises(grpc.RpcError) as caught:
            generate(stub, image, image, image, image)
        after = memory_mib(pid)
    error: grpc.RpcError = caught.value
    assert error.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert "messages[0].parts[1]" in error.details()  # type: ignore[attr-defined]
    assert "per-request limit" in error.details()  # type: ignore[attr-defined]
    assert after["VmHWM"] - before < FULL_SIZE_MIB / 4  # nothing was decoded
