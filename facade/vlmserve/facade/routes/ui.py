"""`GET /ui`: a page to try the server in a browser — pick a model, ask, attach an image or a PDF,
watch the answer stream with its usage and timing, see readiness and the models served.

Three static files (ui_files/: HTML, CSS, plain JavaScript), no build step and nothing fetched
from elsewhere at run time: the Content-Security-Policy allows this origin only. The page holds
no data; everything it shows comes from the API it calls (`/readyz`, `/v1/models`,
`POST /v1/responses` streamed), with the same API key as any client (asked for on a 401, kept
in the tab's sessionStorage), so it is served without one.
"""

from __future__ import annotations

from functools import cache
from importlib import resources

from fastapi import APIRouter
from fastapi.responses import RedirectResponse, Response

router = APIRouter(include_in_schema=False)

_FILES = {"index.html": "text/html", "ui.css": "text/css", "ui.js": "text/javascript"}
_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data: blob:; connect-src 'self'; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


@cache
def _read(name: str) -> bytes:
    return resources.files("vlmserve.facade.routes").joinpath("ui_files", name).read_bytes()


def _file(name: str) -> Response:
    return Response(_read(name), media_type=f"{_FILES[name]}; charset=utf-8", headers=_HEADERS)


@router.get("/")
async def root() -> RedirectResponse:
    return RedirectResponse("/ui", status_code=307)


@router.get("/ui")
async def page() -> Response:
    return _file("index.html")


@router.get("/ui/{name}")
async def asset(name: str) -> Response:
    if name not in _FILES or name == "index.html":
        return Response(status_code=404)
    return _file(name)
