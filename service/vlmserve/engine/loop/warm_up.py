"""The engine's own first generation (generation thread): one short request with an image, run
step by step on a runner of its own before serving, so the first request does not pay for kernel
setup. What it leaves in the caches goes."""

from __future__ import annotations

import io
import logging
import time

from vlmserve.engine.jobs import Job, JobKind
from vlmserve.engine.loop.wiring import EngineParts
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["warm_up"]

log = logging.getLogger(__name__)


def warm_up(loaded: LoadedModel, parts: EngineParts) -> None:
    from PIL import Image

    if loaded.template is None:
        return  # such a model takes no conversation, so no request would run
    started = time.perf_counter()
    png = io.BytesIO()
    Image.new("RGB", (112, 112), (127, 127, 127)).save(png, "PNG")
    parts_of_message = [pb.Part(text=pb.TextPart(text="warm-up"))]
    if parts.preparer.takes_images:
        parts_of_message.insert(0, pb.Part(image=pb.ImagePart(data=png.getvalue(), media_type="image/png")))
    request = parts.preparer.prepare(
        pb.GenerateRequest(
            request_id="warm-up",
            messages=[pb.Message(role=pb.ROLE_USER, parts=parts_of_message)],
            sampling=pb.SamplingParams(max_tokens=2, temperature=0.0),
        ),
        kind=JobKind.GENERATE,
    )
    runner = parts.new_runner()
    joined = [Job(request, None)]
    while joined or len(runner):
        runner.run_step(joined)
        joined = []
    parts.prefix_cache.clear()
    parts.vision_cache.clear()
    log.info("warm-up done in %.2fs", time.perf_counter() - started)
