"""Validation of a request's sampling parameters (unset differs from 0; bad values are refused)."""

from __future__ import annotations

from typing import Any

import grpc
import pytest

from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.sampling import SamplingSettings, settings_from_proto
from vlmserve.engine.v1 import engine_pb2 as pb


def test_unset_fields_stay_unset_and_max_tokens_defaults_to_the_cap() -> None:
    assert settings_from_proto(pb.SamplingParams(), max_tokens_cap=100) == SamplingSettings(max_tokens=100)


def test_zero_is_a_value_not_unset() -> None:
    settings = settings_from_proto(pb.SamplingParams(temperature=0.0, top_k=0, seed=0), max_tokens_cap=10)
    assert (settings.temperature, settings.top_k, settings.seed) == (0.0, 0, 0)


def test_max_tokens_is_capped() -> None:
    assert settings_from_proto(pb.SamplingParams(max_tokens=5000), max_tokens_cap=64).max_tokens == 64
    assert settings_from_proto(pb.SamplingParams(max_tokens=7), max_tokens_cap=64).max_tokens == 7


def test_logprobs_settings() -> None:
    settings = settings_from_proto(pb.SamplingParams(logprobs=True, top_logprobs=20), max_tokens_cap=8)
    assert (settings.logprobs, settings.top_logprobs) == (True, 20)


BAD: list[tuple[dict[str, Any], str]] = [
    ({"max_tokens": 0}, "max_tokens must be at least 1"),
    ({"temperature": -0.5}, "temperature must be >= 0"),
    ({"temperature": float("nan")}, "temperature must be a finite number"),
    ({"top_p": 0.0}, "top_p must be in (0, 1]"),
    ({"top_p": 1.5}, "top_p must be in (0, 1]"),
    ({"top_k": -1}, "top_k must be >= 0"),
    ({"repetition_penalty": 0.0}, "repetition_penalty must be > 0"),
    ({"stop": [""]}, "stop[0] must not be empty"),
    ({"stop": ["x"] * 17}, "at most 16"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs must be at most 20"),
    ({"top_logprobs": 2}, "top_logprobs needs sampling.logprobs"),
]


@pytest.mark.parametrize(("fields", "message"), BAD, ids=[b[1] for b in BAD])
def test_bad_values_are_invalid_argument(fields: dict[str, Any], message: str) -> None:
    with pytest.raises(RequestError) as caught:
        settings_from_proto(pb.SamplingParams(**fields), max_tokens_cap=10)
    assert caught.value.code == grpc.StatusCode.INVALID_ARGUMENT
    assert message in caught.value.message
