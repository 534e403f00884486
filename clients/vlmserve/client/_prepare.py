"""What every call does to its request before it leaves: optional lowering, auth metadata."""

from __future__ import annotations

from vlmserve.engine.v1 import engine_pb2 as pb


def prepare_request(request: pb.GenerateRequest, *, lower: bool) -> pb.GenerateRequest:
    """Apply the image follow-up lowering when asked (the engine accepts images in user turns only)."""
    if not lower:
        return request
    # Imported here: the lowering lives with the Responses translation, which the client shares.
    from vlmserve.responses import lower_messages

    lowered = pb.GenerateRequest()
    lowered.CopyFrom(request)
    del lowered.messages[:]
    lowered.messages.extend(lower_messages(request.messages))
    return lowered


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    return (("authorization", f"Bearer {token}"),) if token else ()
