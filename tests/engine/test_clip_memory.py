"""A clip's memory counts at admission like an image's (issue 34 on issue 37.4's budget): its
arrays and its tower's transient, a placeholder run at a time (tests/engine/test_memory_admission.py
has the images' side)."""

from __future__ import annotations

import pytest

from vlmserve.engine.v1 import engine_pb2 as pb

from .test_batching import prepared
from .test_engine_grpc import text_part
from .test_memory_admission import refused_for_the_tower_then_text_runs, started
from .test_request_prep import big_png

pytestmark = pytest.mark.needs_model


def test_a_clip_whose_tower_transient_can_never_fit_is_refused_naming_the_messages() -> None:
    """Two frames of a 1600x1000 screen: about 8 MiB of vision-tower activations beside well
    under 1 MiB of KV and arrays. A 2 MiB budget admitted it while clips were not counted."""
    generator = started(budget_mib=2)
    try:
        memory = generator.admission.memory
        assert memory is not None
        screen = pb.ImagePart(data=big_png(1600), media_type="image/png")
        clip = pb.Part(video=pb.VideoPart(frames=pb.VideoFrames(frames=[screen, screen], fps=2.0)))
        request = prepared(generator, clip, text_part("What happens on the screen?"), temperature=0.0, seed=1)
        assert [clip.kind for clip in request.clips] == ["video"] and request.clips[0].token_count > 0
        assert request.clip_arrays and "pixel_values_videos" in request.clip_arrays
        refused_for_the_tower_then_text_runs(generator, request, "What happens on the screen?")
    finally:
        generator.stop()
