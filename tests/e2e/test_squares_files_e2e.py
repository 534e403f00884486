"""End to end (issue 14.2): PDFs reach the model through `input_file`, uploaded or inline, in a
user message and inside a tool output — the squares model behind the real engine and facade.

Documents: 3-page PDFs, page N drawing sample N's squares (lossless, so a page renders back to
the very image). The squares model reads one image per conversation, so each page is asked about
as a PDF of its own, split from the 3-page document (pages copied, not redrawn); the 3-page
document itself is sent whole to show that all its pages reach the engine (its prompt holds three
pages' image tokens). Honesty: the three pages of a document have different answers, and each
answer is checked against its own page and (the control) against the next page's, where it must
fail: the answer comes from the page that was sent.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests._pdfs import split_pages, squares_pdf
from tests.e2e import squares_requests as req
from training.squares import QUESTION, SquaresSample, make_samples

E2E_SEED = 20_261_201
DOCUMENTS = 10
PAGES = 3
MIN_ACCURACY = 0.95
MAX_CONTROL_ACCURACY = 0.10

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def samples() -> list[SquaresSample]:
    return make_samples(E2E_SEED, DOCUMENTS * PAGES)


@pytest.fixture(scope="module")
def documents(samples: list[SquaresSample]) -> list[bytes]:
    return [squares_pdf(samples[index : index + PAGES]) for index in range(0, len(samples), PAGES)]


@pytest.fixture(scope="module")
def page_pdfs(documents: list[bytes]) -> list[bytes]:
    """Page i of the samples' order: document i // 3, page i % 3, as a PDF of its own."""
    return [page for document in documents for page in split_pages(document)]


@pytest.fixture(scope="module")
def facade(squares_facade_url: str) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=squares_facade_url, timeout=120) as client:
        yield client


def upload(facade: httpx.Client, content: bytes, name: str) -> str:
    response = facade.post(
        "/v1/files", files={"file": (name, content, "application/pdf")}, data={"purpose": "user_data"}
    )
    assert response.status_code == 200, response.text
    return str(response.json()["id"])


def user_file(part: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}, part]}]


def ask_all(facade: httpx.Client, bodies: list[dict[str, Any]]) -> list[str]:
    return req.run_all(lambda body: req.output_text(req.create(facade, body)), bodies)


def check(answers: list[str], samples: list[SquaresSample]) -> None:
    assert req.accuracy(answers, samples) >= MIN_ACCURACY, answers
    # The control: the same answers against the next page of their document.
    shifted = [samples[(index // PAGES) * PAGES + (index + 1) % PAGES] for index in range(len(samples))]
    assert req.accuracy(answers, shifted) <= MAX_CONTROL_ACCURACY, answers


def test_each_page_through_an_uploaded_file(
    facade: httpx.Client, samples: list[SquaresSample], page_pdfs: list[bytes]
) -> None:
    ids = [upload(facade, pdf, f"page-{index}.pdf") for index, pdf in enumerate(page_pdfs)]
    answers = ask_all(facade, [req.body(user_file({"type": "input_file", "file_id": id_})) for id_ in ids])
    check(answers, samples)


def test_each_page_inline_as_file_data(
    facade: httpx.Client, samples: list[SquaresSample], page_pdfs: list[bytes]
) -> None:
    bodies = [
        req.body(
            user_file(
                {
                    "type": "input_file",
                    "filename": f"page-{index}.pdf",
                    "file_data": "data:application/pdf;base64," + base64.b64encode(pdf).decode("ascii"),
                }
            )
        )
        for index, pdf in enumerate(page_pdfs)
    ]
    check(ask_all(facade, bodies), samples)


def test_each_page_in_a_tool_output(
    facade: httpx.Client, samples: list[SquaresSample], page_pdfs: list[bytes]
) -> None:
    """The agent's screenshot tool answers with the file: it is lowered like any tool-output image."""
    ids = [upload(facade, pdf, f"screen-{index}.pdf") for index, pdf in enumerate(page_pdfs)]
    bodies = [
        req.body(req.agent_input([{"type": "input_file", "file_id": id_}]), tools=[req.SCREENSHOT_TOOL])
        for id_ in ids
    ]
    check(ask_all(facade, bodies), samples)


def test_the_openai_sdk_uploads_and_asks(
    squares_facade_url: str, samples: list[SquaresSample], page_pdfs: list[bytes]
) -> None:
    client = openai.OpenAI(base_url=f"{squares_facade_url}/v1", api_key="unused", max_retries=0, timeout=120)
    with client:

        def ask(index: int) -> str:
            uploaded = client.files.create(file=(f"p{index}.pdf", page_pdfs[index]), purpose="user_data")
            assert client.files.retrieve(uploaded.id).bytes == len(page_pdfs[index])
            response = client.responses.create(
                model="default",
                input=[
                    {
                        "role": "user",
                        "content": [
                            {"type": "input_text", "text": QUESTION},
                            {"type": "input_file", "file_id": uploaded.id},
                        ],
                    }
                ],
                max_output_tokens=req.MAX_OUTPUT_TOKENS,
            )
            assert client.files.delete(uploaded.id).deleted
            return response.output_text

        answers = req.run_all(ask, list(range(len(page_pdfs))))
    check(answers, samples)


def test_a_whole_three_page_pdf_reaches_the_engine(facade: httpx.Client, documents: list[bytes]) -> None:
    """Every page of the 3-page document is in the prompt: its input holds three pages' worth of
    image tokens (counted by the engine on the request a create would send)."""
    document = upload(facade, documents[0], "squares.pdf")
    first_page = upload(facade, split_pages(documents[0])[0], "squares.pdf")

    def count(part: dict[str, Any] | None) -> int:
        content: list[dict[str, Any]] = [{"type": "input_text", "text": QUESTION}]
        if part is not None:
            content.append(part)
        response = facade.post(
            "/v1/responses/input_tokens",
            json={"model": "default", "input": [{"role": "user", "content": content}]},
        )
        assert response.status_code == 200, response.text
        return int(response.json()["input_tokens"])

    without = count({"type": "input_text", "text": "[file squares.pdf, page 1 of 1]"})
    one_page = count({"type": "input_file", "file_id": first_page})
    three_pages = count({"type": "input_file", "file_id": document})
    page_cost = one_page - without
    assert page_cost > 10  # an image's tokens, not a few words
    # Two more pages: each its image and its short header line.
    added = three_pages - one_page
    assert 2 * page_cost < added <= 2 * (page_cost + 40), (without, one_page, three_pages)
