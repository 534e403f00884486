"""Request sampling settings (validated, pure) and the per-request token sampler (MLX).

`settings_from_proto` runs on the gRPC side and refuses bad values with INVALID_ARGUMENT.
`TokenSampler` runs on the generation thread only. Each sampler owns its random streams (an MLX
key and a host generator, both from the request's seed), so a seeded request samples the same
tokens however it is interleaved with other requests and whatever batch it is chosen in
(token_choice.py chooses a step's rows together).
"""

from __future__ import annotations

import math
import random
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vlmserve.engine.request_errors import invalid_argument
from vlmserve.engine.token_choice import choose_tokens
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = [
    "MAX_STOP_SEQUENCES",
    "MAX_TOP_LOGPROBS",
    "SamplingSettings",
    "TokenSampler",
    "settings_from_proto",
]

MAX_STOP_SEQUENCES = 16
MAX_STOP_SEQUENCE_CHARS = 1024
# OpenAI's bound on `top_logprobs`.
MAX_TOP_LOGPROBS = 20
# Tokens (recent prompt + generated) the repetition penalty looks at, as in mlx-vlm.
REPETITION_CONTEXT_TOKENS = 20


@dataclass(frozen=True, slots=True)
class SamplingSettings:
    max_tokens: int
    # None: the model's generation_config default (then mlx-vlm's).
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    repetition_penalty: float | None = None
    # Report each visible token's logprob, with this many alternatives (logprobs.py).
    logprobs: bool = False
    top_logprobs: int = 0


def _finite(name: str, value: float) -> float:
    if not math.isfinite(value):
        raise invalid_argument(f"sampling.{name} must be a finite number", field=f"sampling.{name}")
    return value


def settings_from_proto(params: pb.SamplingParams, *, max_tokens_cap: int) -> SamplingSettings:
    """Validate the request's sampling parameters; max_tokens defaults to (and is capped at) the cap."""
    max_tokens = max_tokens_cap
    if params.HasField("max_tokens"):
        if params.max_tokens < 1:
            raise invalid_argument("sampling.max_tokens must be at least 1", field="sampling.max_tokens")
        max_tokens = min(params.max_tokens, max_tokens_cap)
    temperature = None
    if params.HasField("temperature"):
        temperature = _finite("temperature", params.temperature)
        if temperature < 0:
            raise invalid_argument("sampling.temperature must be >= 0", field="sampling.temperature")
    top_p = None
    if params.HasField("top_p"):
        top_p = _finite("top_p", params.top_p)
        if not 0 < top_p <= 1:
            raise invalid_argument("sampling.top_p must be in (0, 1]", field="sampling.top_p")
    top_k = None
    if params.HasField("top_k"):
        if params.top_k < 0:
            raise invalid_argument("sampling.top_k must be >= 0 (0 disables it)", field="sampling.top_k")
        top_k = params.top_k
    repetition_penalty = None
    if params.HasField("repetition_penalty"):
        repetition_penalty = _finite("repetition_penalty", params.repetition_penalty)
        if repetition_penalty <= 0:
            raise invalid_argument(
                "sampling.repetition_penalty must be > 0", field="sampling.repetition_penalty"
            )
    stops = tuple(params.stop)
    if len(stops) > MAX_STOP_SEQUENCES:
        raise invalid_argument(
            f"sampling.stop has {len(stops)} sequences; at most {MAX_STOP_SEQUENCES}", field="sampling.stop"
        )
    for index, stop in enumerate(stops):
        if not stop:
            raise invalid_argument(
                f"sampling.stop[{index}] must not be empty", field=f"sampling.stop[{index}]"
            )
        if len(stop) > MAX_STOP_SEQUENCE_CHARS:
            raise invalid_argument(
                f"sampling.stop[{index}] is longer than {MAX_STOP_SEQUENCE_CHARS} characters",
                field=f"sampling.stop[{index}]",
            )
    if params.top_logprobs > MAX_TOP_LOGPROBS:
        raise invalid_argument(
            f"sampling.top_logprobs must be at most {MAX_TOP_LOGPROBS}", field="sampling.top_logprobs"
        )
    if params.top_logprobs and not params.logprobs:
        raise invalid_argument(
            "sampling.top_logprobs needs sampling.logprobs set", field="sampling.top_logprobs"
        )
    return SamplingSettings(
        max_tokens=max_tokens,
        temperature=temperature,
        top_p=top_p,
        top_k=top_k,
        seed=params.seed if params.HasField("seed") else None,
        stop=stops,
        repetition_penalty=repetition_penalty,
        logprobs=params.logprobs,
        top_logprobs=params.top_logprobs,
    )


