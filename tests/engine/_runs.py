"""Running prepared requests on a test's own `Generator`: all at once, or each in a batch of its
own (the reference a batch must equal), as plain jobs (their reports back: `run`) or as jobs of
a test's own type, say one that keeps its events (the jobs back: `run_jobs`). Request ids are
`{tag}-{name}`. `reusing_engine`: the prefix-reuse tests' Generator."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypeVar

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobReport, PreparedRequest
from vlmserve.engine.loop.generator import Generator

__all__ = ["report_of", "reusing_engine", "run", "run_each_alone", "run_jobs", "run_jobs_each_alone"]

AnyJob = TypeVar("AnyJob", bound=Job)
Outcome = TypeVar("Outcome")


def run_jobs(
    generator: Generator,
    requests: dict[str, PreparedRequest],
    tag: str,
    job_type: Callable[[PreparedRequest, None], AnyJob],
) -> dict[str, AnyJob]:
    """Submit every request at once as a `job_type` (Job, or one that keeps its events) and
    wait; returns the jobs by name."""
    jobs = {
        name: job_type(dataclasses.replace(request, request_id=f"{tag}-{name}"), None)
        for name, request in requests.items()
    }
    for job in jobs.values():
        generator.submit(job)
    assert generator.wait_idle(300)
    return jobs


def run_jobs_each_alone(
    generator: Generator,
    requests: dict[str, PreparedRequest],
    tag: str,
    job_type: Callable[[PreparedRequest, None], AnyJob],
) -> dict[str, AnyJob]:
    """Each request in a batch of its own, one after another."""
    return _one_at_a_time(lambda batch: run_jobs(generator, batch, tag, job_type), requests)


def report_of(generator: Generator, job: Job) -> JobReport:
    """The engine's report of a finished job (the latest, should its request id have run before)."""
    return next(report for report in reversed(generator.reports) if report.request_id == job.request_id)


def run(generator: Generator, requests: dict[str, PreparedRequest], tag: str) -> dict[str, JobReport]:
    """Submit every request at once and wait; returns their reports by name."""
    jobs = run_jobs(generator, requests, tag, Job)
    reports = {report.request_id: report for report in generator.reports}
    return {name: reports[job.request_id] for name, job in jobs.items()}


def run_each_alone(
    generator: Generator, requests: dict[str, PreparedRequest], tag: str
) -> dict[str, JobReport]:
    """Each request in a batch of its own, one after another; their reports by name."""
    return _one_at_a_time(lambda batch: run(generator, batch, tag), requests)


def _one_at_a_time(
    run_batch: Callable[[dict[str, PreparedRequest]], dict[str, Outcome]],
    requests: dict[str, PreparedRequest],
) -> dict[str, Outcome]:
    # Each batch's outcome is read as it ends: the engine keeps only its latest reports.
    return {name: run_batch({name: request})[name] for name, request in requests.items()}


@contextmanager
def reusing_engine(model: Path) -> Iterator[Generator]:
    """A started Generator on `model` whose prefix cache keeps prompts of 8 tokens and more,
    prefilling in chunks of 16 (the prefix-reuse tests' prompts pass many chunk boundaries)."""
    generator = Generator(
        EngineConfig(
            model=str(model), warmup=False, prefix_cache_min_tokens=8, prefill_chunk_tokens=16, step_tokens=24
        )
    )
    generator.start()
    try:
        assert generator.ready.wait(120), generator.load_error
        yield generator
    finally:
        generator.stop()
