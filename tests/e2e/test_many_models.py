"""Two models behind one facade (`--engine ID=ADDRESS`, `--model-alias`), real processes: the
trained squares model (eager) and a Qwen3-VL-Thinking family fixture (`--load lazy
--idle-unload-seconds`). Requests go where their `model` says, by id or alias; the squares model
still sees its images while the other model serves text at the same time; unknown ids are a 404
naming them; `/v1/models` (read by the openai SDK) lists both with what each engine says; a
response, and a conversation, continues on the other model (a conversation keeps the model that
answered last); one pool killed leaves the other serving."""

from __future__ import annotations

import concurrent.futures
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest

from tests._services import ServiceProcess, start_engine, start_facade
from tests.e2e import squares_requests as req
from training.families import FAMILIES, build_family
from training.squares import QUESTION, make_samples
from vlmserve.engine.model import DEFAULT_MODEL_PATH

pytestmark = pytest.mark.slow

SEED = 20_261_202
SAMPLES = 12
THINKER = "qwen3_vl_thinking"


@dataclass
class Stack:
    url: str
    squares: ServiceProcess
    thinker: ServiceProcess
    facade: ServiceProcess


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = tmp_path_factory.mktemp("many-models")
    thinker_dir = build_family(FAMILIES[THINKER], root / THINKER)
    squares = start_engine(root, model=str(DEFAULT_MODEL_PATH))
    thinker = start_engine(
        root, model=str(thinker_dir), extra=("--load", "lazy", "--idle-unload-seconds", "600")
    )
    try:
        facade = start_facade(
            root,
            squares.address,
            store_path=root / "facade.sqlite3",
            extra=(
                *("--engine", f"squares={squares.address}"),
                *("--engine", f"thinker={thinker.address}"),
                *("--model-alias", "counter=squares"),
                *("--model-alias", "small=thinker"),
            ),
        )
        try:
            yield Stack(facade.address, squares, thinker, facade)
        finally:
            facade.stop()
    finally:
        squares.stop()
        thinker.stop()


@pytest.fixture(scope="module")
def http(stack: Stack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, timeout=120) as client:
        yield client


def text_request(model: str, text: str = "Say something.", **extra: Any) -> dict[str, Any]:
    return {"model": model, "input": text, "max_output_tokens": 8, **extra}


def answered(http: httpx.Client, body: dict[str, Any]) -> dict[str, Any]:
    """A response that ran (the random-weight thinker stops at its token limit)."""
    response = http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    assert result["status"] in ("completed", "incomplete"), result
    return result


def test_models_listed_by_the_openai_sdk(stack: Stack) -> None:
    client = openai.OpenAI(base_url=f"{stack.url}/v1", api_key="x", max_retries=0)
    models = {model.id: model for model in client.models.list()}
    assert set(models) == {"squares", "thinker"}
    squares, thinker = models["squares"].model_dump(), models["thinker"].model_dump()
    assert squares["object"] == "model" and squares["owned_by"] == "vlmserve"
    assert squares["vlmserve"]["aliases"] == ["counter", "default"]
    assert thinker["vlmserve"]["aliases"] == ["small"]
    # What each engine says about its own model.
    assert squares["vlmserve"]["engine_model"] == "qwen2-vl-squares"
    assert squares["vlmserve"]["architecture"] == "qwen2_vl"
    assert thinker["vlmserve"]["architecture"] == "qwen3_vl"
    assert squares["vlmserve"]["thinking"] is False and thinker["vlmserve"]["thinking"] is True
    for model in (squares, thinker):
        assert model["vlmserve"]["context_length"] > 0
        assert "image" in model["vlmserve"]["input_modalities"]
        assert model["vlmserve"]["tool_call_format"]
    assert thinker["vlmserve"]["weights"] in ("unloaded", "loaded")
    # By alias: the model object of the id it names.
    assert client.models.retrieve("small").id == "thinker"
    assert client.models.retrieve("default").id == "squares"
    client.close()


def test_routed_by_id_and_alias(http: httpx.Client) -> None:
    for name, expected in [
        ("squares", "squares"),
        ("counter", "squares"),
        ("default", "squares"),
        ("thinker", "thinker"),
        ("small", "thinker"),
    ]:
        response = http.post("/v1/responses", json=text_request(name))
        assert response.status_code == 200, response.text
        assert response.json()["model"] == expected
    # Without `model` (chat completions require it; Responses take the default).
    chat = http.post(
        "/v1/chat/completions",
        json={"model": "small", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4},
    )
    assert chat.status_code == 200, chat.text
    assert chat.json()["model"] == "thinker"


