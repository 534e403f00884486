"""Running prepared requests on a test's own `Generator`: all at once, or each in a batch of its
own (the reference a batch must equal). Request ids are `{tag}-{name}`."""

from __future__ import annotations

import dataclasses

from vlmserve.engine.jobs import Job, JobReport, PreparedRequest
from vlmserve.engine.loop.generator import Generator

__all__ = ["run", "run_each_alone"]


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
