"""Every malformed or unsupported input is an InvalidRequestError naming its JSON path."""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests.responses.responses_testkit import (
    RED,
    RED_URL,
    data_url,
    function_call,
    function_output,
    image_bytes,
    input_image,
    input_text,
    message,
)
from vlmserve.common.images import ImageLimits
from vlmserve.responses import ImageFetchError, InvalidRequestError, input_to_messages

RED_B64 = base64.b64encode(RED).decode("ascii")
NOT_AN_IMAGE_URL = data_url(b"hello, this is plain text and not an image", "image/png")


def user_image(url: str) -> list[dict[str, Any]]:
    return [message("user", [input_text("look"), input_image(url)])]


ERRORS: list[tuple[str, Any, str, str | None]] = [
    # (case, input, param, code)
    ("input is a number", 42, "input", "invalid_type"),
    ("input is an object", {"role": "user"}, "input", "invalid_type"),
    ("item is not an object", ["hello"], "input[0]", "invalid_type"),
    ("item without type or role", [{"content": "x"}], "input[0].type", "missing_required_parameter"),
    ("item type not a string", [{"type": 3}], "input[0].type", "invalid_type"),
    (
        "unknown item type",
        [message("user", "ok"), {"type": "local_shell_call"}],
        "input[1].type",
        "invalid_value",
    ),
    (
        "computer call without its call id",
        [message("user", "ok"), {"type": "computer_call"}],
        "input[1].call_id",
        "missing_required_parameter",
    ),
    ("unknown role", [message("tool", "x")], "input[0].role", "invalid_value"),
    (
        "content missing",
        [{"type": "message", "role": "user"}],
        "input[0].content",
        "missing_required_parameter",
    ),
    ("content a number", [message("user", 5)], "input[0].content", "invalid_type"),
    ("part not an object", [message("user", ["text"])], "input[0].content[0]", "invalid_type"),
    (
        "part without type",
        [message("user", [{"text": "x"}])],
        "input[0].content[0].type",
        "missing_required_parameter",
    ),
    (
        "unknown part type",
        [message("user", [input_text("a"), {"type": "foo"}])],
        "input[0].content[1].type",
        "invalid_value",
    ),
    (
        "text not a string",
        [message("user", [{"type": "input_text", "text": 1}])],
        "input[0].content[0].text",
        "invalid_type",
    ),
    (
        "input_audio without data",
        [message("user", [{"type": "input_audio", "input_audio": {}}])],
        "input[0].content[0].input_audio.data",
        "missing_required_parameter",
    ),
    (
        "video_url without url",
        [message("user", [{"type": "video_url", "video_url": {}}])],
        "input[0].content[0].video_url.url",
        "missing_required_parameter",
    ),
    (
        "input_file with bad base64",
        [message("user", [{"type": "input_file", "file_data": "x"}])],
        "input[0].content[0].file_data",
        "invalid_base64",
    ),
    (
        "image without url or file_id",
        [message("user", [{"type": "input_image"}])],
        "input[0].content[0].image_url",
        "missing_required_parameter",
    ),
    (
        "file_id-only image",
        [message("user", [{"type": "input_image", "file_id": "f"}])],
        "input[0].content[0].file_id",
        "unsupported_value",
    ),
    (
        "bad detail",
        [message("user", [input_image(RED_URL, "ultra")])],
        "input[0].content[0].detail",
        "invalid_value",
    ),
    (
        "image_url object without url",
        [message("user", [{"type": "image_url", "image_url": {}}])],
        "input[0].content[0].image_url.url",
        "missing_required_parameter",
    ),
    (
        "image_url a number",
        [message("user", [{"type": "image_url", "image_url": 1}])],
        "input[0].content[0].image_url",
        "invalid_type",
    ),
    (
        "bad base64",
        user_image("data:image/png;base64,@@@notbase64@@@"),
        "input[0].content[1].image_url",
        "invalid_base64",
    ),
    (
        "not base64-encoded data URL",
        user_image("data:image/png," + RED_B64),
        "input[0].content[1].image_url",
        "invalid_image_url",
    ),
    (
        "non-image bytes",
        user_image(NOT_AN_IMAGE_URL),
        "input[0].content[1].image_url",
        "unsupported_image_format",
    ),
    (
        "wrong data-URL media type",
        user_image(f"data:text/plain;base64,{RED_B64}"),
        "input[0].content[1].image_url",
        "invalid_image",
    ),
    (
        "declared jpeg, bytes png",
        user_image(f"data:image/jpeg;base64,{RED_B64}"),
        "input[0].content[1].image_url",
        "invalid_image",
    ),
    ("file:// URL", user_image("file:///etc/passwd"), "input[0].content[1].image_url", "invalid_image_url"),
    (
        "absolute path",
        user_image("/tmp/screenshot.png"),
        "input[0].content[1].image_url",
        "invalid_image_url",
    ),
    ("relative path", user_image("screenshot.png"), "input[0].content[1].image_url", "invalid_image_url"),
    ("empty URL", user_image(""), "input[0].content[1].image_url", "invalid_image_url"),
    (
        "remote https URL",
        user_image("https://example.com/a.png"),
        "input[0].content[1].image_url",
        "unsupported_value",
    ),
    (
        "remote http URL",
        user_image("http://127.0.0.1/a.png"),
        "input[0].content[1].image_url",
        "unsupported_value",
    ),
    (
        "bad image in tool output",
        [function_call(), function_output([input_image("file:///x.png")])],
        "input[1].output[0].image_url",
        "invalid_image_url",
    ),
    (
        "tool output not string or array",
        [function_call(), function_output(3)],
        "input[1].output",
        "invalid_type",
    ),
    (
        "tool output part not an object",
        [function_call(), function_output(["x"])],
        "input[1].output[0]",
        "invalid_type",
    ),
    (
        "tool output missing",
        [{"type": "function_call_output", "call_id": "c"}],
        "input[0].output",
        "missing_required_parameter",
    ),
    (
        "function_call without call_id",
        [{"type": "function_call", "name": "f", "arguments": "{}"}],
        "input[0].call_id",
        "missing_required_parameter",
    ),
    ("function_call arguments object", [function_call(arguments={})], "input[0].arguments", "invalid_type"),
    (
        "custom_tool_call without input",
        [{"type": "custom_tool_call", "call_id": "c", "name": "f"}],
        "input[0].input",
        "missing_required_parameter",
    ),
    (
        "unresolved item_reference",
        [message("user", "x"), {"type": "item_reference", "id": "msg_1"}],
        "input[1].id",
        "invalid_value",
    ),
    ("bare id reference unresolved", [{"id": "msg_1"}], "input[0].id", "invalid_value"),
    ("empty string input", "", "input", "invalid_value"),
    ("whitespace input", "  \n", "input", "invalid_value"),
    ("empty list input", [], "input", "invalid_value"),
    ("only empty text", [message("user", ""), message("user", [input_text("")])], "input", "invalid_value"),
    ("only reasoning", [{"type": "reasoning", "summary": []}], "input", "invalid_value"),
    # Media where nothing reads it (issue 26, item 14): never dropped with a 200.
    (
        "image_url in an unknown part field",
        [message("user", [{**input_text("look"), "attachment": {"image_url": RED_URL}}])],
        "input[0].content[0].attachment.image_url",
        "unknown_parameter",
    ),
    (
        "file_id in an unknown item field",
        [{**message("user", "look"), "files": [{"type": "input_file", "file_id": "file-1"}]}],
        "input[0].files[0].file_id",
        "unknown_parameter",
    ),
    (
        "input_image in an unknown field of a function_call_output",
        [function_call(), {**function_output("done"), "extra": [input_image()]}],
        "input[1].extra[0].image_url",
        "unknown_parameter",
    ),
    (
        "file_data in an unknown field of an input_image",
        [message("user", [{**input_image(), "file_data": RED_B64}])],
        "input[0].content[0].file_data",
        "unknown_parameter",
    ),
    (
        "input_image with image_url and file_id",
        [message("user", [{**input_image(), "file_id": "file-missing"}])],
        "input[0].content[0]",
        "invalid_value",
    ),
]


