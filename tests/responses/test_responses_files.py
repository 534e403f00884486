"""Files in requests (issue 14.2): `input_file` by `file_data` or `file_id`, `input_image.file_id`,
in messages and in tool outputs, through the one translation; every refusal names its part."""

from __future__ import annotations

import base64
import io
from typing import Any

import pytest
from PIL import Image

from tests._pdfs import images_pdf, text_pdf
from tests.responses.responses_testkit import (
    GREEN,
    RED,
    function_call,
    function_output,
    input_text,
    message,
)
from vlmserve.common.documents import DocumentLimits
from vlmserve.common.images import ImageLimits
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import FileContent, InvalidRequestError, build_generate_request, input_to_messages

PDF = text_pdf(["Hello page one", "Second page"])
SQUARES = images_pdf([Image.new("RGB", (8, 8), colour) for colour in ("red", "blue")])
CSV = b"name,count\nred,3\n"
FILES = {
    "file-pdf": FileContent(PDF, "report.pdf"),
    "file-red": FileContent(RED, "red.png"),
    "file-csv": FileContent(CSV, "counts.csv"),
    "file-zip": FileContent(b"PK\x03\x04" + bytes(40), "archive.docx"),
}


def source(file_id: str) -> FileContent | None:
    return FILES.get(file_id)


def data(content: bytes, media_type: str = "application/octet-stream") -> str:
    return f"data:{media_type};base64," + base64.b64encode(content).decode("ascii")


def file_part(**fields: Any) -> dict[str, Any]:
    return {"type": "input_file", **fields}


def user_parts(*parts: dict[str, Any], **kwargs: Any) -> list[pb.Part]:
    messages = input_to_messages([message("user", list(parts))], file_source=source, **kwargs)
    return list(messages[0].parts)


def kinds(parts: list[pb.Part]) -> list[str]:
    return [str(part.WhichOneof("kind")) for part in parts]


def test_a_pdf_is_each_page_text_then_image() -> None:
    parts = user_parts(input_text("read"), file_part(file_data=data(PDF), filename="report.pdf"))
    assert kinds(parts) == ["text", "text", "image", "text", "image"]
    assert parts[1].text.text == "[file report.pdf, page 1 of 2]\nHello page one"
    assert parts[3].text.text == "[file report.pdf, page 2 of 2]\nSecond page"
    page = Image.open(io.BytesIO(parts[2].image.data))
    assert (parts[2].image.media_type, page.size) == ("image/png", (600, 400))  # 300x200 pt at 144 dpi


def test_pdf_pages_are_rendered_faithfully_and_in_order() -> None:
    parts = user_parts(file_part(file_data=data(SQUARES), filename="colours.pdf"))
    pages = [
        Image.open(io.BytesIO(part.image.data)).convert("RGB") for part in parts if part.HasField("image")
    ]
    assert [page.getpixel((4, 4)) for page in pages] == [(255, 0, 0), (0, 0, 255)]
    assert parts[0].text.text == "[file colours.pdf, page 1 of 2]"  # no text on the page: the header


def test_the_same_pdf_by_file_id_uses_its_stored_name() -> None:
    parts = user_parts(file_part(file_id="file-pdf"))
    assert parts[0].text.text.startswith("[file report.pdf, page 1 of 2]")
    renamed = user_parts(file_part(file_id="file-pdf", filename="q3.pdf"))
    assert renamed[0].text.text.startswith("[file q3.pdf, page 1 of 2]")


@pytest.mark.parametrize(
    "part",
    [file_part(file_data=data(CSV, "text/csv"), filename="counts.csv"), file_part(file_id="file-csv")],
    ids=["file_data", "file_id"],
)
def test_a_text_file_is_inlined_with_its_name(part: dict[str, Any]) -> None:
    (text,) = user_parts(part)
    assert text.text.text == "[file counts.csv]\nname,count\nred,3\n\n[end of file counts.csv]"


def test_bare_base64_file_data_is_accepted_and_sniffed() -> None:
    (text,) = user_parts(file_part(file_data=base64.b64encode(b"# notes\n").decode(), filename="a.md"))
    assert "# notes" in text.text.text


def test_an_image_file_is_an_image_with_its_detail() -> None:
    (image,) = user_parts(file_part(file_id="file-red", detail="high"))
    assert (image.image.data, image.image.detail) == (RED, pb.IMAGE_DETAIL_HIGH)
    (by_id,) = user_parts({"type": "input_image", "file_id": "file-red", "detail": "low"})
    assert (by_id.image.data, by_id.image.detail) == (RED, pb.IMAGE_DETAIL_LOW)


def test_a_file_in_a_tool_output_is_lowered_like_any_image() -> None:
    items = [
        message("user", "what does the report say?"),
        function_call(),
        function_output([input_text("opened"), file_part(file_id="file-pdf")]),
    ]
    raw = input_to_messages(items, file_source=source)
    output = raw[-1].tool_output.parts.parts
    assert kinds(list(output)) == ["text", "text", "image", "text", "image"]
    lowered = lower_messages(raw)
    tool_turn, follow_up = lowered[-2], lowered[-1]
    assert tool_turn.role == pb.ROLE_TOOL and follow_up.role == pb.ROLE_USER
    assert [part.WhichOneof("kind") for part in follow_up.parts].count("image") == 2


