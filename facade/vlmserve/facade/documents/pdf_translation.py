"""Where a translation runs: requests that carry PDFs on threads of their own, with the workers.

A PDF's translation waits for its worker process (seconds, up to `--pdf-timeout-s`); on the
threads plain requests translate on, eight slow PDFs made another key's "hi" wait 83 s. So a
request whose `input` (or replayed turns) holds an `input_file` is translated on the documents
threads, as many as there are PDF workers; any other request on the plain threads, where a PDF
found after all (an item reference's) stops the translation, which then starts again on the
documents threads. The translation is pure (its image and file sources are made afresh for each
run), so running it twice changes nothing but the time.

When the request's task is cancelled (its client went away), the request's cancel flag is set:
a render in progress kills its worker, a translation not started yet is dropped from the queue.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable
from typing import TypeVar

from pydantic import BaseModel

from vlmserve.common.documents import DocumentLimits, PdfPage
from vlmserve.facade.documents.pdf_workers import PdfWorkers
from vlmserve.responses import PdfRenderer

__all__ = ["DocumentTranslation", "has_file_parts"]

T = TypeVar("T")
FILE_PART_TYPES = ("input_file",)


class _NeedsPdfWorkers(Exception):
    """Raised by the plain threads' renderer: this translation belongs on the documents threads."""


def _not_here(
    data: bytes, limits: DocumentLimits, *, max_pixels: int | None, max_pages: int | None
) -> list[PdfPage]:
    raise _NeedsPdfWorkers


def has_file_parts(value: object) -> bool:
    """Whether any `input_file` part is anywhere in `value` (a request's input, stored items),
    walked without recursion."""
    stack = [value]
    while stack:
        current = stack.pop()
        if isinstance(current, dict):
            if current.get("type") in FILE_PART_TYPES:
                return True
            stack.extend(current.values())
        elif isinstance(current, BaseModel):
            # A typed body (another API's request, translated): its fields and kept extras.
            if getattr(current, "type", None) in FILE_PART_TYPES:
                return True
            stack.extend(current.__dict__.values())
            stack.extend((current.__pydantic_extra__ or {}).values())
        elif isinstance(current, list):
            stack.extend(current)
    return False


class DocumentTranslation:
    def __init__(self, workers: PdfWorkers, plain: concurrent.futures.ThreadPoolExecutor) -> None:
        self.workers = workers
        self._plain = plain
        self._documents = concurrent.futures.ThreadPoolExecutor(
            max_workers=workers.workers, thread_name_prefix="translate-pdf"
        )

    async def run(self, translate: Callable[[PdfRenderer], T], *, with_files: bool) -> T:
        """`translate(renderer)` on the right threads; `with_files`: the request holds files."""
        loop = asyncio.get_running_loop()
        if not with_files:
            try:
                return await loop.run_in_executor(self._plain, translate, _not_here)
            except _NeedsPdfWorkers:
                pass
        cancelled = threading.Event()

        def render(
            data: bytes, limits: DocumentLimits, *, max_pixels: int | None, max_pages: int | None
        ) -> list[PdfPage]:
            return self.workers.render(
                data, limits, max_pixels=max_pixels, max_pages=max_pages, cancelled=cancelled
            )

        try:
            return await loop.run_in_executor(self._documents, translate, render)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    def close(self) -> None:
        self._documents.shutdown(wait=False, cancel_futures=True)
        self.workers.close()
