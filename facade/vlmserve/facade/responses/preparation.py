"""Turning a `POST /v1/responses` body into a ready `Generation`: model, replay, translation, limits.

Everything about the Responses JSON itself (validation, items, parts, lowering, tools) is the
translation package's job; this module only fetches what the translation needs from the store
and the engine, and applies the facade's own limits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import dataclasses
import functools
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import ParamSpec, TypeVar

from vlmserve.client import MAX_MESSAGE_BYTES, EngineError, NotFoundError
from vlmserve.common.documents import DocumentLimits
from vlmserve.common.wire_encode import HeldTexts, OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.documents.pdf_translation import DocumentTranslation, has_file_parts
from vlmserve.facade.documents.pdf_workers import PdfWorkers
from vlmserve.facade.engines.catalog import image_limits, images_per_request
from vlmserve.facade.engines.pools import ModelRouter, ResolvedModel
from vlmserve.facade.http.errors import (
    APIError,
    PartPath,
    from_engine_error,
    model_not_found,
    not_found,
    previous_response_not_found,
    request_too_large_for_engine,
)
from vlmserve.facade.http.limits import check_tools
from vlmserve.facade.http.metrics import FacadeMetrics
from vlmserve.facade.remote_images.fetcher import RequestImageSource
from vlmserve.facade.responses import ids
from vlmserve.facade.responses.compaction_seal import CompactionSeal, read_or_create_key
from vlmserve.facade.responses.connection_memory import ConnectionMemory
from vlmserve.facade.responses.engine_call import EngineCall
from vlmserve.facade.responses.events import ResponseEvents
from vlmserve.facade.responses.item_references import ItemReferences, check_reference_count
from vlmserve.facade.responses.key_admission import EngineSlots, KeyAdmission
from vlmserve.facade.responses.recorder import ResponseRecorder
from vlmserve.facade.responses.resource import new_resource
from vlmserve.facade.responses.running import Generation, track_unclaimed
from vlmserve.facade.responses.truncation import truncate_to_fit
from vlmserve.facade.settings import FacadeSettings, Files, Limits
from vlmserve.facade.store.disk_space import DiskSpace
from vlmserve.facade.store.files import FileRepository, RequestFiles
from vlmserve.facade.store.quotas import check_room, stored_size
from vlmserve.facade.store.records import MissingChainLinkError, Replay, StoredItem
from vlmserve.facade.store.repositories import Store
from vlmserve.responses import (
    CompactionState,
    CreateRequest,
    CreateResponseBody,
    ImageSource,
    PdfRenderer,
    TranslatedRequest,
    build_generate_request,
    opening_compactions,
    parse_create_request,
)
from vlmserve.server.logs import bind_response

logger = logging.getLogger("vlmserve.facade")

ImageSourceFactory = Callable[[], ImageSource | None]


def part_path_of(translated: TranslatedRequest, messages: int) -> PartPath:
    """`TranslatedRequest.engine_part_path` for the request as sent (`messages` of them)."""
    return functools.partial(translated.engine_part_path, request_messages=messages)


def clip_source_of(image_source: ImageSource | None) -> ImageSource | None:
    """Remote video and audio URLs: the safe fetcher's, under the image allowlist and the same
    request budget (docs/video-audio.md); none where remote images are off or another source
    was plugged in (it fetches images only)."""
    return image_source.clip if isinstance(image_source, RequestImageSource) else None


CompactionOpener = Callable[[str], CompactionState | None]
P = ParamSpec("P")
T = TypeVar("T")


def _conversation_id(body: CreateResponseBody) -> str | None:
    conversation = body.conversation
    return conversation if conversation is None or isinstance(conversation, str) else conversation.id


@dataclass
class Translation:
    translated: TranslatedRequest
    # The model the request asked for (or continues with), and its engine's info.
    model: ResolvedModel
    info: pb.GetModelInfoResponse
    # `input` as it is stored: references replaced by what they resolved to.
    input_items: list[StoredItem]
    # The earlier turns it continues (previous_response_id, conversation), as replayed.
    replay: Replay = field(default_factory=Replay)


@dataclass
class ResponsesService:
    settings: FacadeSettings
    # Every model served: a request's `model` picks its engines, info and limits.
    models: ModelRouter
    store: Store
    # Makes the image source for one request (remote http(s) images); None: remote URLs refused.
    image_sources: ImageSourceFactory | None = None
    # Generations in flight, by response id (for the cancel endpoint and shutdown).
    running: dict[str, Generation] = field(default_factory=dict)
    metrics: FacadeMetrics | None = None
    # Uploaded files (`file_id` in requests); None: only inline files.
    files: FileRepository | None = None
    # Responses per key at once, and this facade's engine calls shared fairly (key_admission.py).
    admission: KeyAdmission = field(default_factory=lambda: KeyAdmission(None))
    slots: EngineSlots = field(default_factory=lambda: EngineSlots(None))
    # Responses admitted as asking for logprobs (counted apart by `admission`).
    _with_logprobs: set[str] = field(default_factory=set, init=False, repr=False)
    # Free space for what is stored (disk_space.py); None: not checked.
    disk: DiskSpace | None = None
    # Translation threads (base64 decoding, image checks, remote fetches): a pool of their own,
    # so that slow remote image hosts can hold at most these and never the store's threads.
    _translators: concurrent.futures.ThreadPoolExecutor = field(init=False, repr=False)
    # Requests that carry files translate on threads of their own, PDFs render in worker
    # processes (documents/).
    _documents: DocumentTranslation = field(init=False, repr=False)

    # Seals and opens compaction items (compaction_seal.py): made on first use (its key file too).
    _seal: CompactionSeal | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self._translators = concurrent.futures.ThreadPoolExecutor(
            max_workers=self.settings.limits.translation_workers, thread_name_prefix="translate"
        )
        files = self.settings.files
        workers = PdfWorkers(
            workers=files.pdf_workers,
            memory_bytes=files.pdf_worker_memory_mib * 2**20,
            cpu_s=files.pdf_worker_cpu_s,
            timeout_s=files.pdf_timeout_s,
        )
        self._documents = DocumentTranslation(workers, self._translators)
        # Idle workers go when the service does (tests build many apps without a lifespan).
        weakref.finalize(self, self._translators.shutdown, wait=False)
        weakref.finalize(self, self._documents.close)

    async def run_translation(self, function: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run blocking translation work on the translation pool, off the event loop."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._translators, functools.partial(function, *args, **kwargs))

    @property
    def seal(self) -> CompactionSeal:
        if self._seal is None:
            self._seal = CompactionSeal(read_or_create_key(self.settings.compaction_key_path()))
        return self._seal

    def compaction_opener(self, owner: str) -> CompactionOpener:
        """Opens the compaction items of `owner`'s requests (and only theirs)."""
        seal = self.seal
        return lambda content: seal.open(content, owner=owner)

    async def parse(self, body: object, *, owner: str = "") -> CreateRequest:
        """A `POST /v1/responses` body (or a WebSocket create) parsed, on the translation pool; its
        compaction items opened for `owner`."""
        opener = self.compaction_opener(owner)

        def parse() -> CreateRequest:
            with opening_compactions(opener):
                return parse_create_request(body)

        return await self.run_translation(parse)

    async def context_length(self, create: CreateRequest) -> int | None:
        """The context of the model a request names (None: unknown); its info is cached."""
        if create.body.model is None:
            return None
        return (await self.models.resolve(create.body.model)).info.context_length or None

    async def translate(
        self,
        create: CreateRequest,
        *,
        owner: str = "",
        hold_texts: bool = False,
        memory: ConnectionMemory | None = None,
    ) -> Translation:
        """Translate a parsed request, with its replayed history, for its model's engines (the
        history is rendered by the new model's template, whichever model made it).
        `hold_texts`: the input's long texts stay the client's strings (`TranslatedRequest.held`),
        for a request sent by `generate` and stored by this store, which write them in place.
        `memory`: a WebSocket connection's last response, continued without the store."""
        body = create.body
        model = await self._model(body, owner)
        limits = model.limits
        check_tools(body.tools, limits)
        check_reference_count(body.input, limits.max_item_references, param="input")
        info = model.info
        allowed_images = images_per_request(info, limits)
        replay = await self._replay(body, owner, max_depth=limits.max_chain_depth, memory=memory)
        references = ItemReferences(
            lambda item_id: self.store.responses.find_item(item_id, owner=owner),
            param="input",
            max_bytes=limits.max_request_bytes,
        )
        replayed = replay.raw_items()
        await references.resolve_all(body.input, replayed=replayed)
        # Sources are made in each run: a run moved to the PDF threads starts with fresh budgets
        # (the translation's own budget of images and pages too, `vlmserve.responses._budget`).
        opener = self.compaction_opener(owner)

        def build(renderer: PdfRenderer) -> TranslatedRequest:
            image_source = self.image_source()
            # Replayed and referenced items are parsed here: their compaction items open too.
            with opening_compactions(opener):
                return build_generate_request(
                    create,
                    resolve_item=references,
                    image_source=image_source,
                    clip_source=clip_source_of(image_source),
                    image_limits=image_limits(info, limits),
                    replay=replayed,
                    history=replay.messages,
                    file_source=self.file_source(owner),
                    document_limits=self.document_limits(allowed_images, model.files),
                    pdf_renderer=renderer,
                    max_images=allowed_images,
                    held=HeldTexts() if hold_texts else None,
                )

        translated = await self._documents.run(
            build, with_files=has_file_parts(body.input) or has_file_parts(replayed)
        )
        outgoing = translated.outgoing
        # Measured where it is: ByteSize() would encode the request (twice its size, for a moment).
        if outgoing.wire_size() > MAX_MESSAGE_BYTES:
            raise request_too_large_for_engine()
        # The engine checks it names its model (its own id, not the facade's).
        outgoing.model = info.model_id
        self._apply_output_limit(outgoing.sampling, limits)
        return Translation(translated, model, info, references.stored_items(translated.input_items), replay)

    async def _served_model_id(self, body: CreateResponseBody, owner: str, model: ResolvedModel) -> str:
        """After the engine said it no longer serves the model the request was sent for (it was
        restarted on another one, and the cached info is stale): the info asked again, and the
        id its engine serves now, when the request's `model` still names that engine (the
        default, an alias, a configured id). A request for the old engine id is its 404."""
        model.pool.catalog.forget()
        again = await self._model(body, owner)
        if again.pool is not model.pool:
            raise model_not_found(body.model or "", served=self.models.served_names())
        return again.info.model_id

    async def _model(self, body: CreateResponseBody, owner: str) -> ResolvedModel:
        """The request's `model`; without one, the model of the response or conversation it
        continues (if that is still served), else the default."""
        if body.model is not None:
            return await self.models.resolve(body.model)
        remembered = await self._remembered_model(body, owner)
        if remembered is not None and self.models.pool_named(remembered) is not None:
            return await self.models.resolve(remembered)
        return await self.models.resolve(None)

    async def _remembered_model(self, body: CreateResponseBody, owner: str) -> str | None:
        """The model of the stored response (`previous_response_id`) or conversation a request
        continues; None when it names neither (or what it names is gone: a 404 later)."""
        previous = body.previous_response_id
        conversation_id = _conversation_id(body)
        remembered: object = None
        if previous is not None:
            stored = await self.store.responses.get(previous, owner=owner)
            remembered = stored.model if stored is not None else None
        elif conversation_id is not None:
            conversation = await self.store.conversations.get(conversation_id, owner=owner)
            remembered = conversation.model if conversation is not None else None
        return remembered if isinstance(remembered, str) else None

    @property
    def pdf_workers(self) -> PdfWorkers:
        return self._documents.workers

    def close(self) -> None:
        self._translators.shutdown(wait=False, cancel_futures=True)
        self._documents.close()

    async def prepare(
        self,
        create: CreateRequest,
        *,
        owner: str = "",
        memory: ConnectionMemory | None = None,
        release: Callable[[], None] | None = None,
        translation: Translation | None = None,
    ) -> Generation:
        """The generation of a parsed request: translated, checked, admitted, ready to open. The
        engine request is final here: nothing is set on it after.

        The admission is the last step: what follows it is the caller's, and a generation no
        caller takes over (`Generation.claim`, by `delivery.finisher`) is abandoned when its
        request ends (`delivery.AbandonUnclaimed`), with `release` (what the request holds for
        it): no failure after the admission keeps the key's place or the body's bytes.
        """
        # `translation`: this request's, made by a check before (auto_compaction.py), as here.
        if translation is None:
            translation = await self.translate(create, owner=owner, hold_texts=True, memory=memory)
        translated, info, model = translation.translated, translation.info, translation.model
        truncated = 0
        if translated.echo.truncation == "auto":
            translated, truncated = await self._truncated(translation)
        outgoing = translated.outgoing
        if translated.echo.store or translated.conversation_id is not None:
            if self.disk is not None:
                self.disk.check("the response")
            await check_room(
                self.store,
                self.settings.storage,
                owner=owner,
                adding=stored_size(translation.input_items, translated.input_messages),
                conversation_id=translated.conversation_id,
                param="input",
            )
        logprobs = outgoing.sampling.logprobs
        response_id = ids.new_id(ids.RESPONSE)
        # The rest of this request's log lines (and a background run's, started from here) name it.
        bind_response(response_id)
        outgoing.request_id = response_id
        # The engine's prefix cache is partitioned by this (the owner id is a hash of the key).
        outgoing.partition_key = owner
        resource = new_resource(
            translated, response_id=response_id, model_id=model.id, conversation_id=translated.conversation_id
        )
        if truncated:
            resource.truncated_items = truncated
        builder = ResponseEvents(resource, offered_tools=translated.tools.offered)
        call = EngineCall(
            outgoing,
            model.engine,
            timeout_s=model.generate_timeout_s,
            heartbeat_s=self.settings.timeouts.heartbeat,
            context_length=info.context_length or None,
            retry_after_s=self.settings.retry_after_s,
            slots=self.slots,
            owner=owner,
            refresh_model=functools.partial(self._served_model_id, create.body, owner, model),
            # Truncation may have left out some of the input: then the engine's places are not
            # the translation's, and its errors name the input as a whole.
            part_path=None if truncated else part_path_of(translated, len(outgoing.turns())),
        )
        recorder = ResponseRecorder(
            self.store,
            builder,
            translated,
            translation.input_items,
            owner=owner,
            conversation_id=translated.conversation_id,
            max_stored_bytes=self.settings.storage.max_stored_bytes_per_key,
        )
        generation = Generation(response_id, translated, builder, call, recorder, on_finish=self._forget)
        # Counted until the generation is forgotten (`_forget`): 429 past the key's limit.
        self.admission.admit(owner, logprobs=logprobs)
        if logprobs:
            self._with_logprobs.add(response_id)
        self.running[response_id] = generation
        track_unclaimed(generation, release)
        if memory is not None:
            memory.started(response_id, translation.replay, translated)
        if translated.tools.ignored:
            logger.info(
                "response %s: hosted tools left out of the prompt: %s",
                response_id,
                ", ".join(sorted(set(translated.tools.ignored))),
            )
        return generation

    async def _truncated(self, translation: Translation) -> tuple[TranslatedRequest, int]:
        """`truncation: "auto"`: the request with the oldest turns left out until the prompt fits
        (truncation.py), room kept for the output (its `max_output_tokens`, at most a quarter of
        the context), and how many messages went."""
        context = translation.info.context_length
        translated = translation.translated
        if not context:
            return translated, 0
        sampling = translated.outgoing.sampling
        reserve = min(sampling.max_tokens, context // 4) if sampling.HasField("max_tokens") else 0

        async def count(candidate: OutgoingRequest) -> int:
            try:
                # Measured with its long texts in place (markers would count as a few tokens).
                counted = await translation.model.engine.count_tokens(
                    candidate.whole(), timeout=self.settings.timeouts.control
                )
            except EngineError as error:
                raise from_engine_error(
                    error, context_length=context, retry_after_s=self.settings.retry_after_s
                ) from None
            return int(counted.input_tokens)

        budget = max(1, context - max(1, reserve))
        outgoing, dropped = await truncate_to_fit(translated.outgoing, count=count, budget=budget)
        if not dropped:
            return translated, 0
        # The input's stored messages are views into the request left behind: copied, so that
        # it is freed (the new request holds copies of its own).
        translated.input_messages.keep_whole()
        return dataclasses.replace(translated, outgoing=outgoing), dropped

    def image_source(self) -> ImageSource | None:
        """A fresh image source for one request (per-request byte budgets live in it)."""
        return self.image_sources() if self.image_sources is not None else None

    def media_sources(self) -> tuple[ImageSource | None, ImageSource | None]:
        """One request's remote image source and its remote video/audio source (one budget)."""
        image_source = self.image_source()
        return image_source, clip_source_of(image_source)

    def file_source(self, owner: str) -> RequestFiles | None:
        """The owner's uploaded files for one request."""
        if self.files is None:
            return None
        return RequestFiles(self.files, owner)

    def document_limits(self, allowed_images: int, files: Files) -> DocumentLimits:
        """Bounds on files in one request (`files`: its model's settings): its PDF pages are
        images, so count against its images; what its files by id read, against the request size."""
        return DocumentLimits(
            max_bytes=files.max_file_bytes,
            max_pages=files.max_pdf_pages,
            max_page_pixels=files.max_pdf_page_pixels,
            dpi=files.pdf_dpi,
            max_pages_per_request=allowed_images,
            max_file_bytes_per_request=self.settings.limits.max_request_bytes,
        )

    def _forget(self, generation: Generation) -> None:
        if self.running.pop(generation.response_id, None) is not None:
            logprobs = generation.response_id in self._with_logprobs
            self._with_logprobs.discard(generation.response_id)
            self.admission.done(generation.owner, logprobs=logprobs)
        if self.metrics is not None:
            self._count(self.metrics, generation)

    @staticmethod
    def _count(metrics: FacadeMetrics, generation: Generation) -> None:
        resource = generation.builder.resource
        metrics.responses.labels(resource.status).inc()
        metrics.count_request(generation.request)
        if resource.usage is not None:
            metrics.input_tokens.inc(resource.usage.input_tokens)
            metrics.output_tokens.inc(resource.usage.output_tokens)
        call = generation.call
        if call.first_output_at is not None:
            metrics.time_to_first_output.observe(call.first_output_at - call.created_at)

    async def _replay(
        self, body: CreateResponseBody, owner: str, *, max_depth: int, memory: ConnectionMemory | None = None
    ) -> Replay:
        """The stored turns a request continues from (previous_response_id, at most `max_depth`
        responses of it, or conversation); a WebSocket connection's last response from `memory`."""
        previous = body.previous_response_id
        conversation_id = _conversation_id(body)
        if previous is not None and body.conversation is None:
            remembered = memory.lookup(previous) if memory is not None else None
            if remembered is not None:
                return remembered
            try:
                replay = await self.store.responses.replay(
                    previous,
                    owner=owner,
                    max_depth=max_depth,
                )
            except MissingChainLinkError as error:
                raise previous_response_not_found(error.response_id) from None
            if replay is None:
                raise previous_response_not_found(previous)
            return replay
        if conversation_id is not None and previous is None:
            replay = await self.store.conversations.replay(conversation_id, owner=owner)
            if replay is None:
                raise not_found("conversation", conversation_id, param="conversation")
            return replay
        # Anything else is for the translation to accept or refuse with the right param.
        return Replay()

    @staticmethod
    def _apply_output_limit(sampling: pb.SamplingParams, limits: Limits) -> None:
        if not sampling.HasField("max_tokens"):
            default = limits.default_max_output_tokens
            if limits.max_output_tokens is not None:
                default = min(default or limits.max_output_tokens, limits.max_output_tokens)
            if default is not None:
                sampling.max_tokens = default
        elif limits.max_output_tokens is not None and sampling.max_tokens > limits.max_output_tokens:
            raise APIError(
                400,
                f"Invalid value for 'max_output_tokens': at most {limits.max_output_tokens} on this server.",
                param="max_output_tokens",
                code="invalid_value",
            )

    async def count_tokens(self, create: CreateRequest, *, owner: str = "") -> int:
        """The prompt's tokens, as `prepare` would send it."""
        translation = await self.translate(create, owner=owner)
        request = translation.translated.request
        engine, timeout = translation.model.engine, self.settings.timeouts.control
        try:
            try:
                counted = await engine.count_tokens(request, timeout=timeout)
            except NotFoundError as error:
                if error.field != "model":
                    raise
                # As for Generate (`EngineCall`): the engine changed models; asked again, once.
                request.model = await self._served_model_id(create.body, owner, translation.model)
                counted = await engine.count_tokens(request, timeout=timeout)
        except EngineError as error:
            raise self.counting_refused(error, translation, request) from None
        return int(counted.input_tokens)

    def counting_refused(
        self, error: EngineError, translation: Translation, request: pb.GenerateRequest
    ) -> APIError:
        """A failed CountTokens of `request` answered as Generate's would be: a refused part of
        the input named as the client wrote it. `count_tokens` and auto-compaction's counts."""
        return from_engine_error(
            error,
            context_length=translation.info.context_length or None,
            retry_after_s=self.settings.retry_after_s,
            part_path=part_path_of(translation.translated, len(request.messages)),
        )

    async def cancel_all(self) -> None:
        """Shutdown: stop every generation still running."""
        await asyncio.gather(
            *(
                generation.cancel(self.settings.timeouts.control)
                for generation in list(self.running.values())
            ),
            return_exceptions=True,
        )
