"""SIGTERM on the real `vlmserve-engine` process: NOT_SERVING, refuse new work, drain, exit 0."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import pytest

from tests._services import start_engine
from vlmserve.client import EngineClient, UnavailableError
from vlmserve.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.needs_model


def request(max_tokens: int) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="Go on."))])],
        sampling=pb.SamplingParams(max_tokens=max_tokens),
    )


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests(tmp_path: Path) -> None:
    service = start_engine(tmp_path, extra=("--drain-seconds", "30"))
    try:
        with EngineClient(service.address) as client:
            stream = client.generate(request(max_tokens=300))
            assert next(stream).HasField("chunk")
            finished: list[pb.GenerateResponse] = []
            reader = threading.Thread(target=lambda: finished.extend(stream))
            reader.start()

            service.process.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 2
            while client.health():
                assert time.monotonic() < deadline, "readiness must turn NOT_SERVING on SIGTERM"
                time.sleep(0.02)
            with pytest.raises(UnavailableError):
                client.generate_unary(request(max_tokens=1))

            reader.join(30)
            assert finished and finished[-1].HasField("complete")
            # Drained, not cut off: it ran to its own end within the grace period.
            result = finished[-1].complete
            assert result.finish_reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_STOP)
            assert result.usage.output_tokens == 300 or result.finish_reason == pb.FINISH_REASON_STOP
        assert service.process.wait(timeout=30) == 0
    finally:
        service.stop()
    assert "shutting down" in service.log() and "stopped" in service.log()
