"""The engine's own first generations (generation thread), run step by step on a runner of their
own before serving, so the first requests do not pay for what a backend sets up on first use
(kernels built or traced for new shapes, lazily created buffers and threads):

1. a short request with an image: the vision tower, a short prefill, a few decode steps;
2. a text prompt of one whole prefill chunk and a short one after it (`chunk_tokens` + 32, at
   most half the context and `MAX_PROMPT_TOKENS`): a full-width chunk through every layer kind
   (attention, recurrent, sliding window), then a chunk at an offset;
3. that conversation's next turn (its prompt, an answer and a new question), as an agent's next
   turn: with the prefix cache on it starts from the entry (2) left — the restore path, for a
   hybrid model its recurrent state's snapshot — and prefills a short tail over a long cache;
   its decode steps verify drafts when speculation is on (the prompt repeats itself, so lookup
   has matches).

What they leave in the caches goes, and so do their cache hits. `WarmUpReport` says what ran
(tests, the log)."""

from __future__ import annotations

import io
import logging
import time
from dataclasses import dataclass, field

from vlmserve.engine.jobs import Job, JobKind, JobReport, PreparedRequest
from vlmserve.engine.loop.runner import StepRunner
from vlmserve.engine.loop.wiring import EngineParts
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["MAX_PROMPT_TOKENS", "WarmUpReport", "warm_up"]

log = logging.getLogger(__name__)

# The long prompt's bound: a configured chunk past this is warmed up in part (time and memory
# stay those of a short request's prefill).
MAX_PROMPT_TOKENS = 2048
# Tokens past the whole chunk: the second, short chunk runs at an offset, as a restored turn's.
_TAIL_TOKENS = 32
_PARTITION = "vlmserve-warm-up"
_SENTENCE = (
    "The engine warms up before serving: it reads this text, keeps its cache and answers the next "
    "turn from it, as an agent's conversation does."
)
_FILLER = tuple(_SENTENCE.split())


@dataclass
class WarmUpReport:
    """What the warm-up ran, in order (the requests' own reports)."""

    chunk_tokens: int
    runs: list[JobReport] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def restored_tokens(self) -> int:
        """Prompt tokens the last run (the next turn) took from the prefix cache."""
        return self.runs[-1].cached_tokens if self.runs else 0


def warm_up(loaded: LoadedModel, parts: EngineParts, *, chunk_tokens: int) -> WarmUpReport:
    report = WarmUpReport(chunk_tokens=chunk_tokens)
    if loaded.template is None:
        return report  # such a model takes no conversation, so no request would run
    started = time.perf_counter()
    # The warm-up's own hits are not served traffic's (metrics, stats).
    prefix_hits, vision_hits = dict(parts.prefix_cache.hits), parts.vision_cache.hits
    runner = parts.new_runner()
    report.runs.append(_run(runner, _prepare(parts, "warm-up-image", _image_turn(parts), max_tokens=2)))
    target = min(chunk_tokens + _TAIL_TOKENS, loaded.info.context_length // 2, MAX_PROMPT_TOKENS)
    first = _long_turn(parts, target)
    report.runs.append(_run(runner, _prepare(parts, "warm-up-long", first, max_tokens=2)))
    following = [
        *first,
        pb.Message(role=pb.ROLE_ASSISTANT, parts=[_text(" ".join(_FILLER[:8]))]),
        pb.Message(role=pb.ROLE_USER, parts=[_text("Again, from the start.")]),
    ]
    report.runs.append(_run(runner, _prepare(parts, "warm-up-next-turn", following, max_tokens=6)))
    parts.prefix_cache.clear()
    parts.vision_cache.clear()
    parts.prefix_cache.hits, parts.vision_cache.hits = prefix_hits, vision_hits
    report.seconds = time.perf_counter() - started
    log.info(
        "warm-up done in %.2fs (prompts of %s tokens, %d from the prefix cache)",
        report.seconds,
        "/".join(str(r.prompt_tokens) for r in report.runs),
        report.restored_tokens,
    )
    return report


def _text(text: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=text))


def _image_turn(parts: EngineParts) -> list[pb.Message]:
    from PIL import Image

    message = [_text("warm-up")]
    if parts.preparer.takes_images:
        png = io.BytesIO()
        Image.new("RGB", (112, 112), (127, 127, 127)).save(png, "PNG")
        message.insert(0, pb.Part(image=pb.ImagePart(data=png.getvalue(), media_type="image/png")))
    return [pb.Message(role=pb.ROLE_USER, parts=message)]


def _filler(words: int) -> list[pb.Message]:
    text = " ".join(_FILLER[i % len(_FILLER)] for i in range(words))
    return [pb.Message(role=pb.ROLE_USER, parts=[_text(text)])]


def _long_turn(parts: EngineParts, target: int) -> list[pb.Message]:
    """A user turn of about `target` prompt tokens (at least, unless the bound is near): the words
    per token are measured on the model's own tokenizer and template."""
    words = 64
    for _ in range(3):
        tokens = len(_prepare(parts, "warm-up-measure", _filler(words), max_tokens=1).prompt_ids)
        if tokens >= target:
            break
        words = max(words + 1, words * target // max(tokens, 1) + 4)
    return _filler(words)


def _prepare(
    parts: EngineParts, request_id: str, messages: list[pb.Message], *, max_tokens: int
) -> PreparedRequest:
    return parts.preparer.prepare(
        pb.GenerateRequest(
            request_id=request_id,
            messages=messages,
            sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0),
            partition_key=_PARTITION,
        ),
        kind=JobKind.GENERATE,
    )


def _run(runner: StepRunner, request: PreparedRequest) -> JobReport:
    joined = [Job(request, None)]
    finished: list[JobReport] = []
    while joined or len(runner):
        result = runner.run_step(joined)
        joined = []
        finished += [row.report() for row in result.left]
    (done,) = finished
    return done
