"""OpenAI Responses API facade over the vlmserve engine (FastAPI)."""

from .app import create_app
from .settings import FacadeSettings, Limits, Timeouts
from .store import ResponseStore

__all__ = ["FacadeSettings", "Limits", "ResponseStore", "Timeouts", "create_app"]