def test_the_declared_media_type_is_never_trusted() -> None:
    # PNG bytes labelled as a PDF are an image; a "text/plain" zip is refused as a zip.
    (image,) = user_parts(file_part(file_data=data(GREEN, "application/pdf"), filename="x.pdf"))
    assert image.image.media_type == "image/png"
    with pytest.raises(InvalidRequestError) as caught:
        user_parts(file_part(file_data=data(FILES["file-zip"].data, "text/plain"), filename="a.txt"))
    assert "application/zip" in caught.value.message


BAD = [
    pytest.param(
        [message("user", [input_text("x"), file_part(file_id="file-zip")])],
        "input[0].content[1]",
        "unsupported_file",
        "archive.docx",
        id="unsupported-type",
    ),
    pytest.param(
        [function_call(), function_output([file_part(file_id="file-nope")])],
        "input[1].output[0].file_id",
        "file_not_found",
        "file-nope",
        id="unknown-id-in-tool-output",
    ),
    pytest.param(
        [message("user", [{"type": "input_image", "file_id": "file-pdf"}])],
        "input[0].content[0].file_id",
        "invalid_value",
        "not an image",
        id="input-image-of-a-pdf",
    ),
    pytest.param(
        [message("user", [file_part(file_url="https://example.com/a.pdf")])],
        "input[0].content[0].file_url",
        "unsupported_value",
        "file_id",
        id="file-url",
    ),
    pytest.param(
        [message("user", [file_part(file_id="file-pdf", file_data=data(PDF))])],
        "input[0].content[0]",
        "invalid_value",
        "not both",
        id="both-sources",
    ),
    pytest.param(
        [message("user", [file_part(filename="a.pdf")])],
        "input[0].content[0].file_id",
        "missing_required_parameter",
        "file_data",
        id="no-source",
    ),
    pytest.param(
        [message("user", [file_part(file_data="data:application/pdf,%25PDF")])],
        "input[0].content[0].file_data",
        "invalid_value",
        "base64",
        id="data-url-not-base64",
    ),
    pytest.param(
        [message("user", [file_part(file_data=data(b"%PDF-1.4 not really"))])],
        "input[0].content[0]",
        "invalid_file",
        "could not be read",
        id="broken-pdf",
    ),
    pytest.param(
        [message("user", [file_part(file_data=data(b""))])],
        "input[0].content[0]",
        "invalid_file",
        "empty",
        id="empty-file",
    ),
    pytest.param(
        [message("user", [file_part(file_id="file-pdf", detail="ultra")])],
        "input[0].content[0].detail",
        "invalid_value",
        "detail",
        id="bad-detail",
    ),
]


@pytest.mark.parametrize(("items", "param", "code", "words"), BAD)
def test_refusals_name_the_part(items: list[dict[str, Any]], param: str, code: str, words: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(items, file_source=source)
    assert (caught.value.param, caught.value.code) == (param, code)
    assert words in caught.value.message


@pytest.mark.parametrize(
    ("limits", "image_limits", "code"),
    [
        (DocumentLimits(max_pages=1), ImageLimits(), "file_too_large"),
        (DocumentLimits(max_pages_per_request=3), ImageLimits(), "file_too_large"),
        (DocumentLimits(max_bytes=10), ImageLimits(), "file_too_large"),
    ],
    ids=["pages-per-pdf", "pages-per-request", "bytes"],
)
def test_limits(limits: DocumentLimits, image_limits: ImageLimits, code: str) -> None:
    # Two 2-page PDFs: the second passes the request's page budget of 3.
    items = [message("user", [file_part(file_data=data(PDF)), file_part(file_data=data(PDF))])]
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(items, file_source=source, document_limits=limits, image_limits=image_limits)
    assert caught.value.code == code
    assert caught.value.param is not None and caught.value.param.startswith("input[0].content[")


def test_rendered_pages_obey_the_image_pixel_limit() -> None:
    parts = user_parts(file_part(file_data=data(PDF)), image_limits=ImageLimits(max_pixels=60_000))
    page = Image.open(io.BytesIO(parts[1].image.data))
    assert page.width * page.height <= 60_000 and page.width > 200  # scaled down, not refused


def test_build_generate_request_takes_the_file_source() -> None:
    body = {"model": "m", "input": [message("user", [input_text("hi"), file_part(file_id="file-red")])]}
    translated = build_generate_request(body, file_source=source)
    assert translated.request.messages[0].parts[1].image.data == RED
    # What is stored is the item as sent: the file is named, not copied.
    assert translated.input_items[0]["content"][1] == {"type": "input_file", "file_id": "file-red"}