@pytest.mark.parametrize(("case", "given", "param", "code"), ERRORS, ids=[row[0] for row in ERRORS])
def test_invalid_input_names_its_path(case: str, given: Any, param: str, code: str | None) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(given)
    error = caught.value
    assert (error.param, error.code, error.status) == (param, code, 400)
    assert RED_B64[:40] not in error.message  # never echoes base64
    body = error.to_json()["error"]
    assert isinstance(body, dict)
    assert body["type"] == "invalid_request_error"
    assert body["param"] == param


def test_unknown_fields_without_media_are_still_accepted() -> None:
    """Liberal in: Codex's ids and statuses, and an output_text part's citations (which name a
    file_id without being media) replay as before."""
    cited = {
        "type": "output_text",
        "text": "see the file",
        "annotations": [{"type": "file_citation", "file_id": "file-1", "index": 0}],
    }
    messages = input_to_messages(
        [
            {**message("user", [input_text("look")]), "id": "msg_1", "status": "completed"},
            {**message("assistant", [cited]), "phase": "final"},
        ]
    )
    assert len(messages) == 2


def test_error_message_does_not_echo_the_payload() -> None:
    secret = "data:image/png;base64," + base64.b64encode(b"SECRET-PAYLOAD" * 20).decode()
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(user_image(secret))
    assert secret[22:60] not in caught.value.message
    assert "SECRET" not in caught.value.message


