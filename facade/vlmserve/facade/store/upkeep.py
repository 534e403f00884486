"""Store upkeep: expired responses deleted, space nothing uses any more given back, on a timer;
and this facade's lease renewed, responses of facades that died marked failed.

Upkeep runs once when the facade starts and then every `storage.maintenance_interval_s`. A
response expires `storage.response_ttl_s` after it was created (as OpenAI keeps responses 30
days); conversations do not expire. An expired response may still be read until the next run
(at most one interval later).

Leases: a facade instance renews its lease every third of `storage.lease_ttl_s`; each time, the
responses left unfinished by instances whose lease expired (killed, crashed, cut off) are marked
failed, so they do not stay `in_progress` forever even when no facade restarts.
"""

from __future__ import annotations

import asyncio
import logging
import time

from vlmserve.facade.settings import Storage
from vlmserve.facade.store.records import Maintenance
from vlmserve.facade.store.repositories import Store

logger = logging.getLogger("vlmserve.facade")

# What a response left in progress by a facade that died says once a live one notices.
INTERRUPTED_ERROR = {"code": "server_error", "message": "The server restarted before this response finished."}


async def upkeep_once(store: Store, storage: Storage, *, now: float | None = None) -> Maintenance:
    """One run: expire, free unused images, vacuum."""
    ttl = storage.response_ttl_s
    current = time.time() if now is None else now
    done = await store.maintain(expire_before=None if ttl is None else int(current - ttl))
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
            await upkeep_once(store, storage)
        except Exception:
            logger.exception("store upkeep failed; trying again in %.0f s", storage.maintenance_interval_s)
        await asyncio.sleep(storage.maintenance_interval_s)


async def fail_interrupted(store: Store) -> list[str]:
    """Responses of dead facades, which nothing will ever finish, marked failed (and logged)."""
    interrupted = await store.leases.fail_unfinished(INTERRUPTED_ERROR)
    if interrupted:
        logger.warning(
            "%d response(s) left in progress by a facade that stopped marked failed: %s",
            len(interrupted),
            ", ".join(interrupted[:10]) + (" ..." if len(interrupted) > 10 else ""),
        )
    return interrupted


async def run_lease(store: Store, storage: Storage) -> None:
    """Renew this facade's lease and sweep dead facades' responses every third of the lease,
    until cancelled; a failed round is logged, not fatal."""
    interval = storage.lease_ttl_s / 3
    while True:
        await asyncio.sleep(interval)
        try:
            await store.leases.renew()
            await fail_interrupted(store)
        except Exception:
            logger.exception("store lease renewal failed; trying again in %.1f s", interval)
