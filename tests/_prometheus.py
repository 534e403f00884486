"""Reading Prometheus text exposition in tests (engine and facade /metrics)."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families


def metric_samples(text: str) -> dict[str, float]:
    """Every sample as 'name{label="value",...}' -> value."""
    samples: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{key}="{value}"' for key, value in sorted(sample.labels.items()))
            samples[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return samples


def moved(before: dict[str, float], after: dict[str, float], name: str) -> float:
    """How much a sample grew between two scrapes (absent counts as 0)."""
    return after.get(name, 0.0) - before.get(name, 0.0)
