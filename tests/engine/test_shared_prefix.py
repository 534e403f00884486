"""Requests in flight that start the same way compute their common prefix once.

A request that shares at least `shared_prefix_min_tokens` first prompt tokens with an earlier
one still prefilling (same partition) waits for that request's KV cache to cover them and starts
from it (the tokens count as cached); the rest of its prompt is prefilled as usual, in a shared
forward with others when it fits (rows then start from prefixes of different lengths). On the
random fixture model, with the prefix cache off so only this mechanism reuses anything, every
request still produces what it produces alone: the same tokens, logits within 1e-4, greedy and
seeded at a high temperature.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

import numpy as np
import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.loop.prefix_cache import shared_prefix_length
from vlmserve.engine.v1 import engine_pb2 as pb

from ._logits_hooks import with_hooks
from .test_batching import (
    FILLER,
    AtToken,
    alone,
    assert_equal_to_alone,
    prepared,
    recorded,
    submitted_in_one_step,
)
from .test_engine_grpc import image_part, png, text_part

pytestmark = pytest.mark.needs_model

SHARED = "You are checking the inventory of a warehouse, shelf by shelf, and report in short lines. " * 2
LONG_SHARED = " ".join(f"Shelf {i} holds {i * 7 % 13} boxes of screws;" for i in range(24))


def start_generator(**overrides: int) -> Generator:
    settings = {
        "max_active": 8,
        "max_queue": 16,
        "max_output_tokens": 64,
        "prefix_cache_min_tokens": 0,  # only requests in flight share anything
        "shared_prefix_min_tokens": 8,
        **overrides,
    }
    generator = Generator(EngineConfig(model=str(RANDOM_MODEL_PATH), warmup=False, **settings))
    generator.start()
    assert generator.ready.wait(60), generator.load_error
    return generator


@pytest.fixture(scope="module")
def wide() -> Iterator[Generator]:
    """Whole prompts in one chunk: the rest of each follower's prompt is prefilled together."""
    generator = start_generator(prefill_chunk_tokens=128, step_tokens=512)
    yield generator
    generator.stop()


@pytest.fixture(scope="module")
def chunked() -> Iterator[Generator]:
    """Small chunks: a long prompt prefills over many steps while others arrive."""
    generator = start_generator(prefill_chunk_tokens=32, step_tokens=48)
    yield generator
    generator.stop()


def arriving_together(generator: Generator, temperature: float) -> dict[str, PreparedRequest]:
    def ask(*parts: pb.Part, seed: int) -> PreparedRequest:
        return prepared(generator, *parts, temperature=temperature, seed=seed, max_tokens=16)

    return {
        "leader": ask(text_part(SHARED + "How many boxes are left?"), seed=1),
        "follower": ask(text_part(SHARED + "Where are the pallets kept?"), seed=2),
        "with_image": ask(
            text_part(SHARED), image_part(png((64, 64), seed=3)), text_part("And here?"), seed=3
        ),
        # Shares only the chat template's opening with the others: a much shorter prefix.
        "template_only": ask(text_part("Something else entirely."), seed=4),
        # The leader's very prompt, from another tenant: never shares with it.
        "other_tenant": dataclasses.replace(
            ask(text_part(SHARED + "How many boxes are left?"), seed=1), partition_key="b"
        ),
    }


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_requests_arriving_together_compute_their_shared_prefix_once(
    wide: Generator, temperature: float
) -> None:
    requests, alone_logits = recorded(arriving_together(wide, temperature))
    reference = alone(wide, requests, f"shared-{temperature}")
    assert all(report.cached_tokens == 0 for report in reference.values())
    requests, together_logits = recorded(arriving_together(wide, temperature))
    together = submitted_in_one_step(wide, requests, f"shared-{temperature}")

    leader, follower = requests["leader"], requests["follower"]
    shared = shared_prefix_length(np.asarray(leader.prompt_ids), {}, np.asarray(follower.prompt_ids), {})
    assert shared > 30
    assert together["leader"].cached_tokens == 0
    assert together["follower"].cached_tokens == shared
    assert together["with_image"].cached_tokens >= shared - 8  # up to where the image starts
    assert 8 <= together["template_only"].cached_tokens < 30
    assert together["other_tenant"].cached_tokens == 0, "a prefix never serves another partition"
    assert all(report.finish_reason == pb.FINISH_REASON_LENGTH for report in together.values())
    assert_equal_to_alone(together, reference, together_logits, alone_logits)


