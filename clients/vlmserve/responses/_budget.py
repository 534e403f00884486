"""One request's budget of images, PDF pages and file bytes: the one place they are counted and
refused.

The translation charges it as it produces them (`_items.py`, `_files.py`): the images of each
item once the item is typed (its own, a referenced item's, a replayed turn's), before any image
is decoded or fetched, so a 60-byte reference to an item with 16 images costs nothing to refuse;
a file's bytes, and its image or its PDF's pages, when the file is read. Earlier turns replayed
as contract messages are charged as they join the conversation. Every run of a translation makes
its own budget (the facade may run one twice, `DocumentTranslation`), so nothing is charged twice.

The engine keeps its own bound on images: a safety for raw gRPC clients, not a second count of
this one's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vlmserve.common.documents import DocumentLimits
from vlmserve.engine.v1 import engine_pb2 as pb

from ._computer import ComputerCallOutputParam
from ._errors import InvalidRequestError
from ._input_models import (
    ChatImagePartParam,
    CustomToolCallOutputParam,
    FunctionCallOutputParam,
    InputImagePartParam,
    MessageParam,
)

__all__ = ["RequestBudget", "contract_image_count", "item_image_count"]

# What refusals name: the request's input (a conversation's `items` are renamed by their route).
_PARAM = "input"


@dataclass
class RequestBudget:
    """Images, PDF pages and file bytes one request holds so far, and its bounds (None: no image
    bound)."""

    max_images: int | None = None
    max_pdf_pages: int = DocumentLimits().max_pages_per_request
    max_file_bytes: int = DocumentLimits().max_file_bytes_per_request
    images: int = 0
    pages: int = 0
    file_bytes: int = 0

    def count_images(self, count: int) -> None:
        """Images the typed items will produce: counted first, all checked by `check_images`
        (the refusal then states the request's full total)."""
        self.images += count

    def check_images(self) -> None:
        if self.max_images is not None and self.images > self.max_images:
            raise InvalidRequestError(
                f"Invalid value for '{_PARAM}': at most {self.max_images} images per request on this "
                f"server (this request has {self.images}, earlier turns included).",
                param=_PARAM,
                code="too_many_images",
            )

    def charge_images(self, count: int) -> None:
        """Images produced (a file's image, rendered pages): counted and checked at once."""
        self.count_images(count)
        self.check_images()

    def pages_left(self) -> int:
        """PDF pages the request may still render (the renderer refuses a longer PDF unrendered)."""
        return max(0, self.max_pdf_pages - self.pages)

    def charge_pages(self, count: int, *, param: str) -> None:
        """Rendered pages (at `param`, the file part): each is a page and an image."""
        self.pages += count
        if self.pages > self.max_pdf_pages:
            # The renderer bounds what it renders by `pages_left`; one that did not is refused here.
            raise InvalidRequestError(
                f"Invalid file at '{param}': the request's PDFs have more than {self.max_pdf_pages} pages.",
                param=param,
                code="file_too_large",
            )
        self.charge_images(count)

    def charge_file_bytes(self, count: int, *, param: str) -> None:
        """A file read by id (at `param`, its `file_id`): every use counts."""
        self.file_bytes += count
        if self.file_bytes > self.max_file_bytes:
            raise InvalidRequestError(
                f"The files this request names add more than {self.max_file_bytes} bytes.",
                param=param,
                code="files_too_large",
            )


def item_image_count(item: object) -> int:
    """The images a typed input item's conversion produces from its image parts (files are
    charged when read: only then is it known what they hold)."""
    if isinstance(item, MessageParam):
        parts: object = item.content
    elif isinstance(item, FunctionCallOutputParam | CustomToolCallOutputParam):
        parts = item.output
    elif isinstance(item, ComputerCallOutputParam):
        return 1  # its screenshot
    else:
        return 0
    if not isinstance(parts, list):
        return 0
    return sum(1 for part in parts if isinstance(part, InputImagePartParam | ChatImagePartParam))


def contract_image_count(messages: Iterable[pb.Message]) -> int:
    """Images in contract messages (earlier turns as they were translated), tool outputs too."""
    count = 0
    for message in messages:
        parts = list(message.parts)
        if message.HasField("tool_output") and message.tool_output.WhichOneof("output") == "parts":
            parts += message.tool_output.parts.parts
        count += sum(1 for part in parts if part.WhichOneof("kind") == "image")
    return count
