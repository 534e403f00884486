"""The one choke point for media in requests: image URLs (and files) become checked bytes.

Every image a request carries passes through `MediaPolicy.load_image`: `data:` URLs are
decoded here, remote http(s) URLs go to a pluggable `ImageSource` (none by default, so they
are refused), and every other scheme or bare path is refused outright. Whatever the origin,
the bytes are then checked by `vlmserve.common.images.inspect_image` (format sniffed from the
bytes, declared type must match, size and pixel count bounded from the header). Files
(`input_file`, `input_image.file_id`) come from a pluggable `FileSource` (`_files.py`); their
images, PDF pages included, go through the same check.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from vlmserve.common.clips import DEFAULT_MAX_CLIP_BYTES
from vlmserve.common.documents import DocumentLimits, PdfPage
from vlmserve.common.images import ImageError, ImageLimits, inspect_image, parse_data_url
from vlmserve.engine.v1 import engine_pb2 as pb

from ._budget import RequestBudget
from ._errors import InvalidRequestError
from ._output_models import ImageDetailName
from ._video_defaults import VideoDefaults


class ImageSource(Protocol):
    """Fetches a remote (http/https) image URL; a safe fetcher plugs in here.

    Return the raw bytes. Raise `ImageFetchError` with a short, client-safe reason when
    the image cannot be fetched; that reason is the client's whole error message. `data:`
    URLs never reach a source; other schemes and paths are refused before it.
    """

    def __call__(self, url: str) -> bytes: ...


@dataclass(frozen=True)
class FileContent:
    """An uploaded file as a `FileSource` returns it: its bytes and its name."""

    data: bytes
    filename: str


class FileSource(Protocol):
    """Looks up an uploaded file by id for the caller (the facade's files store plugs in here).

    Return None for an id the caller may not use (unknown, deleted, or another key's): the
    translation refuses it naming the part's `file_id`. Raise `ImageFetchError` with a short,
    client-safe reason for any other refusal (e.g. a per-request byte budget).
    """

    def __call__(self, file_id: str) -> FileContent | None: ...


class PdfRenderer(Protocol):
    """Renders a PDF's pages as `vlmserve.common.documents.render_pdf` does (the default, in this
    process). The facade plugs in worker processes with memory and CPU limits. Raise
    DocumentError for a PDF that cannot be rendered: the part's path goes with it to the client."""

    def __call__(
        self, data: bytes, limits: DocumentLimits, *, max_pixels: int | None, max_pages: int | None
    ) -> list[PdfPage]: ...


class ImageFetchError(Exception):
    """A remote image could not be fetched; `reason` is safe to show to the client."""

    def __init__(self, reason: str, *, code: str = "invalid_image_url") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


_DETAILS: dict[str, pb.ImageDetail.ValueType] = {
    "auto": pb.IMAGE_DETAIL_AUTO,
    "low": pb.IMAGE_DETAIL_LOW,
    "high": pb.IMAGE_DETAIL_HIGH,
    "original": pb.IMAGE_DETAIL_ORIGINAL,
}
DETAIL_NAMES: dict[pb.ImageDetail.ValueType, ImageDetailName] = {
    pb.IMAGE_DETAIL_AUTO: "auto",
    pb.IMAGE_DETAIL_LOW: "low",
    pb.IMAGE_DETAIL_HIGH: "high",
    pb.IMAGE_DETAIL_ORIGINAL: "original",
}


def parse_detail(value: object, param: str) -> pb.ImageDetail.ValueType:
    """`detail` low/high/auto/original; absent or null means auto."""
    if value is None:
        return pb.IMAGE_DETAIL_AUTO
    if not isinstance(value, str) or value not in _DETAILS:
        raise InvalidRequestError(
            f"Invalid value for '{param}': expected one of 'auto', 'low', 'high', 'original'.",
            param=param,
            code="invalid_value",
        )
    return _DETAILS[value]


@dataclass(frozen=True)
class MediaPolicy:
    """Where images may come from and how large they may be."""

    image_source: ImageSource | None = None
    limits: ImageLimits = field(default_factory=ImageLimits)
    file_source: FileSource | None = None
    documents: DocumentLimits = field(default_factory=DocumentLimits)
    # None: render_pdf, in this process.
    pdf_renderer: PdfRenderer | None = None
    # The request's images and PDF pages so far (`_budget.py`): one per translation run.
    budget: RequestBudget = field(default_factory=RequestBudget)
    # Remote video and audio URLs (http/https), under the same policy as images; None: refused.
    clip_source: ImageSource | None = None
    # Bytes per video or audio clip, bounded before its base64 is decoded (`_clips.py`).
    clip_max_bytes: int = DEFAULT_MAX_CLIP_BYTES
    # The request's `mm_processor_kwargs`: sampling for video parts that ask for none themselves.
    video_defaults: VideoDefaults = field(default_factory=lambda: VideoDefaults())

    @classmethod
    def for_request(
        cls,
        *,
        image_source: ImageSource | None = None,
        image_limits: ImageLimits | None = None,
        file_source: FileSource | None = None,
        document_limits: DocumentLimits | None = None,
        pdf_renderer: PdfRenderer | None = None,
        max_images: int | None = None,
        clip_source: ImageSource | None = None,
        clip_max_bytes: int = DEFAULT_MAX_CLIP_BYTES,
        video_defaults: VideoDefaults | None = None,
    ) -> MediaPolicy:
        """The policy of one translation run, with a fresh budget (`max_images`: None, unbounded)."""
        documents = document_limits or DocumentLimits()
        return cls(
            image_source=image_source,
            limits=image_limits or ImageLimits(),
            file_source=file_source,
            documents=documents,
            pdf_renderer=pdf_renderer,
            budget=RequestBudget(
                max_images=max_images,
                max_pdf_pages=documents.max_pages_per_request,
                max_file_bytes=documents.max_file_bytes_per_request,
            ),
            clip_source=clip_source,
            clip_max_bytes=clip_max_bytes,
            video_defaults=video_defaults or VideoDefaults(),
        )

    def load_image(self, url: str, detail: pb.ImageDetail.ValueType, *, param: str) -> pb.ImagePart:
        """Turn an image URL from a request into checked bytes; `param` names the URL's JSON path."""
        scheme, _, _ = url.partition(":")
        scheme = scheme.lower()
        try:
            if scheme == "data":
                declared, data = parse_data_url("data:" + url[5:], max_bytes=self.limits.max_bytes)
            elif scheme in ("http", "https"):
                declared, data = None, self._fetch(url, param)
            else:
                raise InvalidRequestError(
                    f"Invalid image URL at '{param}': send the image inline as a base64 data: URL "
                    "(data:image/png;base64,...); file paths and file:// URLs are not accepted.",
                    param=param,
                    code="invalid_image_url",
                )
        except ImageError as error:
            raise InvalidRequestError(
                f"Invalid image at '{param}': {error.reason}.", param=param, code=error.code
            ) from None
        return self.image_part(data, detail, param=param, declared_media_type=declared)

    def image_part(
        self,
        data: bytes,
        detail: pb.ImageDetail.ValueType,
        *,
        param: str,
        declared_media_type: str | None = None,
    ) -> pb.ImagePart:
        """Checked image bytes (from a URL, a file or a PDF page) as a contract image part."""
        try:
            info = inspect_image(data, declared_media_type=declared_media_type, limits=self.limits)
        except ImageError as error:
            raise InvalidRequestError(
                f"Invalid image at '{param}': {error.reason}.", param=param, code=error.code
            ) from None
        return pb.ImagePart(data=data, media_type=info.media_type, detail=detail)

    def _fetch(self, url: str, param: str) -> bytes:
        if self.image_source is None:
            raise InvalidRequestError(
                f"Invalid image URL at '{param}': remote image URLs are disabled on this server; "
                "send the image inline as a base64 data: URL (data:image/png;base64,...).",
                param=param,
                code="unsupported_value",
            )
        try:
            return self.image_source(url)
        except ImageFetchError as error:
            # The source's reason is the whole message, as OpenAI words it ("Error while
            # downloading <url>."); `param` says which part it was.
            raise InvalidRequestError(error.reason, param=param, code=error.code) from None
