"""Continuous batching: a mixed batch produces, per request, exactly what the request produces
alone and what `mlx_vlm.stream_generate` produces (greedy), on the random fixture model.

The batch mixes text-only and image requests (one image; two images of different sizes),
different prompt lengths, a request that joins mid-decode and one cancelled mid-decode. Small
prefill chunks make prompts prefill over several steps, interleaved with the batch's decode.
Joins and cancels are triggered from a test-only logits processor at an exact token
(_logits_hooks.py), so the test is deterministic.

The random model's greedy output tends to repeat one token, which would hide a wrong position
or a mixed-up row; the same batch is therefore also run with seeded sampling at a high
temperature, where any difference in a row's logits changes its tokens.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._family_models import FAMILY_NAMES
from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.common.images import decode_image
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind, JobReport, PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.v1 import engine_pb2 as pb

from ._logits_hooks import with_hooks
from ._runs import run, run_each_alone
from .test_engine_grpc import image_part, png, text_part

pytestmark = pytest.mark.needs_model

MAX_TOKENS = 24


@pytest.fixture(scope="module")
def generator() -> Iterator[Generator]:
    config = EngineConfig(
        model=str(RANDOM_MODEL_PATH),
        max_active=8,
        max_queue=16,
        max_output_tokens=64,
        prefill_chunk_tokens=32,
        step_tokens=48,
        prefix_cache_min_tokens=0,  # every request computes its whole prompt
        warmup=False,
    )
    generator = Generator(config)
    generator.start()
    assert generator.ready.wait(60), generator.load_error
    yield generator
    generator.stop()


def prepared(
    generator: Generator, *parts: pb.Part, temperature: float, seed: int, max_tokens: int = MAX_TOKENS
) -> PreparedRequest:
    assert generator.preparer is not None
    request = pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=list(parts))],
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=temperature, seed=seed),
    )
    ready = generator.preparer.prepare(request, kind=JobKind.GENERATE)
    # The reference (mlx-vlm's own loop) takes decoded images; these are all small enough to
    # reach the processor at their own size.
    DECODED[ready.request_id] = [decode_image(p.image.data) for p in parts if p.HasField("image")]
    return ready


# request id -> the request's images decoded, for the mlx-vlm reference.
DECODED: dict[str, list[Any]] = {}


def mixed_requests(generator: Generator, temperature: float) -> dict[str, PreparedRequest]:
    long_text = " ".join(f"item {i} is on the list;" for i in range(30))
    return {
        "text_short": prepared(generator, text_part("Hi."), temperature=temperature, seed=1),
        "text_long": prepared(generator, text_part(long_text), temperature=temperature, seed=2),
        "one_image": prepared(
            generator,
            image_part(png((64, 64), seed=3)),
            text_part("What is this?"),
            temperature=temperature,
            seed=3,
        ),
        "two_images": prepared(
            generator,
            text_part("Compare"),
            image_part(png((56, 112), seed=4)),
            text_part("with"),
            image_part(png((96, 96), seed=5)),
            temperature=temperature,
            seed=4,
        ),
        "joins_late": prepared(
            generator, image_part(png((84, 56), seed=6)), text_part("Late."), temperature=temperature, seed=5
        ),
        "cancelled": prepared(generator, text_part("Cancel me " * 5), temperature=temperature, seed=6),
    }


class AtToken:
    """A logits processor that runs `action` once, when its request has generated `at` tokens."""

    def __init__(self, at: int, action: Callable[[], None]) -> None:
        self.at, self.action, self.fired = at, action, False
        self.calls = 0

    def __call__(self, tokens: Any, logits: Any) -> Any:
        self.calls += 1
        if not self.fired and self.calls == self.at + 1:  # called once per token, before it
            self.fired = True
            self.action()
        return logits


class Recorder:
    """A logits processor that keeps every logits row it sees."""

    def __init__(self) -> None:
        self.rows: list[np.ndarray] = []

    def __call__(self, tokens: Any, logits: Any) -> Any:
        self.rows.append(np.array(logits[0]))
        return logits


def recorded(requests: dict[str, PreparedRequest]) -> tuple[dict[str, PreparedRequest], dict[str, Recorder]]:
    recorders = {name: Recorder() for name in requests}
    return {name: with_hooks(req, recorders[name]) for name, req in requests.items()}, recorders


def run_mixed(
    generator: Generator, requests: dict[str, PreparedRequest]
) -> tuple[dict[str, JobReport], AtToken]:
    """All but `joins_late` start together; `joins_late` is submitted and `cancelled` cancelled
    from inside the batch, when `text_short` has generated 6 and 9 tokens."""
    late = Job(dataclasses.replace(requests["joins_late"], request_id="mixed-joins_late"), None)
    early = {name: req for name, req in requests.items() if name != "joins_late"}
    jobs = {
        name: Job(dataclasses.replace(req, request_id=f"mixed-{name}"), None) for name, req in early.items()
    }
    joined = AtToken(6, lambda: generator.submit(late))
    cancel = AtToken(9, jobs["cancelled"].cancel)
    jobs["text_short"] = Job(with_hooks(jobs["text_short"].request, joined, cancel), None)
    for job in jobs.values():
        generator.submit(job)
    threading.Event().wait(0.05)
    assert generator.wait_idle(300)
    reports = {report.request_id: report for report in generator.reports}
    jobs["joins_late"] = late
    return {name: reports[job.request_id] for name, job in jobs.items()}, joined


# The partition of requests that only keep the engine busy: no request in flight shares a prompt
# prefix with them (they start with the same chat template opening as every other request).
FILLER = "filler"


def submitted_in_one_step(
    generator: Generator, requests: dict[str, PreparedRequest], tag: str
) -> dict[str, JobReport]:
    """Submit every request from inside a running request, so the engine admits them together;
    returns their reports by name."""
    jobs = {
        name: Job(dataclasses.replace(req, request_id=f"{tag}-{name}"), None)
        for name, req in requests.items()
    }

    def submit_all() -> None:
        for job in jobs.values():
            generator.submit(job)

    starter = prepared(generator, text_part("Go."), temperature=0.0, seed=0, max_tokens=4)
    starter = with_hooks(starter, AtToken(1, submit_all), request_id=f"{tag}-starter", partition_key=FILLER)
    generator.submit(Job(starter, None))
    assert generator.wait_idle(300)
    reports = {report.request_id: report for report in generator.reports}
    return {name: reports[job.request_id] for name, job in jobs.items()}


def assert_equal_to_alone(
    reports: dict[str, JobReport],
    reference: dict[str, JobReport],
    logits: dict[str, Recorder],
    alone_logits: dict[str, Recorder],
    atol: float = 1e-4,
) -> None:
    """Each request's tokens equal its run alone, and the logits of every step are within `atol`."""
    for name, report in reports.items():
        assert report.token_ids == reference[name].token_ids, name
        np.testing.assert_allclose(
            np.stack(logits[name].rows), np.stack(alone_logits[name].rows), rtol=0, atol=atol, err_msg=name
        )


