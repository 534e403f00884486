"""Files in requests: `input_file` parts and `input_image.file_id` -> contract parts.

A file comes by `file_id` (looked up through the media policy's pluggable `FileSource`: the
translation itself never touches a disk) or inline as `file_data` (a base64 data: URL, or bare
base64). Its kind is sniffed from the bytes (`vlmserve.common.documents`), never taken from the
file name or a declared type:

* a PDF becomes, per page, a text part naming the file and page with the page's extracted text,
  then the page rendered as an image (as OpenAI gives a model both);
* a text file becomes one text part, the file's name around its text;
* an image becomes an image part, checked like every other image;
* anything else is a 400 naming the part and the type.
"""

from __future__ import annotations

import base64
import binascii
import json
import re

from vlmserve.common.clips import sniff_clip
from vlmserve.common.documents import DocumentError, decode_text, render_pdf, sniff_file
from vlmserve.engine.v1 import engine_pb2 as pb

from ._errors import InvalidRequestError
from ._input_models import InputFilePartParam
from ._json import join
from ._media import FileContent, ImageFetchError, MediaPolicy, parse_detail

__all__ = ["decode_base64", "file_image", "input_file_parts", "page_header", "text_file_part"]

# Names are shown to the model and in errors: one line, bounded.
_MAX_NAME_CHARS = 255
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f]+")
_DATA_URL_HEAD = re.compile(r"data:[A-Za-z0-9!#$&^_.+/-]*((?:;[A-Za-z0-9=._+-]{1,64}){0,8}),")
_BASE64 = re.compile(rb"[A-Za-z0-9+/]*={0,2}")
DEFAULT_FILENAME = "file"


def input_file_parts(part: InputFilePartParam, path: str, media: MediaPolicy) -> list[pb.Part]:
    """The contract parts for one `input_file` part at `path`."""
    if part.file_url is not None:
        raise InvalidRequestError(
            f"Invalid value for '{join(path, 'file_url')}': file URLs are not fetched by this server; "
            "upload the file (POST /v1/files) and send its file_id, or send it inline in file_data.",
            param=join(path, "file_url"),
            code="unsupported_value",
        )
    if part.file_id is not None and part.file_data is not None:
        raise InvalidRequestError(
            f"Invalid value for '{path}': send either 'file_id' or 'file_data', not both.",
            param=path,
            code="invalid_value",
        )
    detail = parse_detail(part.detail, join(path, "detail"))
    if part.file_id is not None:
        found = lookup_file(part.file_id, join(path, "file_id"), media)
        data, filename = found.data, part.filename or found.filename
    elif part.file_data is not None:
        data = decode_file_data(part.file_data, join(path, "file_data"), media.documents.max_bytes)
        filename = part.filename or DEFAULT_FILENAME
    else:
        raise InvalidRequestError(
            f"Missing required parameter: '{join(path, 'file_id')}' or '{join(path, 'file_data')}'.",
            param=join(path, "file_id"),
            code="missing_required_parameter",
            quoted=(join(path, "file_data"),),
        )
    return file_content_parts(data, shown_name(filename), detail, path, media)


def file_image(file_id: str, detail: pb.ImageDetail.ValueType, path: str, media: MediaPolicy) -> pb.ImagePart:
    """`input_image` by `file_id` (at `path`): the file must be an image."""
    param = join(path, "file_id")
    found = lookup_file(file_id, param, media)
    kind, media_type = _sniff(found.data, param, shown_name(found.filename))
    if kind != "image":
        raise InvalidRequestError(
            f"Invalid value for '{param}': the file is not an image ({media_type}); send it as an "
            "input_file part.",
            param=param,
            code="invalid_value",
        )
    return media.image_part(found.data, detail, param=param)


def file_content_parts(
    data: bytes, filename: str, detail: pb.ImageDetail.ValueType, path: str, media: MediaPolicy
) -> list[pb.Part]:
    """A file's parts (at `path`); its image, or its PDF's pages, charged to the request's budget."""
    kind, _ = _sniff(data, path, filename)
    if kind == "image":
        media.budget.charge_images(1)
        return [pb.Part(image=media.image_part(data, detail, param=path))]
    if kind == "text":
        text = decode_text(data)
        assert text is not None  # sniffed as text
        return [text_file_part(filename, text)]
    render = media.pdf_renderer or render_pdf
    try:
        pages = render(
            data, media.documents, max_pixels=media.limits.max_pixels, max_pages=media.budget.pages_left()
        )
    except DocumentError as error:
        raise _file_error(error, path, filename) from None
    media.budget.charge_pages(len(pages), param=path)
    parts: list[pb.Part] = []
    for page in pages:
        header = page_header(filename, page.number, len(pages), page.text)
        parts.append(pb.Part(text=pb.TextPart(text=header)))
        parts.append(pb.Part(image=media.image_part(page.png, detail, param=path)))
    return parts


