"""Unguessable object ids: OpenAI-style prefixes on 192 random bits."""

from __future__ import annotations

import secrets

RESPONSE = "resp"
MESSAGE = "msg"
REASONING = "rs"
FUNCTION_CALL = "fc"
CONVERSATION = "conv"
ITEM = "item"


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(24)}"
