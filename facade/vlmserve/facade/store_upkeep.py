"""Store upkeep: expired responses deleted, space nothing uses any more given back, on a timer.

Runs once when the facade starts and then every `storage.maintenance_interval_s`, in a thread
(the store's calls block). A response expires `storage.response_ttl_s` after it was created (as
OpenAI keeps responses 30 days); conversations do not expire. An expired response may still be
read until the next run (at most one interval later).
"""

from __future__ import annotations

import asyncio
import logging
import time

from .settings import Storage
from .storage import Maintenance, Store

logger = logging.getLogger("vlmserve.facade")


def upkeep_once(store: Store, storage: Storage, *, now: float | None = None) -> Maintenance:
    """One run: expire, free unused images, vacuum."""
    ttl = storage.response_ttl_s
    current = time.time() if now is None else now
    done = store.maintain(expire_before=None if ttl is None else int(current - ttl))
    if done.expired_responses or done.freed_images or done.freed_pages:
        logger.info(
            "store upkeep: %d expired response(s) deleted, %d unused image(s) freed, %d page(s) returned",
            done.expired_responses,
            done.freed_images,
            done.freed_pages,
        )
    return done


async def run_upkeep(store: Store, storage: Storage) -> None:
    """Upkeep now and then every interval, until cancelled; a failed run is logged, not fatal."""
    while True:
        try:
            await asyncio.to_thread(upkeep_once, store, storage)
        except Exception:
            logger.exception("store upkeep failed; trying again in %.0f s", storage.maintenance_interval_s)
        await asyncio.sleep(storage.maintenance_interval_s)