def alone(generator: Generator, requests: dict[str, PreparedRequest], tag: str) -> dict[str, JobReport]:
    return run_each_alone(generator, requests, f"{tag}-alone")


def check_mixed_equals_alone(
    generator: Generator, temperature: float, atol: float = 1e-4
) -> tuple[dict[str, JobReport], dict[str, Recorder]]:
    requests, alone_logits = recorded(mixed_requests(generator, temperature))
    reference = alone(generator, requests, f"t{temperature}")
    requests, mixed_logits = recorded(mixed_requests(generator, temperature))
    mixed, joined = run_mixed(generator, requests)
    # The logits themselves, not only the tokens: a wrong position or row would show here
    # even where it does not change the chosen token.
    for name, recorder in mixed_logits.items():
        rows = len(recorder.rows)
        assert rows == mixed[name].output_tokens, name
        np.testing.assert_allclose(
            np.stack(recorder.rows), np.stack(alone_logits[name].rows[:rows]), rtol=0, atol=atol, err_msg=name
        )
    assert joined.fired and joined.calls == MAX_TOKENS, "the logits processor ran once per token"
    for name, report in mixed.items():
        expected = reference[name].token_ids
        if name == "cancelled":
            assert report.finish_reason == pb.FINISH_REASON_CANCELLED
            assert report.tokens_after_cancel <= 1
            assert 1 <= report.output_tokens < MAX_TOKENS
            assert report.token_ids == expected[: report.output_tokens]
        else:
            assert report.finish_reason == pb.FINISH_REASON_LENGTH, name
            assert report.token_ids == expected, name
    return reference, alone_logits


def test_greedy_mixed_batch_equals_each_request_alone_and_mlx_vlm(generator: Generator) -> None:
    reference, alone_logits = check_mixed_equals_alone(generator, temperature=0.0)
    # ... and `mlx_vlm.stream_generate` on the same prompt, images and weights.
    from mlx_vlm import stream_generate

    loaded = generator.loaded
    assert loaded is not None
    requests = mixed_requests(generator, 0.0)
    expected: dict[str, list[int]] = {}
    logits = {name: Recorder() for name in requests}
    done = threading.Event()

    def on_generation_thread_free() -> None:
        # The model is shared with the idle engine; MLX runs this thread's own stream.
        for name, req in requests.items():
            *_, last = stream_generate(
                loaded.model,
                loaded.processor,
                req.prompt_text,
                image=DECODED[req.request_id] or None,
                max_tokens=MAX_TOKENS,
                temperature=0.0,
                logits_processors=[logits[name]],
            )
            expected[name] = list(last.token_ids)
        done.set()

    worker = threading.Thread(target=on_generation_thread_free)
    worker.start()
    worker.join(300)
    assert done.is_set()
    for name, report in reference.items():
        assert list(report.token_ids) == expected[name], name
        np.testing.assert_allclose(
            np.stack(logits[name].rows[:MAX_TOKENS]),
            np.stack(alone_logits[name].rows),
            rtol=0,
            atol=1e-4,
            err_msg=name,
        )