def page_header(filename: str, number: int, count: int, text: str) -> str:
    """The text beside a PDF page's image: which file and page, then the page's own text."""
    header = f"[file {filename}, page {number} of {count}]"
    return f"{header}\n{text}" if text else header


def text_file_part(filename: str, text: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=f"[file {filename}]\n{text}\n[end of file {filename}]"))


def shown_name(filename: str) -> str:
    """A file name as the model and errors see it: one line, at most 255 characters."""
    name = _UNPRINTABLE.sub(" ", filename).strip() or DEFAULT_FILENAME
    return name[:_MAX_NAME_CHARS]


def lookup_file(file_id: str, param: str, media: MediaPolicy) -> FileContent:
    if media.file_source is None:
        raise InvalidRequestError(
            f"Invalid value for '{param}': files by id need the server's files store "
            "(POST /v1/files); send the file inline in file_data.",
            param=param,
            code="unsupported_value",
        )
    try:
        found = media.file_source(file_id)
    except ImageFetchError as error:
        raise InvalidRequestError(error.reason, param=param, code=error.code) from None
    if found is None:
        raise InvalidRequestError(
            f"Invalid value for '{param}': no file found with id {json.dumps(file_id)[:200]}.",
            param=param,
            code="file_not_found",
        )
    media.budget.charge_file_bytes(len(found.data), param=param)
    return found


def decode_file_data(value: str, param: str, max_bytes: int) -> bytes:
    """`file_data`: a base64 data: URL (any declared type: the bytes are sniffed) or bare base64."""
    payload = value
    if value[:5].lower() == "data:":
        match = _DATA_URL_HEAD.match("data:" + value[5:])
        if match is None or "base64" not in match.group(1).lower().split(";"):
            raise InvalidRequestError(
                f"Invalid value for '{param}': expected a base64 data: URL "
                "(data:application/pdf;base64,...).",
                param=param,
                code="invalid_value",
            )
        payload = value[match.end() :]
    if len(payload) > (max_bytes + 2) // 3 * 4 + 4:
        raise InvalidRequestError(
            f"Invalid value for '{param}': the file is larger than {max_bytes} bytes.",
            param=param,
            code="file_too_large",
        )
    raw = re.sub(rb"\s+", b"", payload.encode("ascii", errors="replace"))
    data = decode_base64(raw, param)
    if len(data) > max_bytes:
        raise InvalidRequestError(
            f"Invalid value for '{param}': the file is larger than {max_bytes} bytes.",
            param=param,
            code="file_too_large",
        )
    return data


def _sniff(data: bytes, param: str, filename: str) -> tuple[str, str]:
    clip = sniff_clip(data)
    if clip is not None:
        # A clip is not a document: it has parts of its own, which carry its sampling.
        kind, media_type = clip
        shapes = "input_video or video_url" if kind == "video" else "input_audio"
        raise InvalidRequestError(
            f"Invalid file at '{param}' ({json.dumps(filename)}): the file is {media_type}; {kind} "
            f"reaches the model as a {kind} part ({shapes}, with this file's id), on /v1/responses and "
            "/v1/chat/completions.",
            param=param,
            code="unsupported_file",
        )
    try:
        return sniff_file(data)
    except DocumentError as error:
        raise _file_error(error, param, filename) from None


def _file_error(error: DocumentError, param: str, filename: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid file at '{param}' ({json.dumps(filename)}): {error.reason}.", param=param, code=error.code
    )


def decode_base64(raw: bytes, param: str) -> bytes:
    """`raw` (base64 without line breaks, padding optional) decoded; a 400 naming `param` if it
    is not base64. Inline files and clips both decode through here."""
    if _BASE64.fullmatch(raw) is None or len(raw) % 4 == 1:
        raise InvalidRequestError(
            f"Invalid value for '{param}': invalid base64.", param=param, code="invalid_base64"
        )
    try:
        return base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequestError(
            f"Invalid value for '{param}': invalid base64.", param=param, code="invalid_base64"
        ) from None
