"""A contract request -> a `PreparedRequest` for the generation thread. No MLX.

Runs in the engine's preparation worker threads, never on the generation thread, so a big image
or a long text delays only its own request. In order, each step refusing before the next costs
anything:

1. model name, request id, sampling values; messages checked and converted (`prompt.py`);
2. every image's header checked (format, pixels, JPEG scans; `vlmserve.common.images`), and the
   request's pixels summed against `max_request_pixels`, before any image is decoded; every
   video and audio part refused where the family cannot take it, then decoded within its bounds
   (`clip_prep.py`, `vlmserve.engine.media`), frames becoming images for a family without video;
3. the prompt rendered with the chat template, client special-token strings protected
   (`prompt_tokens.py`); a text whose length alone guarantees more tokens than the context is
   refused before it is tokenized;
4. tokenized (client text as text); over-long prompts refused before decoding images;
5. images decoded one or two at a time (`decode_slots`), each straight to about twice the
   processor's target size and dropped once the processor has its arrays (`image_inputs.py`);
   the caller leaving stops the work between images;
6. image tokens expanded, clips rendered by the family's processor (`clip_inputs.py`); the exact
   prompt length checked against the context.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import grpc
import numpy as np
from PIL import Image

from vlmserve.common.images import ImageError, ImageInfo, decode_image, inspect_image
from vlmserve.engine.computer.adapter import adapt_request
from vlmserve.engine.computer.conventions import convention_for
from vlmserve.engine.grammar.compiler import GrammarCompiler, after_thinking, constraint_for
from vlmserve.engine.jobs import JobKind, PreparedImage, PreparedRequest
from vlmserve.engine.media import MediaLimits
from vlmserve.engine.model import LoadedModel, ModelInfo, prompt_needs_special_tokens
from vlmserve.engine.output.assembler import prompt_leaves_thinking
from vlmserve.engine.prep.clip_inputs import (
    DecodedClip,
    check_placeholders,
    clip_support_for,
    processor_media,
    prompt_clips,
)
from vlmserve.engine.prep.clip_prep import ClipPreparer, ImageSlot, frame_image, ordered_slots, slot_pixels
from vlmserve.engine.prep.image_inputs import (
    DynamicResolution,
    GenericProcessor,
    ImageInputs,
    image_inputs_for,
    run_processor,
)
from vlmserve.engine.prep.prompt import (
    PromptImage,
    TemplateConversation,
    render_conversation,
    to_template_conversation,
)
from vlmserve.engine.prep.prompt_tokens import PromptTokenizer, Protection
from vlmserve.engine.request_errors import RequestError, context_too_long, invalid_argument
from vlmserve.engine.sampling import settings_from_proto
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["DEFAULT_MAX_REQUEST_PIXELS", "RequestPreparer", "check_model_name"]

log = logging.getLogger(__name__)

T = TypeVar("T")

MAX_REQUEST_ID_CHARS = 256
MAX_PARTITION_KEY_CHARS = 256
# Pixels of all of one request's images, from their headers: sixteen 2560x1440 screenshots
# (59 Mpx) pass, and so does one image at the per-image limit (50 Mpx).
DEFAULT_MAX_REQUEST_PIXELS = 64_000_000
PILLOW_BLOCK_BYTES = 64 * 1024 * 1024


def check_model_name(requested: str, info: ModelInfo) -> None:
    if requested and requested not in (info.model_id, info.source):
        raise RequestError(
            grpc.StatusCode.NOT_FOUND,
            f"model {requested!r} is not served here; this engine serves {info.model_id!r}",
            field="model",
        )


@dataclass(frozen=True, slots=True)
class _CheckedImage:
    source: PromptImage
    info: ImageInfo


def _return_freed_pixels_to_the_os() -> None:
    """Pillow allocates big images in 16 MiB blocks, which glibc serves from per-thread arenas
    and keeps once freed: every preparation thread went on holding a full-size decode (~150 MiB
    at 7000x7000, RSS climbing with each new thread). Blocks over glibc's largest mmap threshold
    (32 MiB on 64-bit) are mapped and unmapped instead, so freed pixels go back at once."""
    from PIL import _imaging

    _imaging.set_block_size(PILLOW_BLOCK_BYTES)


def _content_hash(image: _CheckedImage) -> str:
    return hashlib.sha256(image.source.part.data).hexdigest()


class RequestPreparer:
    """Prepares requests for one loaded model. Thread-safe; touches no MLX state."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        max_request_pixels: int,
        decode_slots: int,
        media_limits: MediaLimits | None = None,
    ) -> None:
        self.info = loaded.info
        self._processor = loaded.processor
        self._template = loaded.template
        self._grammar: GrammarCompiler | None = loaded.grammar
        self._tokenizer = loaded.tokenizer
        self._tokens = PromptTokenizer(loaded.tokenizer)
        self._images: ImageInputs | None = image_inputs_for(loaded.processor, loaded.tokenizer)
        support = clip_support_for(
            loaded.processor, loaded.model, frames_as_images=isinstance(self._images, GenericProcessor)
        )
        self._clips = ClipPreparer(support, media_limits or MediaLimits(), loaded.info.model_id)
        self._max_request_pixels = max_request_pixels
        self._computer = convention_for(loaded.info.architecture, loaded.processor)
        _return_freed_pixels_to_the_os()
        # Bounds the full-size decodes alive at once (a PNG cannot be decoded at a reduced scale).
        self._decode_slots = threading.BoundedSemaphore(max(1, decode_slots))

    @property
    def takes_images(self) -> bool:
        return self._images is not None

    @property
    def takes_clips(self) -> bool:
        """Whether the model takes video or audio in any form (clip_inputs.ClipSupport)."""
        return self._clips.support.takes_clips

    def prepare(
        self,
        request: pb.GenerateRequest,
        *,
        kind: JobKind,
        cancelled: Callable[[], bool] = lambda: False,
    ) -> PreparedRequest:
        """Validate, render, tokenize, prepare images; raises RequestError with the caller's status."""
        info = self.info
        check_model_name(request.model, info)
        if len(request.request_id) > MAX_REQUEST_ID_CHARS:
            raise invalid_argument(
                f"request_id is longer than {MAX_REQUEST_ID_CHARS} characters", field="request_id"
            )
        request_id = request.request_id or f"req_{uuid.uuid4().hex}"
        if len(request.partition_key) > MAX_PARTITION_KEY_CHARS:
            raise invalid_argument(
                f"partition_key is longer than {MAX_PARTITION_KEY_CHARS} characters", field="partition_key"
            )
        if self._template is None:
            raise RequestError(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"model {info.model_id!r} has no chat template, so it cannot take a conversation",
            )
        settings = settings_from_proto(request.sampling, max_tokens_cap=info.max_output_tokens)
        # First: from here on the computer tool is the model's `computer` function.
        request, computer = adapt_request(request, self._computer, self._image_size)
        conversation = to_template_conversation(
            request.messages,
            tools=request.tools,
            tool_choice=request.tool_choice if request.HasField("tool_choice") else None,
            enable_thinking=request.enable_thinking if request.HasField("enable_thinking") else None,
            response_format=request.response_format if request.HasField("response_format") else None,
            tool_call_format=info.tool_call_format,
        )
        checked = self._check_images(conversation.images)
        decoded_clips = self._clips.decode(conversation.clips, cancelled)
        conversation, native_clips, slots = self._clips.as_images(conversation, decoded_clips)
        protection = Protection()
        rendered = render_conversation(self._protected(conversation, protection), self._template)
        prompt_text = self._tokens.restore(rendered.text, protection)
        generating = kind is JobKind.GENERATE
        # Counting too: no count of a text this long can fit the context, and tokenizing 10 MB
        # of tool-call arguments held a preparation thread past the caller's deadline.
        at_least = self._tokens.minimum_tokens(prompt_text)
        _fit_context(at_least, info.context_length, at_least=True)
        add_special_tokens = prompt_needs_special_tokens(prompt_text, self._tokenizer)
        ids = self._tokens.encode(rendered.text, protection, add_special_tokens=add_special_tokens)
        if generating:  # early, before any image is decoded
            _fit_context(len(ids), info.context_length)
        joint_arrays = None
        clip_arrays: dict[str, np.ndarray] | None = None
        check_placeholders(ids, self._clips.support, native_clips)
        media = processor_media(self._processor, self._clips.support, native_clips)

        def encode(text: str, add: bool) -> list[int]:
            return self._tokens.encode(text, protection, add_special_tokens=add)

        order = ordered_slots(slots, len(checked))
        if isinstance(self._images, GenericProcessor) and (order or media):
            decoded = self._decode_images(checked, cancelled, lambda _image, pixels: pixels)
            low_detail = bool(checked) and all(
                image.source.part.detail == pb.IMAGE_DETAIL_LOW for image in checked
            )
            try:
                ids, joint_arrays = self._images.build(
                    rendered.text,
                    [slot_pixels(slot, decoded, decoded_clips) for slot in order],
                    encode,
                    add_special_tokens=add_special_tokens,
                    low_detail=low_detail,
                    media=media,
                )
            except (ValueError, TypeError, OSError) as error:
                log.warning("the processor failed: %s: %s", type(error).__name__, error)
                raise invalid_argument(
                    "the model's processor could not prepare the request's images, video or audio",
                    field="messages",
                ) from None
            del decoded
            images = tuple(_slot_image(slot, checked, decoded_clips, low_detail=low_detail) for slot in order)
        else:
            if media:  # the clips through the processor; the images' slots are expanded below
                try:
                    ids, clip_arrays = run_processor(
                        self._processor,
                        rendered.text,
                        encode,
                        add_special_tokens=add_special_tokens,
                        media=media,
                    )
                except (ValueError, TypeError, OSError) as error:
                    log.warning("the processor failed on clips: %s: %s", type(error).__name__, error)
                    raise invalid_argument(
                        "the model's processor could not prepare the request's video or audio",
                        field="messages",
                    ) from None
            images = tuple(self._decode_images(checked, cancelled, self._prepare_image))
            ids = self._expand_image_tokens(ids, images)
        arrays = joint_arrays if joint_arrays is not None else clip_arrays
        clips = prompt_clips(ids, self._clips.support, native_clips, arrays or {})
        if generating:
            _fit_context(len(ids), info.context_length)
        parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
        max_calls = request.max_tool_calls if request.HasField("max_tool_calls") else None
        tool_mode = "none" if max_calls == 0 else rendered.tool_mode
        if max_calls == 0 and rendered.tool_mode in ("required", "function"):
            raise invalid_argument(
                "max_tool_calls is 0 but tool_choice requires a call", field="max_tool_calls"
            )
        constraint = None
        if self._grammar is not None and generating:
            constraint = constraint_for(
                self._grammar,
                tool_call_format=info.tool_call_format,
                tools=request.tools,
                tool_mode=tool_mode,
                forced_name=rendered.forced_name,
                parallel_tool_calls=parallel,
                max_tool_calls=max_calls,
                response_format=request.response_format if request.HasField("response_format") else None,
            )
            if constraint is not None:
                constraint = after_thinking(
                    constraint, self._grammar, prompt_text, model_thinks=info.thinking
                )
        return PreparedRequest(
            request_id=request_id,
            kind=kind,
            prompt_ids=tuple(ids),
            images=images,
            settings=settings,
            prompt_text=prompt_text,
            tool_call_format=info.tool_call_format if tool_mode != "none" else "",
            parallel_tool_calls=parallel,
            max_tool_calls=max_calls,
            constraint=constraint,
            thinking=prompt_leaves_thinking(prompt_text),
            tools=tuple(conversation.tools or ()),
            joint_arrays=joint_arrays,
            # The model is part of the key: a cached prefix is never another model's (the disk
            # tier may be shared by engines).
            partition_key=f"{info.cache_namespace}\0{request.partition_key}",
            source=request,
            computer=computer,
            clips=clips,
            clip_arrays=clip_arrays,
        )

    # -- steps ------------------------------------------------------------------------------

    def _image_size(self, part: pb.ImagePart) -> tuple[int, int] | None:
        """A screenshot's size from its header (one that fails is refused later, by field)."""
        try:
            header = inspect_image(
                part.data, declared_media_type=part.media_type or None, limits=self.info.image_limits
            )
        except ImageError:
            return None
        return header.width, header.height

    def _check_images(self, images: Sequence[PromptImage]) -> list[_CheckedImage]:
        """Headers only: nothing is decoded before every image of the request passed."""
        info = self.info
        if len(images) > info.max_images_per_request:
            raise invalid_argument(
                f"the request has {len(images)} images; this engine takes at most "
                f"{info.max_images_per_request} per request",
                field="messages",
            )
        if images and self._images is None:
            raise invalid_argument(
                f"{images[0].where}: model {info.model_id!r} does not take images", field=images[0].where
            )
        checked: list[_CheckedImage] = []
        total = 0
        for image in images:
            try:
                header = inspect_image(
                    image.part.data,
                    declared_media_type=image.part.media_type or None,
                    limits=info.image_limits,
                )
            except ImageError as error:
                raise invalid_argument(
                    f"{image.where}: {error.reason}", field=f"{image.where}.image.data"
                ) from None
            total += header.width * header.height
            if total > self._max_request_pixels:
                raise invalid_argument(
                    f"{image.where}: the request's images have more than {self._max_request_pixels} pixels "
                    "in all (the per-request limit); send fewer or smaller images",
                    field=f"{image.where}.image.data",
                )
            checked.append(_CheckedImage(image, header))
        return checked

    def _protected(self, conversation: TemplateConversation, protection: Protection) -> TemplateConversation:
        """The conversation with special-token strings in client text swapped for placeholders."""
        tokens = self._tokens
        messages = tokens.protect(conversation.messages, protection)
        tools = tokens.protect(conversation.tools, protection)
        if not protection.originals:
            return conversation
        return dataclasses.replace(conversation, messages=messages, tools=tools)

    def _decode_images(
        self,
        checked: Sequence[_CheckedImage],
        cancelled: Callable[[], bool],
        then: Callable[[_CheckedImage, Image.Image], T],
    ) -> list[T]:
        """Decode each image (a few at a time, engine-wide), reduced to what the processor needs,
        and pass it to `then` at once; stops between images when the caller has left."""
        adapter = self._images
        assert adapter is not None  # _check_images refused images for a model without one
        results: list[T] = []
        for image in checked:
            if cancelled():
                raise RequestError(
                    grpc.StatusCode.CANCELLED, "the caller left while the request was prepared"
                )
            part = image.source.part
            where = image.source.where
            try:
                min_size = adapter.decode_size(image.info.width, image.info.height, part.detail)
                with self._decode_slots:
                    decoded = decode_image(
                        part.data,
                        declared_media_type=part.media_type or None,
                        limits=self.info.image_limits,
                        min_size=min_size,
                    )
                results.append(then(image, decoded))
                del decoded
            except ImageError as error:
                raise invalid_argument(f"{where}: {error.reason}", field=f"{where}.image.data") from None
            except (ValueError, TypeError, OSError) as error:
                log.warning("%s: the processor failed: %s: %s", where, type(error).__name__, error)
                raise invalid_argument(
                    f"{where}: the model's processor could not prepare the image", field=f"{where}.image.data"
                ) from None
        return results

    def _prepare_image(self, image: _CheckedImage, pixels: Image.Image) -> PreparedImage:
        assert isinstance(self._images, DynamicResolution)
        prepared = self._images.prepare(pixels, image.source.part.detail, _content_hash(image))
        return dataclasses.replace(prepared, byte_count=len(image.source.part.data))

    def _expand_image_tokens(self, ids: list[int], images: Sequence[PreparedImage]) -> list[int]:
        """Each image slot the template wrote becomes that image's run of image tokens."""
        if self._images is None:
            return ids
        slot = self._images.image_token_id
        slots = [index for index, token in enumerate(ids) if token == slot]
        if len(slots) != len(images):
            raise invalid_argument(
                f"the chat template wrote {len(slots)} image slots for {len(images)} images; "
                "this model's template does not place every image",
                field="messages",
            )
        if not images:
            return ids
        expanded: list[int] = []
        start = 0
        for position, image in zip(slots, images, strict=True):
            expanded += ids[start:position]
            expanded += [slot] * image.token_count
            start = position + 1
        expanded += ids[start:]
        return expanded


def _slot_image(
    slot: ImageSlot, checked: Sequence[_CheckedImage], clips: Sequence[DecodedClip], *, low_detail: bool
) -> PreparedImage:
    if slot.image < 0:
        return frame_image(slot, clips)
    image = checked[slot.image]
    # The hash covers the processing that shaped the pixels (the vision cache's key): the same
    # bytes in the processor's cheaper view are other features (GLM-4V: fewer image tokens).
    content_hash = _content_hash(image)
    if low_detail:
        content_hash = hashlib.sha256(f"{content_hash}:low".encode()).hexdigest()
    return PreparedImage(
        content_hash=content_hash, token_count=0, arrays={}, byte_count=len(image.source.part.data)
    )


def _fit_context(tokens: int, context: int, *, at_least: bool = False) -> None:
    """The one context-length rule: a prompt leaves at least one position of the model's
    context for output (the generation thread relies on it)."""
    if tokens >= context:
        raise context_too_long(tokens, context, at_least=at_least)
