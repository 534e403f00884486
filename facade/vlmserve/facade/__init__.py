"""OpenAI Responses API facade over the vlmserve engine (FastAPI)."""

from vlmserve.facade.app import create_app
from vlmserve.facade.settings import FacadeSettings, Limits, Timeouts
from vlmserve.facade.store.repositories import Store

__all__ = ["FacadeSettings", "Limits", "Store", "Timeouts", "create_app"]