def test_proof_of_sight_while_the_other_model_serves_text(http: httpx.Client) -> None:
    samples = make_samples(SEED, SAMPLES)
    with concurrent.futures.ThreadPoolExecutor(6) as pool:
        texts = [pool.submit(http.post, "/v1/responses", json=text_request("thinker")) for _ in range(4)]
        answers = req.run_all(
            lambda s: req.output_text(req.create(http, req.body(req.user_image_input(s), model="squares"))),
            samples,
        )
        for future in texts:
            response = future.result()
            assert response.status_code == 200 and response.json()["model"] == "thinker", response.text
    assert req.accuracy(answers, samples) >= 0.9, answers
    # Control: without the image the same question is answered right about 1 time in 36.
    blind = req.run_all(
        lambda s: req.output_text(
            req.create(http, req.body([{"role": "user", "content": QUESTION}], model="squares"))
        ),
        samples,
    )
    assert req.accuracy(blind, samples) <= 0.25, blind


@pytest.mark.parametrize(
    ("path", "body"),
    [
        ("/v1/responses", {"model": "nope", "input": "hi"}),
        ("/v1/chat/completions", {"model": "nope", "messages": [{"role": "user", "content": "hi"}]}),
    ],
)
def test_unknown_model_refused(http: httpx.Client, path: str, body: dict[str, Any]) -> None:
    response = http.post(path, json=body)
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert '"nope"' in error["message"] and "squares" in error["message"]
    assert http.get("/v1/models/nope").status_code == 404


def test_previous_response_on_another_model(http: httpx.Client) -> None:
    (sample,) = make_samples(SEED + 1, 1)
    first = req.create(http, req.body(req.user_image_input(sample), model="squares"))
    assert first["model"] == "squares"
    follow = answered(
        http, text_request("thinker", "And what do you think?", previous_response_id=first["id"])
    )
    alone = answered(http, text_request("thinker", "And what do you think?"))
    assert follow["model"] == "thinker"
    # The squares turn (its image too) was rendered into the thinker's prompt.
    assert follow["usage"]["input_tokens"] > alone["usage"]["input_tokens"] + 10
    # The stored responses remember which model made them; the chain goes back to squares.
    assert http.get(f"/v1/responses/{first['id']}").json()["model"] == "squares"
    back = answered(http, req.body(QUESTION, model="squares", previous_response_id=follow["id"]))
    fresh = answered(http, req.body(QUESTION, model="squares"))
    assert back["model"] == "squares"
    # The whole chain, the image's tokens included, rendered by the squares model's template.
    assert back["usage"]["input_tokens"] > fresh["usage"]["input_tokens"] + 16


def test_a_conversation_remembers_its_model(http: httpx.Client) -> None:
    (sample,) = make_samples(SEED + 2, 1)
    conversation = http.post("/v1/conversations", json={"model": "counter"}).json()
    # The alias resolved to the model's id.
    assert conversation["model"] == "squares"
    payload = req.body(req.user_image_input(sample), conversation=conversation["id"])
    del payload["model"]
    first = req.create(http, payload)
    # No `model`: the conversation's, and the squares model saw its image.
    assert first["model"] == "squares"
    assert req.output_text(first) == sample.answer
    follow = answered(
        http, text_request("thinker", "And what do you think?", conversation=conversation["id"])
    )
    alone = answered(http, text_request("thinker", "And what do you think?"))
    # The squares turn (its image too) was rendered into the thinker's prompt.
    assert follow["model"] == "thinker"
    assert follow["usage"]["input_tokens"] > alone["usage"]["input_tokens"] + 10
    assert http.get(f"/v1/conversations/{conversation['id']}").json()["model"] == "thinker"
    # The next turn without `model` stays on the model that answered last.
    again = {key: value for key, value in text_request("x", "More?").items() if key != "model"}
    assert answered(http, {**again, "conversation": conversation["id"]})["model"] == "thinker"


def test_one_pool_killed_the_other_serves(stack: Stack, http: httpx.Client) -> None:
    os.kill(stack.thinker.process.pid, signal.SIGKILL)
    stack.thinker.process.wait(timeout=10)
    response = http.post("/v1/responses", json=text_request("thinker"))
    assert response.status_code in (502, 503), response.text
    assert response.json()["error"]["code"].startswith("engine_")
    for _ in range(3):
        served = http.post("/v1/responses", json=text_request("squares"))
        assert served.status_code == 200, served.text
    # The listing still names the dead pool's model, without what only its engine knows.
    listed = {model["id"]: model for model in http.get("/v1/models").json()["data"]}
    assert listed["thinker"]["vlmserve"]["status"] == "unavailable"
    assert listed["squares"]["vlmserve"]["status"] == "available"
    ready = http.get("/readyz")
    assert ready.status_code == 200 and ready.json()["models"] == {
        "squares": "serving",
        "thinker": "unavailable",
    }
