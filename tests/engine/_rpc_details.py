"""What a refused engine call's google.rpc.Status details name (the engine's errors: request_errors.py)."""

from __future__ import annotations

from typing import Any

from google.rpc import error_details_pb2


def field_violations(status: Any) -> list[str]:
    """The fields the status's BadRequest details name, in order."""
    fields = []
    for detail in status.details:
        bad_request = error_details_pb2.BadRequest()
        if detail.Unpack(bad_request):
            fields += [violation.field for violation in bad_request.field_violations]
    return fields
