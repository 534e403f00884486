"""The generation thread: admission, scheduling, batched prefill and decode, caches, sampling."""