class TokenSampler:
    """Chooses the next token from logits with the request's settings. Generation thread only."""

    def __init__(self, settings: SamplingSettings, model_config: Any) -> None:
        import mlx.core as mx
        from mlx_vlm.generate.common import resolve_sampling_defaults
        from mlx_vlm.sample_utils import clamp_temperature

        temperature, top_p, top_k = resolve_sampling_defaults(
            model_config, temperature=settings.temperature, top_p=settings.top_p, top_k=settings.top_k
        )
        self.temperature = float(clamp_temperature(float(temperature)))
        self.top_p = float(top_p) if top_p is not None else 1.0
        self.top_k = int(top_k) if top_k is not None else 0
        seed = settings.seed if settings.seed is not None else secrets.randbits(63)
        self._key = mx.random.key(seed % (1 << 64))
        # The uniform numbers of top_k draws and of the acceptance rule: host-side, so a batched
        # draw needs no random op per row.
        self._uniforms = random.Random(seed)
        self._repetition_penalty = settings.repetition_penalty

    def __call__(self, logits: Any, recent_tokens: Sequence[int]) -> Any:
        """Logits [1, vocab] -> token id array [1] (lazy)."""
        return self.choose(self.penalize(logits, recent_tokens))

    def penalize(self, logits: Any, recent_tokens: Sequence[int]) -> Any:
        """The repetition penalty (when set): the last change to the distribution itself, so the
        logits after it are the ones logprobs report."""
        import mlx.core as mx
        from mlx_vlm.sample_utils import make_repetition_penalty

        if self._repetition_penalty is not None and self.penalizes and recent_tokens:
            penalty = make_repetition_penalty(self._repetition_penalty, REPETITION_CONTEXT_TOKENS)
            logits = penalty(mx.array(list(recent_tokens[-REPETITION_CONTEXT_TOKENS:])), logits)
        return logits

    @property
    def penalizes(self) -> bool:
        """Whether `penalize` changes logits (a repetition penalty other than 1)."""
        return self._repetition_penalty is not None and self._repetition_penalty != 1.0

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def choose(self, logits: Any) -> Any:
        """Temperature, top_p, top_k and the draw (or argmax at temperature 0): token_choice.py's
        rule for one row, so a row chosen alone and in a batch gets the same token."""
        return choose_tokens(logits, [self])

    def scaled_logprobs(self, logits: Any) -> Any:
        """The (unnormalised) log-distribution a token is drawn from: top_p, top_k, temperature."""
        import mlx.core as mx
        from mlx_vlm.sample_utils import apply_top_k, apply_top_p

        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < self.top_p < 1:
            logprobs = apply_top_p(logprobs, self.top_p)
        if 0 < self.top_k < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, self.top_k)
        return logprobs * (1 / self.temperature)

    def draw(self, scaled_logprobs: Any) -> Any:
        """A token from `scaled_logprobs` with this request's key."""
        import mlx.core as mx

        self._key, step_key = mx.random.split(self._key)
        return mx.random.categorical(scaled_logprobs, key=step_key)

    def uniform(self) -> float:
        """A uniform [0, 1) number from this request's host stream (top_k draws, speculative
        acceptance)."""
        return self._uniforms.random()
