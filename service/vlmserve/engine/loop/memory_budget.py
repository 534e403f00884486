"""Admission by memory: requests start only while their estimated KV and image memory fits.

A queue bounded by length says nothing about memory: sixteen 30k-token agent turns fit the queue
and not a 16 GB Mac. Each prepared request is given an estimate — its KV cache at the cache's
precision for the whole prompt plus every token it may generate (kv/sizing.py `bytes_per_token`),
plus its images' processor arrays — and the generation thread starts a waiting request only
while the estimates of the requests in flight, with it, stay under the budget. Waiting requests
are offered in round robin over partitions (tenants: the scheduler's `fair_admission`), each
partition's oldest first, and the first that does not fit stops the rest, so a large request is
not starved by small ones, and one tenant's backlog of large requests does not hold another
tenant's request behind it (it waited 21.3 s behind six 4,096-token requests before). A request
whose estimate exceeds the whole budget can never run: it is refused at admission with
RESOURCE_EXHAUSTED, saying what it needs and what to change, before any work.

The budget (`--memory-budget-mib`; 0 = derived) defaults to three quarters of the memory the
device reports (Metal's recommended working set, CUDA's total memory, the system's RAM on the
CPU backend) less what the loaded model already holds. The estimate is deliberately the upper
bound (max tokens all generated). Beside the KV, a request with images reserves its vision
tower's transient (vision_memory.py: measured per family, by image tokens) from admission
until its prefill is done, then gives it back: four 1600x1000 screenshots prefilled together
hold more in activations than their KV, and that, not the KV, is what took a Mac down.

Pure but for `device_memory_bytes` (reads the device and the system).
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc

from vlmserve.engine.loop.vision_memory import VisionCost
from vlmserve.engine.request_errors import RequestError

__all__ = ["MemoryBudget", "default_budget_bytes", "device_memory_bytes"]

BUDGET_SHARE = 0.75


@dataclass(frozen=True)
class MemoryBudget:
    """Bytes the requests in flight may hold together, and what one token of KV costs."""

    budget_bytes: int
    kv_bytes_per_token: int
    # The vision tower's transient during a prefill (vision_memory.py; None: not counted).
    vision: VisionCost | None = None
    # The prompt's image placeholder token (None: count the prepared images' own token counts).
    image_token_id: int | None = None

    def image_tokens(self, prompt_ids: Sequence[int], prepared_counts: Sequence[int]) -> tuple[int, ...]:
        """Each image's tokens: what the prepared images say, else (families prepared as a
        whole request) the prompt's placeholders shared evenly among them."""
        if prepared_counts and all(count > 0 for count in prepared_counts):
            return tuple(prepared_counts)
        if self.image_token_id is None or not prepared_counts:
            return ()
        counted = sum(1 for token in prompt_ids if token == self.image_token_id)
        return (math.ceil(counted / len(prepared_counts)),) * len(prepared_counts)

    def transient(self, image_tokens: Sequence[int]) -> int:
        """Bytes held only while the request's images go through the vision tower."""
        return self.vision.transient(image_tokens) if self.vision is not None else 0

    def cost(
        self, prompt_tokens: int, max_tokens: int, image_bytes: int, image_tokens: Sequence[int] = ()
    ) -> int:
        """Its reservation from admission through prefill: KV + images + vision transient."""
        return (
            (prompt_tokens + max_tokens) * self.kv_bytes_per_token
            + image_bytes
            + self.transient(image_tokens)
        )

    def check_fits(
        self, prompt_tokens: int, max_tokens: int, image_bytes: int, image_tokens: Sequence[int] = ()
    ) -> int:
        """The request's estimate; RESOURCE_EXHAUSTED when it exceeds the whole budget."""
        cost = self.cost(prompt_tokens, max_tokens, image_bytes, image_tokens)
        if cost > self.budget_bytes:
            raise RequestError(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"this request needs an estimated {_mib(cost)} MiB (KV cache for {prompt_tokens} prompt + "
                f"{max_tokens} output tokens at {self.kv_bytes_per_token} bytes per token, and "
                f"{_mib(image_bytes)} MiB of images, and {_mib(self.transient(image_tokens))} MiB of "
                f"vision-tower activations for {sum(image_tokens)} image tokens), more than the "
                f"engine's memory budget of {_mib(self.budget_bytes)} MiB; lower max_tokens, shorten "
                "the conversation or send fewer or smaller images",
                # What to change: the images, when they are most of it.
                field="messages"
                if 2 * (image_bytes + self.transient(image_tokens)) > cost
                else "sampling.max_tokens",
            )
        return cost


def device_memory_bytes() -> int:
    """The memory the device can use: Metal's recommended working set, CUDA's total memory,
    else (the CPU backend) the system's RAM."""
    import mlx.core as mx

    info: dict[str, Any] = dict(mx.device_info())
    for key in ("max_recommended_working_set_size", "memory_size", "total_memory"):
        if int(info.get(key) or 0) > 0:
            return int(info[key])
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def default_budget_bytes(device_bytes: int, model_bytes: int) -> int:
    return max(0, int(device_bytes * BUDGET_SHARE) - model_bytes)


def _mib(value: int) -> str:
    return f"{value / (1 << 20):.1f}"
