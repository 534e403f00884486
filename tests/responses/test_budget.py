"""One request budget (`vlmserve.responses._budget`): images and PDF pages are counted once, as the
translation produces them, and refused in one place: every image counted before the first is
checked, earlier turns and references included; a file's image and a PDF's pages when read."""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any

import pytest

from tests._pdfs import text_pdf
from tests.responses.responses_testkit import (
    RED,
    function_call,
    function_output,
    image_part,
    input_image,
    input_text,
    message,
)
from vlmserve.common.documents import DocumentLimits
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import FileContent, InvalidRequestError, build_generate_request, input_to_messages
from vlmserve.responses._budget import RequestBudget

PDF = text_pdf(["Hello page one", "Second page"])
PDF_URL = "data:application/pdf;base64," + base64.b64encode(PDF).decode("ascii")
STORED = {"msg_three": message("user", [input_image(), input_image(), input_image()])}
FILES = {"file-red": FileContent(RED, "red.png")}


def file_source(file_id: str) -> FileContent | None:
    return FILES.get(file_id)


def images(count: int) -> list[dict[str, Any]]:
    return [input_image() for _ in range(count)]


def pdf() -> dict[str, Any]:
    return {"type": "input_file", "file_data": PDF_URL, "filename": "two.pdf"}


def ref(item_id: str) -> dict[str, str]:
    return {"type": "item_reference", "id": item_id}


def turn(image_count: int) -> pb.Message:
    """An earlier turn as the store replays it: contract messages."""
    return pb.Message(role=pb.ROLE_USER, parts=[image_part() for _ in range(image_count)])


