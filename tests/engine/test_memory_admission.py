"""Admission by memory on the real engine (fixture model, KV 1,536 bytes a token): a request that
can never fit the budget is refused before any work with RESOURCE_EXHAUSTED naming what to
change; requests that fit alone but not together run one after the other instead of together,
and all of them finish."""

from __future__ import annotations

import dataclasses

import grpc
import pytest
from prometheus_client import generate_latest

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb

from .test_batching import prepared
from .test_engine_grpc import image_part, text_part
from .test_request_prep import big_png

# Every test here runs a real engine on a fixture model.
pytestmark = pytest.mark.needs_model

PROMPT = " ".join(f"item {i} is on shelf {i % 7};" for i in range(40))


def started(budget_mib: int) -> Generator:
    generator = Generator(
        EngineConfig(
            model=str(RANDOM_MODEL_PATH),
            warmup=False,
            memory_budget_mib=budget_mib,
            prefix_cache_min_tokens=0,
            max_active=8,
            max_output_tokens=512,
        )
    )
    generator.start()
    assert generator.ready.wait(60), generator.load_error
    return generator


def batch_sizes(generator: Generator) -> tuple[float, float]:
    """(decode steps with at most one row, all decode steps)."""
    text = generate_latest(generator.metrics.registry).decode()

    def sample(name: str) -> float:
        return float(next(line.split()[-1] for line in text.splitlines() if line.startswith(name)))

    return sample('vlmserve_engine_decode_batch_size_bucket{le="1.0"}'), sample(
        "vlmserve_engine_decode_batch_size_count"
    )


def refused_for_the_tower_then_text_runs(
    generator: Generator, request: PreparedRequest, question: str
) -> None:
    """`request` refused for its vision-tower activations (naming the messages); then `question`
    alone is admitted and finishes, and nothing is left held."""
    with pytest.raises(RequestError) as raised:
        generator.submit(Job(request, None))
    assert raised.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
    assert raised.value.field == "messages"
    assert "vision-tower activations" in str(raised.value)
    text_only = prepared(generator, text_part(question), temperature=0.0, seed=1)
    generator.submit(Job(text_only, None))
    assert generator.wait_idle(60)
    assert generator.admission.memory_in_use == 0


def test_a_request_that_can_never_fit_is_refused_before_any_work() -> None:
    generator = started(budget_mib=1)
    try:
        request = prepared(generator, text_part(PROMPT), temperature=0.0, seed=1, max_tokens=500)
        with pytest.raises(RequestError) as raised:
            generator.submit(Job(request, None))
        assert raised.value.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        assert raised.value.field == "sampling.max_tokens"
        assert "memory budget of 1.0 MiB" in str(raised.value)
        assert generator.admission.in_flight == 0
        # The same prompt with fewer output tokens fits and runs.
        small = dataclasses.replace(request, settings=dataclasses.replace(request.settings, max_tokens=8))
        generator.submit(Job(small, None))
        assert generator.wait_idle(60)
        assert generator.reports[-1].finish_reason == pb.FINISH_REASON_LENGTH
        assert (
            "vlmserve_engine_memory_refused_requests_total 1.0"
            in generate_latest(generator.metrics.registry).decode()
        )
    finally:
        generator.stop()


@pytest.mark.parametrize(
    ("budget_mib", "together"), [(2, False), (64, True)], ids=["one at a time", "together"]
)
def test_requests_that_fit_only_one_at_a_time_wait_for_each_other(budget_mib: int, together: bool) -> None:
    generator = started(budget_mib=budget_mib)
    try:
        # (540 prompt + 200 output) tokens x 1,536 bytes: 1.08 MiB each; 2 MiB holds one.
        jobs = [
            Job(
                dataclasses.replace(
                    prepared(
                        generator,
                        text_part(f"{PROMPT} question {i}?"),
                        temperature=0.0,
                        seed=i,
                        max_tokens=200,
                    ),
                    request_id=f"mem-{budget_mib}-{i}",
                ),
                None,
            )
            for i in range(3)
        ]
        for job in jobs:
            generator.submit(job)
        assert generator.wait_idle(300)
        reports = {report.request_id: report for report in generator.reports}
        assert all(reports[job.request_id].output_tokens == 200 for job in jobs)
        single, steps = batch_sizes(generator)
        if together:
            assert single < steps, "with room for all, they decode in one batch"
        else:
            assert single == steps, "never two rows at once"
        assert generator.admission.memory_in_use == 0
    finally:
        generator.stop()


