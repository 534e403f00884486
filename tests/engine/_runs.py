"""Running prepared requests on a test's own `Generator`: all at once, or each in a batch of its
own (the reference a batch must equal). Request ids are `{tag}-{name}`. `reusing_engine`: the
prefix-reuse tests' Generator."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobReport, PreparedRequest
from vlmserve.engine.loop.generator import Generator

__all__ = ["reusing_engine", "run", "run_each_alone"]


def run(generator: Generator, requests: dict[str, PreparedRequest], tag: str) -> dict[str, JobReport]:
    """Submit every request at once and wait; returns their reports by name."""
    jobs = {
        name: Job(dataclasses.replace(req, request_id=f"{tag}-{name}"), None)
        for name, req in requests.items()
    }
    for job in jobs.values():
        generator.submit(job)
    assert generator.wait_idle(300)
    reports = {report.request_id: report for report in generator.reports}
    return {name: reports[job.request_id] for name, job in jobs.items()}


def run_each_alone(
    generator: Generator, requests: dict[str, PreparedRequest], tag: str
) -> dict[str, JobReport]:
    """Each request in a batch of its own, one after another."""
    return {name: run(generator, {name: req}, tag)[name] for name, req in requests.items()}


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