@pytest.fixture
def checked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per image the translation checks (reads the header of)."""
    from vlmserve.common import images as common_images

    calls: list[int] = []
    original = common_images.inspect_image

    def counting(data: bytes, **kwargs: Any) -> Any:
        calls.append(len(data))
        return original(data, **kwargs)

    monkeypatch.setattr("vlmserve.responses._media.inspect_image", counting)
    return calls


# ---- the budget itself ----------------------------------------------------------------------------

Step = Callable[[RequestBudget], None]


def count(n: int) -> Step:
    return lambda budget: budget.count_images(n)


def charge(n: int) -> Step:
    return lambda budget: budget.charge_images(n)


def read(n: int) -> Step:
    return lambda budget: budget.charge_file_bytes(n, param="input[0].content[0].file_id")


def pages(n: int) -> Step:
    return lambda budget: budget.charge_pages(n, param="input[0].content[0]")


check: Step = RequestBudget.check_images

# bounds, steps, then (images, pages) counted or the refusal's code
BUDGET_CASES = [
    pytest.param({"max_images": 2}, [count(3)], (3, 0), id="counted-not-yet-checked"),
    pytest.param({"max_images": 2}, [count(2), check], (2, 0), id="checked-at-the-bound"),
    pytest.param({"max_images": 2}, [count(3), check], "too_many_images", id="checked-past-it"),
    pytest.param({}, [charge(1000)], (1000, 0), id="no-bound"),
    pytest.param({"max_images": 1}, [charge(2)], "too_many_images", id="a-produced-image-is-checked-at-once"),
    pytest.param({"max_images": 5}, [pages(2)], (2, 2), id="pages-are-pages-and-images"),
    pytest.param({"max_images": 3}, [count(2), pages(2)], "too_many_images", id="pages-past-the-images"),
    pytest.param({"max_pdf_pages": 3}, [pages(2), pages(2)], "file_too_large", id="pages-past-their-bound"),
    pytest.param({"max_pdf_pages": 4}, [pages(2), pages(2)], (4, 4), id="pages-at-their-bound"),
    pytest.param({"max_file_bytes": 10}, [read(5), read(5)], (0, 0), id="file-bytes-at-their-bound"),
    pytest.param({"max_file_bytes": 10}, [read(5), read(6)], "files_too_large", id="file-bytes-past-it"),
]


@pytest.mark.parametrize(("bounds", "steps", "expected"), BUDGET_CASES)
def test_the_budget(bounds: dict[str, Any], steps: list[Step], expected: tuple[int, int] | str) -> None:
    budget = RequestBudget(**bounds)
    if isinstance(expected, str):
        with pytest.raises(InvalidRequestError) as refused:
            for step in steps:
                step(budget)
        assert refused.value.code == expected
        return
    for step in steps:
        step(budget)
    assert (budget.images, budget.pages) == expected


def test_pages_left_for_the_renderer() -> None:
    budget = RequestBudget(max_pdf_pages=3)
    assert budget.pages_left() == 3
    budget.charge_pages(2, param="p")
    assert budget.pages_left() == 1
    assert RequestBudget(max_pdf_pages=1, pages=5).pages_left() == 0


# ---- charged by the translation -------------------------------------------------------------------


def user(*parts: dict[str, Any]) -> dict[str, Any]:
    return message("user", list(parts))


def too_many(total: int) -> tuple[str, str, int]:
    return ("too_many_images", "input", total)


FILE_IMAGE = {"type": "input_image", "file_id": "file-red"}
IMAGE_FILE = {"type": "input_file", "file_id": "file-red"}
TOOL_TURN = [function_call(), function_output(images(4))]
# fields (input, replay), history, max_images, max PDF pages per request, then the images the
# request holds, or the refusal (code, param, the total it states; None: a page refusal)
TRANSLATION_CASES = [
    pytest.param({"input": [user(*images(3))]}, [], 3, 64, 3, id="own-images-at-the-bound"),
    pytest.param(
        {"input": [user(*images(2)), user(*images(3))]}, [], 3, 64, too_many(5),
        id="own-images-past-it-the-full-total",
    ),
    pytest.param(
        {"input": [user(*images(2))]}, [turn(2)], 3, 64, too_many(4), id="earlier-turns"
    ),
    pytest.param(
        {"input": [user(*images(2))], "replay": [user(*images(2))]}, [], 3, 64, too_many(4),
        id="replayed-raw-items",
    ),
    pytest.param({"input": TOOL_TURN}, [], 3, 64, too_many(4), id="tool-outputs"),
    pytest.param(
        {"input": [ref("msg_three"), ref("msg_three")]}, [], 5, 64, too_many(6),
        id="every-use-of-a-reference",
    ),
    pytest.param({"input": [ref("msg_three"), user(*images(1))]}, [], 4, 64, 4, id="a-reference-at-bound"),
    pytest.param({"input": [user(FILE_IMAGE)]}, [], 1, 64, 1, id="an-image-by-file-id-counts-once"),
    pytest.param(
        {"input": [user(*images(1), IMAGE_FILE)]}, [], 1, 64, too_many(2), id="an-image-file"
    ),
    pytest.param({"input": [user(*images(2), pdf())]}, [], 4, 64, 4, id="pdf-pages-are-images"),
    pytest.param(
        {"input": [user(*images(2), pdf())]}, [], 3, 64, too_many(4),
        id="pdf-pages-past-the-images",
    ),
    pytest.param(
        {"input": [user(pdf(), pdf())]}, [], 16, 3, ("file_too_large", "input[0].content[1]", None),
        id="pdf-pages-past-their-own-bound",
    ),
]  # fmt: skip


def image_count(request: pb.GenerateRequest) -> int:
    parts = [part for m in request.messages for part in (*m.parts, *m.tool_output.parts.parts)]
    return sum(part.WhichOneof("kind") == "image" for part in parts)


@pytest.mark.parametrize(("fields", "history", "max_images", "max_pages", "expected"), TRANSLATION_CASES)
def test_the_translation_charges_the_budget(
    fields: dict[str, Any],
    history: list[pb.Message],
    max_images: int,
    max_pages: int,
    expected: int | tuple[str, str, int | None],
    checked: list[int],
) -> None:
    body = {"model": "m", "input": fields["input"]}

    def translate() -> pb.GenerateRequest:
        return build_generate_request(
            body,
            resolve_item=STORED.get,
            replay=fields.get("replay", ()),
            history=history,
            file_source=file_source,
            document_limits=DocumentLimits(max_pages_per_request=max_pages),
            max_images=max_images,
        ).request

    if isinstance(expected, int):
        # Twice, as the facade may translate a request (documents/pdf_translation.py): each run
        # has its own budget, so the second is charged no more than the first.
        assert [image_count(translate()) for _ in range(2)] == [expected, expected]
        return
    code, param, total = expected
    with pytest.raises(InvalidRequestError) as refused:
        translate()
    assert (refused.value.code, refused.value.param) == (code, param)
    if total is not None:
        assert f"at most {max_images} images per request" in refused.value.message
        assert f"this request has {total}," in refused.value.message
    if code == "too_many_images" and "input_file" not in str(body):
        # Every image part counted before a single image was checked (files count once read).
        assert checked == []


@pytest.mark.parametrize(("uses", "refused_at"), [(2, None), (3, "input[0].content[2].file_id")])
def test_every_read_of_a_file_counts(uses: int, refused_at: str | None) -> None:
    limits = DocumentLimits(max_file_bytes_per_request=2 * len(RED))
    parts = [{"type": "input_image", "file_id": "file-red"}] * uses

    def translate() -> list[pb.Message]:
        return input_to_messages([user(*parts)], file_source=file_source, document_limits=limits)

    if refused_at is None:
        assert len(translate()[0].parts) == uses
        return
    with pytest.raises(InvalidRequestError) as refused:
        translate()
    assert (refused.value.code, refused.value.param) == ("files_too_large", refused_at)


def test_conversation_items_have_the_same_budget(checked: list[int]) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        input_to_messages([user(input_text("x"), *images(3))], max_images=2)
    assert (refused.value.code, refused.value.param) == ("too_many_images", "input")
    assert checked == []
    assert len(input_to_messages([user(*images(2))], max_images=2)[0].parts) == 2


def test_without_a_bound_nothing_is_refused() -> None:
    assert len(input_to_messages([user(*images(40))])[0].parts) == 40
