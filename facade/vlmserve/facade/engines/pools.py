"""The models this facade serves: one pool of engines per model, and the one resolver that maps a
request's `model` to its pool (Responses, chat completions and Anthropic Messages all use it).

A pool is one engine client (one gRPC channel: round-robin over its engines, health-checked)
with its model info cached (`ModelCatalog`) and the facade limits for that model.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from vlmserve.client import AsyncEngineClient, EngineError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.engines.catalog import ModelCatalog
from vlmserve.facade.http.errors import model_not_found
from vlmserve.facade.settings import Files, Limits, Timeouts
from vlmserve.facade.settings.model_routes import (
    MODEL_FILE_LIMITS,
    MODEL_GENERATE_TIMEOUT,
    MODEL_LIMITS,
    ModelRoute,
)

__all__ = ["ModelPool", "ModelRouter", "PoolStatus", "ResolvedModel"]


@dataclass
class ModelPool:
    route: ModelRoute
    engine: AsyncEngineClient
    catalog: ModelCatalog
    # The facade's limits and file settings with this model's own (ModelRoute.limits) applied.
    limits: Limits
    files: Files
    # Seconds one generation may take (--generate-timeout, or the model's own).
    generate_timeout_s: float

    def public_id(self, info: pb.GetModelInfoResponse) -> str:
        """The id clients see (responses' `model`, /v1/models): the configured one, else the engine's."""
        return self.route.id or info.model_id

    @property
    def aliases(self) -> tuple[str, ...]:
        return self.route.aliases


@dataclass(frozen=True, slots=True)
class ResolvedModel:
    """A request's model: its pool, and what its engine says about it."""

    pool: ModelPool
    info: pb.GetModelInfoResponse

    @property
    def id(self) -> str:
        return self.pool.public_id(self.info)

    @property
    def engine(self) -> AsyncEngineClient:
        return self.pool.engine

    @property
    def limits(self) -> Limits:
        return self.pool.limits

    @property
    def files(self) -> Files:
        return self.pool.files

    @property
    def generate_timeout_s(self) -> float:
        return self.pool.generate_timeout_s


@dataclass(frozen=True, slots=True)
class PoolStatus:
    pool: ModelPool
    info: pb.GetModelInfoResponse | None
    serving: bool

    @property
    def id(self) -> str:
        """The id to list it by (before its engine was ever reached: the configured one, or "default")."""
        if self.pool.route.id is not None:
            return self.pool.route.id
        return self.info.model_id if self.info is not None else self.pool.route.names()[0]


class ModelRouter:
    def __init__(self, pools: Sequence[ModelPool]) -> None:
        if not pools:
            raise ValueError("a facade serves at least one model")
        self.pools = list(pools)
        # model_routes puts the model "default" names first.
        self.default = self.pools[0]
        self._by_name = {name: pool for pool in self.pools for name in pool.route.names()}

    @classmethod
    def build(
        cls,
        routes: Sequence[ModelRoute],
        *,
        client: Callable[[ModelRoute], AsyncEngineClient],
        limits: Limits,
        files: Files,
        timeouts: Timeouts,
        ttl_s: float,
    ) -> ModelRouter:
        pools = []
        for route in routes:
            engine = client(route)
            own = {key: value for key, value in route.limits.items() if key in MODEL_LIMITS}
            own_files = {key: value for key, value in route.limits.items() if key in MODEL_FILE_LIMITS}
            pools.append(
                ModelPool(
                    route,
                    engine,
                    ModelCatalog(engine, ttl_s=ttl_s, timeout_s=timeouts.control),
                    limits.replace(**own) if own else limits,
                    files.replace(**own_files) if own_files else files,
                    # Validated as the flag is (seconds > 0).
                    timeouts.replace(generate=route.limits[MODEL_GENERATE_TIMEOUT]).generate
                    if MODEL_GENERATE_TIMEOUT in route.limits
                    else timeouts.generate,
                )
            )
        return cls(pools)

    def pool_named(self, name: str | None) -> ModelPool | None:
        """The pool a configured id or alias names (None: the default); no engine is asked."""
        if name is None:
            return self.default
        return self._by_name.get(name)

    async def resolve(self, requested: str | None) -> ResolvedModel:
        """The model for a request's `model` (an id, an alias, or absent: the default).

        Unknown names are a 404 `model_not_found`; EngineError when the pool's engines cannot
        be asked for the model's info.
        """
        pool = self.pool_named(requested)
        if pool is None and requested is not None and self.default.route.id is None:
            # One engine known by the id it reports (the --engine-address setting).
            info = await self.default.catalog.info()
            if requested == info.model_id:
                return ResolvedModel(self.default, info)
        if pool is None:
            raise model_not_found(requested or "", served=self.served_names())
        return ResolvedModel(pool, await pool.catalog.info())

    def served_names(self) -> list[str]:
        """Configured ids and aliases, and the engine-reported id of a pool without one (cached)."""
        names = []
        for pool in self.pools:
            info = pool.catalog.cached()
            if pool.route.id is None and info is not None:
                names.append(info.model_id)
            names.extend(pool.route.names())
        return names

    async def listing(self, *, timeout_s: float, strict: bool = False) -> list[PoolStatus]:
        """Every pool: whether its engines serve now (health), and its model info (the cached
        one when they cannot be asked now; None when it was never known). `strict`: when no
        pool's info is known at all, the default pool's EngineError is raised instead."""

        async def one(pool: ModelPool) -> PoolStatus:
            try:
                serving = await pool.engine.health(timeout=timeout_s)
                info = await pool.catalog.info() if serving else pool.catalog.cached()
            except EngineError:
                serving, info = False, pool.catalog.cached()
            return PoolStatus(pool, info, serving)

        statuses = list(await asyncio.gather(*(one(pool) for pool in self.pools)))
        if strict and all(status.info is None for status in statuses):
            info = await self.default.catalog.info()  # raises what keeps the engines from answering
            statuses[0] = PoolStatus(self.default, info, True)
        return statuses

    async def close(self) -> None:
        await asyncio.gather(*(pool.engine.close() for pool in self.pools), return_exceptions=True)