def test_a_request_waits_for_the_prefill_in_flight_that_covers_its_prefix(chunked: Generator) -> None:
    """The leader's long prompt prefills over many steps; a follower that arrives meanwhile
    does not prefill the shared part itself but starts from the leader's cache."""
    leader = prepared(chunked, text_part(LONG_SHARED + " Count them."), temperature=1.5, seed=1, max_tokens=8)
    follower = prepared(
        chunked, text_part(LONG_SHARED + " Which is fullest?"), temperature=1.5, seed=2, max_tokens=8
    )
    assert len(leader.prompt_ids) > 5 * chunked.config.prefill_chunk_tokens
    reference = alone(chunked, {"leader": leader, "follower": follower}, "waits")
    jobs = {
        "leader": Job(dataclasses.replace(leader, request_id="waits-leader"), None),
        "follower": Job(dataclasses.replace(follower, request_id="waits-follower"), None),
    }
    running = prepared(chunked, text_part("Keep going."), temperature=0.0, seed=0, max_tokens=24)
    running = with_hooks(
        running,
        AtToken(1, lambda: chunked.submit(jobs["leader"])),
        AtToken(4, lambda: chunked.submit(jobs["follower"])),
        request_id="waits-running",
        partition_key=FILLER,
    )
    chunked.submit(Job(running, None))
    assert chunked.wait_idle(300)
    reports = {report.request_id: report for report in chunked.reports}
    got = {name: reports[job.request_id] for name, job in jobs.items()}
    shared = shared_prefix_length(np.asarray(leader.prompt_ids), {}, np.asarray(follower.prompt_ids), {})
    assert got["leader"].cached_tokens == 0
    assert got["follower"].cached_tokens == shared > 5 * chunked.config.prefill_chunk_tokens
    for name in jobs:
        assert got[name].token_ids == reference[name].token_ids, name


def test_a_follower_whose_leader_is_cancelled_computes_its_prompt_itself(chunked: Generator) -> None:
    leader = prepared(chunked, text_part(LONG_SHARED + " Count them."), temperature=1.5, seed=3, max_tokens=8)
    follower = prepared(
        chunked, text_part(LONG_SHARED + " Which is fullest?"), temperature=1.5, seed=4, max_tokens=8
    )
    reference = alone(chunked, {"follower": follower}, "orphan")["follower"]
    leader_job = Job(dataclasses.replace(leader, request_id="orphan-leader"), None)
    follower_job = Job(dataclasses.replace(follower, request_id="orphan-follower"), None)

    def submit_both() -> None:
        chunked.submit(leader_job)
        chunked.submit(follower_job)

    running = prepared(chunked, text_part("Keep going."), temperature=0.0, seed=0, max_tokens=24)
    running = with_hooks(
        running,
        # Cancelled while its prompt is still prefilling (it takes over five chunks).
        AtToken(1, submit_both),
        AtToken(4, leader_job.cancel),
        request_id="orphan-running",
        partition_key=FILLER,
    )
    chunked.submit(Job(running, None))
    assert chunked.wait_idle(300)
    reports = {report.request_id: report for report in chunked.reports}
    assert reports["orphan-leader"].finish_reason == pb.FINISH_REASON_CANCELLED
    assert reports["orphan-leader"].output_tokens == 0, "cancelled before its prompt was done"
    orphan = reports["orphan-follower"]
    assert orphan.finish_reason == pb.FINISH_REASON_LENGTH
    assert orphan.cached_tokens == 0
    assert orphan.token_ids == reference.token_ids


def test_off_when_the_minimum_is_zero() -> None:
    generator = start_generator(prefill_chunk_tokens=128, step_tokens=512, shared_prefix_min_tokens=0)
    try:
        together = submitted_in_one_step(generator, arriving_together(generator, 0.0), "off")
        assert all(report.cached_tokens == 0 for report in together.values())
    finally:
        generator.stop()


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_a_request_starts_from_a_decoding_request_that_shares_its_prefix(
    wide: Generator, temperature: float
) -> None:
    """The shared prefix is already in the batch: the newcomer takes it from that row at once
    (rows of different lengths, so the row's left padding matters), and still equals its run alone."""
    decoding = prepared(
        wide, text_part(SHARED + "Tell me everything."), temperature=temperature, seed=5, max_tokens=24
    )
    other = prepared(wide, text_part("A much longer question than the others, " * 9), temperature=0.0, seed=6)
    newcomer = prepared(
        wide, text_part(SHARED + "How many boxes?"), temperature=temperature, seed=7, max_tokens=12
    )
    requests, alone_logits = recorded({"newcomer": newcomer})
    reference = alone(wide, requests, f"from-row-{temperature}")["newcomer"]
    requests, logits = recorded({"newcomer": newcomer})
    job = Job(dataclasses.replace(requests["newcomer"], request_id=f"from-row-{temperature}"), None)
    decoding = with_hooks(
        decoding, AtToken(3, lambda: wide.submit(job)), request_id=f"from-row-{temperature}-decoding"
    )
    wide.submit(Job(dataclasses.replace(other, request_id=f"from-row-{temperature}-other"), None))
    wide.submit(Job(decoding, None))
    assert wide.wait_idle(300)
    reports = {report.request_id: report for report in wide.reports}
    got = reports[job.request_id]
    shared = shared_prefix_length(np.asarray(decoding.prompt_ids), {}, np.asarray(newcomer.prompt_ids), {})
    assert reports[decoding.request_id].output_tokens == 24, "it was still decoding when the newcomer came"
    assert got.cached_tokens == shared > 30
    assert got.token_ids == reference.token_ids
    np.testing.assert_allclose(
        np.stack(logits["newcomer"].rows), np.stack(alone_logits["newcomer"].rows), rtol=0, atol=1e-4
    )
