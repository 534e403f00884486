"""End to end: a clip reaches the model on every path (models/squares-video, models/beeps-audio).

The trained media fixtures behind the real engine and facade processes, asked through the
official `openai` SDK: a chat user part, a chat tool message, a Responses input part, a
`function_call_output`, and a replay through `previous_response_id`. An ordered colour pair
has a 1/30 chance without the motion and a beep answer 1/10 without the sound, so accuracy
near 100% proves delivery; fresh clips from a seed the training never used.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import openai
import pytest

from tests._services import REPO, ServiceProcess, start_engine, start_facade
from tests.e2e import media_requests as req
from tests.e2e.squares_requests import run_all
from training import ask_beeps, ask_video, beeps, squares_video

E2E_SEED = 20_261_206
CLIPS_PER_PATH = 20
MIN_ACCURACY = 0.95
MODELS = {"video": REPO / "models" / "squares-video", "audio": REPO / "models" / "beeps-audio"}
# Each kind's `make demo` script, the file it saves, and a check of that file's container.
DEMOS: dict[str, tuple[ModuleType, str, Callable[[bytes], bool]]] = {
    "video": (ask_video, "squares.mp4", lambda data: data[4:8] == b"ftyp"),
    "audio": (ask_beeps, "beeps.wav", lambda data: data[:4] == b"RIFF" and data[8:12] == b"WAVE"),
}
# The engine and facade serving each kind, for the last test to read their logs.
SERVICES: dict[str, tuple[ServiceProcess, ServiceProcess]] = {}

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


def _clips(kind: req.Kind, seed: int = E2E_SEED) -> list[Any]:
    if kind == "video":
        return squares_video.make_clips(seed, CLIPS_PER_PATH)
    return beeps.make_clips(seed, CLIPS_PER_PATH)


@pytest.fixture(scope="module", params=["video", "audio"])
def served(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[req.Kind, openai.OpenAI]]:
    """(kind, an openai client of a facade in front of an engine serving that kind's fixture)."""
    kind: req.Kind = request.param
    if not (MODELS[kind] / "model.safetensors").exists():
        pytest.skip(f"{MODELS[kind].relative_to(REPO)}: not trained yet")
    logs: Path = tmp_path_factory.mktemp(f"media-{kind}")
    engine: ServiceProcess = start_engine(logs, model=str(MODELS[kind]))
    try:
        facade = start_facade(logs, engine.address, store_path=logs / "responses.sqlite3")
        SERVICES[kind] = (engine, facade)
        try:
            client = openai.OpenAI(base_url=f"{facade.address}/v1", api_key="x", max_retries=0, timeout=120)
            yield kind, client
            client.close()
        finally:
            facade.stop()
    finally:
        engine.stop()


def _chat(client: openai.OpenAI, messages: list[dict[str, Any]], **extra: Any) -> str:
    # The SDK's typed params have no video/audio-in-tool shapes: plain dicts go through as sent.
    sent: Any = messages
    completion = client.chat.completions.create(
        model="default", messages=sent, max_tokens=req.MAX_TOKENS, temperature=0, **extra
    )
    return (completion.choices[0].message.content or "").strip()


def _respond(client: openai.OpenAI, items: list[dict[str, Any]], **extra: Any) -> Any:
    sent: Any = items
    return client.responses.create(
        model="default", input=sent, max_output_tokens=req.MAX_TOKENS, temperature=0, **extra
    )


def _assert_accurate(answers: list[str], clips: list[Any]) -> None:
    right = sum(answer == clip.answer for answer, clip in zip(answers, clips, strict=True))
    assert right / len(clips) >= MIN_ACCURACY, list(zip(answers, [c.answer for c in clips], strict=True))


def _run(clips: list[Any], ask: Callable[[Any], str]) -> None:
    _assert_accurate(run_all(ask, clips), clips)


def test_chat_user_part(served: tuple[req.Kind, openai.OpenAI]) -> None:
    kind, client = served
    _run(_clips(kind), lambda clip: _chat(client, req.chat_user_messages(kind, req.chat_clip_part(clip))))


def test_chat_tool_message(served: tuple[req.Kind, openai.OpenAI]) -> None:
    kind, client = served
    tools = [req.chat_tool(kind)]
    _run(
        _clips(kind, E2E_SEED + 1),
        lambda clip: _chat(client, req.chat_tool_messages(kind, req.chat_clip_part(clip)), tools=tools),
    )


def test_responses_input_part(served: tuple[req.Kind, openai.OpenAI]) -> None:
    kind, client = served
    _run(
        _clips(kind, E2E_SEED + 2),
        lambda clip: _respond(client, req.responses_user_input(kind, clip)).output_text.strip(),
    )


def test_function_call_output(served: tuple[req.Kind, openai.OpenAI]) -> None:
    kind, client = served
    tools = [req.responses_tool(kind)]
    _run(
        _clips(kind, E2E_SEED + 3),
        lambda clip: _respond(
            client, req.function_call_output_input(kind, clip), tools=tools
        ).output_text.strip(),
    )


def test_replay_through_previous_response_id(served: tuple[req.Kind, openai.OpenAI]) -> None:
    """A stored exchange about one clip is replayed; the new clip is the one answered."""
    kind, client = served
    earlier = _clips(kind, E2E_SEED + 4)

    def ask(pair: tuple[Any, Any]) -> str:
        first, second = pair
        stored = _respond(client, req.responses_user_input(kind, first), store=True)
        assert stored.output_text.strip() == first.answer
        follow_up = _respond(client, req.responses_user_input(kind, second), previous_response_id=stored.id)
        return str(follow_up.output_text).strip()

    clips = _clips(kind, E2E_SEED + 5)
    _assert_accurate(run_all(ask, list(zip(earlier, clips, strict=True))), clips)


def test_chat_video_as_frame_images(served: tuple[req.Kind, openai.OpenAI]) -> None:
    """vLLM's `video: [frame URLs]`: frames already sampled, losslessly."""
    kind, client = served
    if kind != "video":
        pytest.skip("a video shape")
    _run(
        _clips(kind, E2E_SEED + 6),
        lambda clip: _chat(client, req.chat_user_messages(kind, req.chat_frames_part(clip))),
    )


def test_controls(served: tuple[req.Kind, openai.OpenAI]) -> None:
    """Video: the reversed clip swaps the answer. Audio: noise only is `no beeps`, the question
    without audio `no audio`."""
    kind, client = served
    if kind == "video":
        reversed_clips = [clip.reversed() for clip in _clips(kind, E2E_SEED + 7)]
        _run(
            reversed_clips, lambda clip: _chat(client, req.chat_user_messages(kind, req.chat_clip_part(clip)))
        )
        return
    silent = beeps.make_silent_clips(E2E_SEED + 8, 6)
    answers = run_all(
        lambda clip: _chat(client, req.chat_user_messages(kind, req.chat_clip_part(clip))), silent
    )
    assert answers == [beeps.NO_BEEPS_ANSWER] * len(silent)
    no_audio = [{"role": "user", "content": [{"type": "text", "text": beeps.AUDIO_QUESTION}]}]
    assert _chat(client, no_audio) == beeps.NO_AUDIO_ANSWER


def test_the_demo_answers_a_clip(
    served: tuple[req.Kind, openai.OpenAI], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`make demo DEMO=video` / `DEMO=beeps` (training/ask_video.py, ask_beeps.py: the standard
    library's HTTP, a Responses `input_video` / `input_audio` part) against the served fixture:
    the clips each demo draws and sends, answered as the other paths are."""
    kind, client = served
    demo, saved, container = DEMOS[kind]
    url = str(client.base_url).rstrip("/").removesuffix("/v1")
    samples = [demo.draw(E2E_SEED + 9 + index) for index in range(CLIPS_PER_PATH)]
    answers = [demo.ask(url, sample.data) for sample in samples]
    expected = [sample.expected for sample in samples]
    right = sum(answer == wanted for answer, wanted in zip(answers, expected, strict=True))
    assert right / len(samples) >= MIN_ACCURACY, list(zip(answers, expected, strict=True))
    demo.main(["--url", url, "--seed", "7", "--save", str(tmp_path / saved)])
    printed = dict(line.split(":", 1) for line in capsys.readouterr().out.splitlines())
    assert container((tmp_path / saved).read_bytes())
    assert printed["model"].strip() == printed["expected"].strip()


def test_healthy_clip_traffic_logs_no_error(served: tuple[req.Kind, openai.OpenAI]) -> None:
    """Every request above succeeded (clips decoded in the engine's worker processes included):
    neither process logged an ERROR line for them. Last in the module: it reads what the others
    left in the logs."""
    kind, _ = served
    for service in SERVICES[kind]:
        errors = service.error_lines()
        assert errors == [], errors