def test_sampled_mixed_batch_equals_each_request_alone(generator: Generator) -> None:
    reference, _ = check_mixed_equals_alone(generator, temperature=1.5)
    assert all(len(set(report.token_ids)) > MAX_TOKENS // 2 for report in reference.values())


@pytest.mark.parametrize("family", FAMILY_NAMES)
def test_every_family_batches_like_it_runs_alone(family: str, family_models: dict[str, Path]) -> None:
    """Other architectures: sliding-window caches (Gemma 3), chunked attention that mlx-vlm cannot
    batch (Llama 4, rows run one by one), Qwen 2.5/3-VL M-RoPE; seeded sampling, so any
    difference in a row's logits shows."""
    generator = Generator(
        EngineConfig(model=str(family_models[family]), warmup=False, prefill_chunk_tokens=16, step_tokens=24)
    )
    generator.start()
    try:
        assert generator.ready.wait(120) and generator.loaded is not None, generator.load_error
        parts = [[text_part("hello there " * 5)], [text_part("x")]]
        if family != "llava":  # mlx-vlm 0.7.10's LlavaProcessor cannot take images (see family notes)
            parts.append([image_part(png((64, 64), seed=1)), text_part("what?")])
        requests = {
            str(i): prepared(generator, *p, temperature=1.5, seed=i, max_tokens=12)
            for i, p in enumerate(parts)
        }
        reference = alone(generator, requests, family)
        together = run(generator, requests, f"{family}-together")
        for name, report in together.items():
            assert report.output_tokens == 12
            assert report.token_ids == reference[name].token_ids, name
    finally:
        generator.stop()


def test_a_short_request_is_not_stuck_behind_a_long_prefill(generator: Generator) -> None:
    """A long prompt prefills in chunks between decode steps; a short request that arrives
    meanwhile is prefilled first (shortest remaining prompt first) and has its first token long
    before the long prompt does, while the running request keeps decoding every step."""
    order: list[str] = []

    class First:
        def __init__(self, name: str) -> None:
            self.name = name

        def __call__(self, tokens: Any, logits: Any) -> Any:
            if self.name not in order:
                order.append(self.name)
            return logits

    def job(name: str, *parts: pb.Part, max_tokens: int) -> Job:
        req = prepared(generator, *parts, temperature=0.0, seed=0, max_tokens=max_tokens)
        return Job(with_hooks(req, First(name), request_id=f"hol-{name}"), None)

    long_text = " ".join(f"{i} bottles of water on the wall, take one down;" for i in range(40))
    long = job("long", text_part(long_text), max_tokens=2)
    short = job("short", text_part("Quick one?"), max_tokens=2)
    running_steps: list[int] = []

    def running(tokens: Any, logits: Any) -> Any:
        running_steps.append(len(order))
        if len(running_steps) == 2:
            generator.submit(long)
        if len(running_steps) == 4:
            generator.submit(short)
        return logits

    first = job("running", text_part("Keep going."), max_tokens=40)
    first = Job(with_hooks(first.request, running), None)
    generator.submit(first)
    assert generator.wait_idle(120)
    reports = {r.request_id: r for r in generator.reports}
    assert reports["hol-long"].prompt_tokens > 10 * generator.config.prefill_chunk_tokens
    assert order.index("short") < order.index("long"), order
    # The running request decoded a token every step while the long prompt was still prefilling
    # (after the short one had its first token): the prefill was spread over many steps.
    assert running_steps.count(1) >= 5, running_steps
    assert reports["hol-running"].output_tokens == 40


@pytest.fixture(scope="module")
def wide_generator() -> Iterator[Generator]:
    """Chunks long enough that most test prompts are one chunk: those that arrive together are
    prefilled in one shared, left-padded forward."""
    config = EngineConfig(
        model=str(RANDOM_MODEL_PATH),
        max_active=8,
        max_queue=16,
        max_output_tokens=64,
        prefill_chunk_tokens=128,
        step_tokens=256,
        prefix_cache_min_tokens=0,
        warmup=False,
    )
    generator = Generator(config)
    generator.start()
    assert generator.ready.wait(60), generator.load_error
    yield generator
    generator.stop()


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_prompts_prefilled_together_equal_each_alone(wide_generator: Generator, temperature: float) -> None:
    """Requests that arrive together (submitted at once from inside a running request, so the
    engine sees them in one step) share a prefill forward; each still equals its run alone."""
    requests, alone_logits = recorded(mixed_requests(wide_generator, temperature))
    reference = alone(wide_generator, requests, f"wide-{temperature}")
    requests, together_logits = recorded(mixed_requests(wide_generator, temperature))
    before = wide_generator.prefilled_together
    together = submitted_in_one_step(wide_generator, requests, f"wide-{temperature}")
    assert wide_generator.prefilled_together - before >= 4, "prompts that arrived together shared a prefill"
    assert_equal_to_alone(together, reference, together_logits, alone_logits)
