"""One real engine per model family (training/families fixtures) and mlx-vlm's reference output.

The `family` fixture (module scope, one parameter per family) starts an engine in this process
on the family's fixture, over loopback gRPC, with the prefix cache on. Its `reference` is a
second copy of the model, loaded and cast exactly as the engine loads it, for mlx-vlm's own
generation loop on the test thread (`reference_tokens`, `reference_generate`).
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from PIL import Image

from tests._family_models import FAMILY_NAMES
from vlmserve.common.images import decode_image
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.model import LoadedModel, load_model
from vlmserve.engine.prep.image_inputs import ImageProcessorCall
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.rpc.server import EngineServer
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

MAX_TOKENS = 12


# mlx-vlm 0.7.10's LlavaProcessor passes `padding` to transformers 5's CLIP image processor,
# which refuses it: every LLaVA image request fails inside mlx-vlm (docs/models.md).
@dataclass
class FamilyEngine:
    name: str
    address: str
    stub: pb_grpc.EngineServiceStub
    # The reference copy, used on the test thread only.
    reference: LoadedModel


@dataclass
class RunningEngine:
    """An EngineServer on its own event-loop thread; `stop()` shuts both down."""

    server: EngineServer
    address: str
    loop: asyncio.AbstractEventLoop
    thread: threading.Thread

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self.server.shutdown(grace_seconds=5), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@contextmanager
def running_engine(
    model_dir: Path, **settings: Any
) -> Iterator[tuple[RunningEngine, pb_grpc.EngineServiceStub]]:
    """An engine on `model_dir` (and `settings`), loaded, and a stub for it; stopped on exit."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="family-engine-loop", daemon=True)
    thread.start()
    # The prefix cache is on: a request sharing a prompt prefix with the previous one continues
    # from its cache (trimmed), which must not change a single token.
    config = EngineConfig(
        **{"model": str(model_dir), "max_output_tokens": 256, "warmup": False, "prefix_cache_min_tokens": 16}
        | settings
    )

    async def start() -> tuple[EngineServer, str]:
        server = EngineServer(config)
        return server, await server.start("127.0.0.1:0")

    server, address = asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    engine = RunningEngine(server, address, loop, thread)
    try:
        server.load()
        asyncio.run_coroutine_threadsafe(server.wait_loaded(), loop).result(120)
        with grpc.insecure_channel(address) as channel:
            yield engine, pb_grpc.EngineServiceStub(channel)
    finally:
        engine.stop()


@pytest.fixture(scope="module", params=FAMILY_NAMES)
def family(request: pytest.FixtureRequest, family_models: dict[str, Path]) -> Iterator[FamilyEngine]:
    name: str = request.param
    model_dir = family_models[name]
    with running_engine(model_dir) as (engine, stub):
        yield FamilyEngine(name, engine.address, stub, reference_model(model_dir, engine))


def reference_model(model_dir: Path, engine: RunningEngine) -> LoadedModel:
    """A second load of `engine`'s model, with its image limits, for mlx-vlm's own generation."""
    reference = load_model(
        str(model_dir),
        max_output_tokens=64,
        image_limits=engine.server.generator.config.image_limits,
        max_images_per_request=16,
    )
    # mlx-vlm's own input preparation hands `padding` to the image processor, which LLaVA's
    # refuses (the engine filters it the same way): the reference gets the same filter.
    reference.processor.image_processor = ImageProcessorCall(reference.processor.image_processor)
    return reference


# -- conversations ------------------------------------------------------------------------------


def png(width: int, height: int, seed: int) -> bytes:
    """A deterministic image with structure (gradients plus noise), so the vision tower matters."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width]
    pixels = np.stack([x * 255 // width, y * 255 // height, rng.integers(0, 256, (height, width))], axis=-1)
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8)).save(buffer, format="PNG")
    return buffer.getvalue()


def text(value: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=value))


def image(data: bytes) -> pb.Part:
    return pb.Part(image=pb.ImagePart(data=data, media_type="image/png"))


def user(*parts: pb.Part) -> pb.Message:
    return pb.Message(role=pb.ROLE_USER, parts=list(parts))


SYSTEM = pb.Message(role=pb.ROLE_SYSTEM, parts=[text("You are terse.")])
WIDE = png(96, 64, seed=1)
TALL = png(56, 84, seed=2)

TOOL_SCREENSHOT = [
    SYSTEM,
    user(text("Take a screenshot and describe it.")),
    pb.Message(
        role=pb.ROLE_ASSISTANT,
        tool_calls=[pb.ToolCall(id="call_screenshot01", name="screenshot", arguments="{}")],
    ),
    pb.Message(
        role=pb.ROLE_TOOL,
        tool_output=pb.ToolOutput(
            call_id="call_screenshot01", parts=pb.PartList(parts=[text("captured"), image(TALL)])
        ),
    ),
]

SCREENSHOT_TOOL = pb.Tool(
    function=pb.FunctionTool(name="screenshot", description="Capture the screen.", parameters_json="{}")
)


def screenshot_turn(result: pb.GenerateResult, call_id: str, seed: int) -> list[pb.Message]:
    """An agent loop's next two messages: the model's answer (its thinking and text) with a
    `screenshot` call it never generated, and the tool's output with a new screenshot."""
    return [
        pb.Message(
            role=pb.ROLE_ASSISTANT,
            parts=[text(result.text)] if result.text else [],
            reasoning_text=result.reasoning_text,
            tool_calls=[pb.ToolCall(id=call_id, name="screenshot", arguments="{}")],
        ),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_output=pb.ToolOutput(
                call_id=call_id,
                parts=pb.PartList(parts=[text("captured"), image(png(64, 48, seed=seed))]),
            ),
        ),
    ]