def test_pixel_bound_is_enforced_before_decoding() -> None:
    big = data_url(image_bytes(size=(64, 64)))
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(user_image(big), image_limits=ImageLimits(max_pixels=1000))
    assert caught.value.code == "image_too_large"
    assert caught.value.param == "input[0].content[1].image_url"


def test_byte_bound_is_enforced() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(user_image(RED_URL), image_limits=ImageLimits(max_bytes=16))
    assert caught.value.code == "image_too_large"


def test_remote_urls_go_through_the_pluggable_image_source() -> None:
    fetched: list[str] = []

    def source(url: str) -> bytes:
        fetched.append(url)
        return RED

    [user] = input_to_messages(user_image("https://example.com/red.png"), image_source=source)
    assert fetched == ["https://example.com/red.png"]
    assert user.parts[1].image.data == RED
    assert user.parts[1].image.media_type == "image/png"


def test_fetched_bytes_are_checked_like_inline_ones() -> None:
    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(user_image("https://example.com/x"), image_source=lambda url: b"<html>")
    assert caught.value.code == "unsupported_image_format"


def test_image_fetch_error_becomes_a_named_400() -> None:
    def refusing(url: str) -> bytes:
        raise ImageFetchError(f"Error while downloading {url}.")

    with pytest.raises(InvalidRequestError) as caught:
        input_to_messages(user_image("https://internal/x.png"), image_source=refusing)
    assert caught.value.param == "input[0].content[1].image_url"
    assert (caught.value.status, caught.value.code) == (400, "invalid_image_url")
    # The fetcher's reason is the whole message, as OpenAI words it.
    assert caught.value.message == "Error while downloading https://internal/x.png."


@pytest.mark.parametrize("url", ["file:///etc/passwd", "/etc/passwd", "ftp://example.com/a.png"])
def test_non_http_urls_never_reach_the_image_source(url: str) -> None:
    def fail(url: str) -> bytes:
        raise AssertionError("must not be called")

    with pytest.raises(InvalidRequestError):
        input_to_messages(user_image(url), image_source=fail)
