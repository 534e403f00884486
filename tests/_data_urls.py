"""`data:` URLs of bytes, as clients send images and files inline."""

from __future__ import annotations

import base64


def data_url(data: bytes, media_type: str | None = "image/png") -> str:
    """`data:<media_type>;base64,...`; no media type (None) gives `data:;base64,...`."""
    return f"data:{media_type or ''};base64,{base64.b64encode(data).decode('ascii')}"
