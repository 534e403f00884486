"""OpenAI Responses API facade over the vlmserve engine (FastAPI)."""

# First: gRPC's environment, before anything imports grpc (`vlmserve-facade` imports this
# package before its cli module; grpc_env.py).
import vlmserve.server.grpc_env  # noqa: F401

# isort: split

from vlmserve.facade.app import create_app
from vlmserve.facade.settings import FacadeSettings, Limits, Timeouts
from vlmserve.facade.store.repositories import Store

__all__ = ["FacadeSettings", "Limits", "Store", "Timeouts", "create_app"]