def test_one_tenants_backlog_does_not_hold_another_tenants_request_behind_it() -> None:
    """Issue 39.5: with --memory-budget-mib 8, one key's six 4,096-token requests made another
    key's 2-token request wait 21.3 s (0.1 s alone). Here: tenant a's four requests fit one at a
    time (1.08 MiB each in 2 MiB); tenant b's small one, sent after them, joins beside a's first
    (it is done before a0) instead of waiting for three of them (it finished after a2 before)."""
    generator = started(budget_mib=2)
    try:

        def request(partition: str, index: int, prompt: str, max_tokens: int) -> Job:
            ready = prepared(generator, text_part(prompt), temperature=0.0, seed=index, max_tokens=max_tokens)
            return Job(
                dataclasses.replace(ready, request_id=f"{partition}{index}", partition_key=partition), None
            )

        backlog = [request("a", i, f"{PROMPT} question {i}?", 200) for i in range(4)]
        small = request("b", 0, "Hi?", 4)
        for job in [*backlog, small]:
            generator.submit(job)
        assert generator.wait_idle(300)
        finished = [report.request_id for report in generator.reports]
        assert finished.index("b0") < finished.index("a0"), finished
        assert [r for r in finished if r.startswith("a")] == ["a0", "a1", "a2", "a3"]
        assert generator.admission.memory_in_use == 0
    finally:
        generator.stop()


def test_a_request_whose_vision_transient_can_never_fit_is_refused_naming_its_images() -> None:
    """Issue 37.4: the vision tower's transient counts beside the KV. A 1600x1000 screenshot on
    the fixture (its processor sizes it to 16 image tokens) reserves about 8 MiB of
    activations and 0.3 MiB of arrays; its KV is under 0.5 MiB. Before, a 2 MiB budget admitted
    it (KV and arrays only); now it is refused before any work, naming the images, while the
    same text alone runs."""
    generator = started(budget_mib=2)
    try:
        memory = generator.admission.memory
        assert memory is not None and memory.vision is not None
        screenshot = image_part(big_png(1600))
        request = prepared(
            generator, screenshot, text_part("What is on the screen?"), temperature=0.0, seed=1
        )
        tokens = memory.image_tokens(request.prompt_ids, [image.token_count for image in request.images])
        assert sum(tokens) > 0
        kv_and_arrays = memory.cost(len(request.prompt_ids), request.settings.max_tokens, 0) + sum(
            int(a.nbytes) for image in request.images for a in image.arrays.values()
        )
        assert kv_and_arrays < 2 << 20 < kv_and_arrays + memory.transient(tokens)
        refused_for_the_tower_then_text_runs(generator, request, "What is on the screen?")
    finally:
        generator.stop()


def test_screenshots_prefill_one_at_a_time_and_decode_together() -> None:
    """Two screenshot requests whose transients fit the budget one at a time: the second waits
    for the first's prefill, then joins it once the first's transient is given back (they
    decode in one batch), and the reservation never passes the budget."""
    budget_mib = 12  # one transient (8.1 MiB) and two requests' KV, not two transients
    generator = started(budget_mib=budget_mib)
    try:
        jobs = [
            Job(
                dataclasses.replace(
                    prepared(
                        generator,
                        image_part(big_png(1600)),
                        text_part(f"Screen {i}: what is on it?"),
                        temperature=0.0,
                        seed=i,
                        max_tokens=120,
                    ),
                    request_id=f"shot-{i}",
                ),
                None,
            )
            for i in range(2)
        ]
        memory = generator.admission.memory
        assert memory is not None
        costs = [
            memory.cost(
                len(job.request.prompt_ids),
                job.request.settings.max_tokens,
                sum(int(a.nbytes) for image in job.request.images for a in image.arrays.values()),
                memory.image_tokens(
                    job.request.prompt_ids, [image.token_count for image in job.request.images]
                ),
            )
            for job in jobs
        ]
        assert sum(costs) > budget_mib << 20 > max(costs), costs
        peak = 0
        for job in jobs:
            generator.submit(job)
        while not all(job.done.wait(0.002) for job in jobs):  # (sampled, not spun)
            peak = max(peak, generator.admission.memory_in_use)
        assert peak <= budget_mib << 20
        reports = {report.request_id: report for report in generator.reports}
        assert all(reports[job.request_id].output_tokens == 120 for job in jobs)
        single, steps = batch_sizes(generator)
        assert single < steps, "once the first's prefill is done, the second decodes beside it"
        assert generator.admission.memory_in_use == 0
    finally:
        generator.stop()