CONVERSATIONS: dict[str, list[pb.Message]] = {
    "text": [SYSTEM, user(text("Name three colours of the sea at dusk."))],
    "one_image": [SYSTEM, user(image(WIDE), text("What is in this picture?"))],
    "two_images": [SYSTEM, user(text("Compare"), image(WIDE), text("with"), image(TALL), text("briefly."))],
    # A screenshot returned by a tool, as the facade sends it: lowered into a user turn after
    # the tool turn.
    "tool_output_image": lower_messages(TOOL_SCREENSHOT),
    # The same as a gRPC caller may send it: the engine lowers it itself.
    "tool_output_image_unlowered": TOOL_SCREENSHOT,
}


def greedy(messages: list[pb.Message], max_tokens: int = MAX_TOKENS) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        messages=messages, sampling=pb.SamplingParams(temperature=0.0, max_tokens=max_tokens)
    )


def prompt_adds_special_tokens(prompt: str, tokenizer: Any) -> bool:
    """Tokenizer specials (BOS) are added unless the template already wrote the BOS token."""
    bos = tokenizer.bos_token
    return not (bos and prompt.startswith(bos))


def reference_steps(
    loaded: LoadedModel,
    messages: list[pb.Message],
    max_tokens: int,
    *,
    processor: Any = None,
    **clips: Any,
) -> tuple[list[Any], int]:
    """(mlx-vlm's generation steps, prompt tokens) on the engine's prompt, its images and
    `clips` (`prepare_inputs`'s videos, fps, audio: tests/engine/_clips.py).

    The inputs are prepared with mlx-vlm's own `prepare_inputs` (by `processor`, else the
    model's), with one BOS token (mlx-vlm's `should_add_special_tokens` adds a second one for
    gemma3, mistral3 and llama4); the text is the full decode of the generated tokens (mlx-vlm's
    streamed text drops a trailing partial character).
    """
    from mlx_vlm import stream_generate
    from mlx_vlm.utils import prepare_inputs

    assert loaded.template is not None
    rendered = render_prompt(messages, template=loaded.template)
    extra = dict(clips)
    if rendered.images:
        extra["images"] = [
            decode_image(
                item.part.data, declared_media_type=item.part.media_type, limits=loaded.info.image_limits
            )
            for item in rendered.images
        ]
    inputs = dict(
        prepare_inputs(
            processor or loaded.processor,
            prompts=[rendered.text],
            add_special_tokens=prompt_adds_special_tokens(rendered.text, loaded.tokenizer),
            **extra,
        )
    )
    input_ids = inputs.pop("input_ids")
    steps = list(
        stream_generate(
            loaded.model,
            loaded.processor,
            rendered.text,
            input_ids=input_ids,
            pixel_values=inputs.pop("pixel_values", None),
            mask=inputs.pop("attention_mask", None),
            max_tokens=max_tokens,
            temperature=0.0,
            **{k: v for k, v in inputs.items() if v is not None},
        )
    )
    final = steps[-1]
    assert final.finish_reason == "length" and len(final.token_ids) == max_tokens
    return steps, int(input_ids.shape[-1])


def reference_tokens(
    loaded: LoadedModel, messages: list[pb.Message], max_tokens: int
) -> tuple[list[int], int]:
    """(generated ids, prompt tokens) from mlx-vlm's loop on the engine's prompt and images."""
    steps, prompt_tokens = reference_steps(loaded, messages, max_tokens)
    return list(steps[-1].token_ids), prompt_tokens


def reference_generate(loaded: LoadedModel, messages: list[pb.Message], max_tokens: int) -> tuple[str, int]:
    tokens, prompt_tokens = reference_tokens(loaded, messages, max_tokens)
    return loaded.tokenizer.decode(tokens, skip_special_tokens=True), prompt_tokens


# -- tests --------------------------------------------------------------------------------------
