"""The vendored Open Responses schema (tests/data/openresponses-openapi.json) is checked on its
own, so a fresh clone without ../shared still tests it: it is the committed copy (digest), a
well-formed OpenAPI 3.1 document whose every schema is valid JSON Schema and every `$ref`
resolves, and it has every schema the tests validate against. Where ../shared exists, it must
equal the team's reference copy."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import pytest

from tests._openresponses import EVENT_SCHEMAS, SHARED_SPEC_PATH, SPEC_PATH, spec

DIGEST_PATH = SPEC_PATH.with_name(SPEC_PATH.name + ".sha256")
# Schemas tests validate against besides the streaming events.
USED_SCHEMAS = {
    "ResponseResource",
    "Usage",
    "Message",
    "FunctionCall",
    "FunctionCallOutputItemParam",
    "InputImageContent",
}


def test_the_vendored_schema_is_the_committed_copy() -> None:
    digest = hashlib.sha256(SPEC_PATH.read_bytes()).hexdigest()
    assert digest == DIGEST_PATH.read_text().strip(), (
        "tests/data/openresponses-openapi.json changed: copy it from ../shared/specs unchanged and "
        "write its sha256 to tests/data/openresponses-openapi.json.sha256"
    )


def test_the_vendored_schema_is_well_formed_openapi() -> None:
    document = spec()
    assert re.fullmatch(r"3\.1\.\d+", document["openapi"])
    assert document["paths"] and document["info"]["title"]
    schemas = document["components"]["schemas"]
    for schema in schemas.values():
        jsonschema.Draft202012Validator.check_schema(schema)
    unresolved = sorted({ref for ref in _refs(document) if not _resolves(document, ref)})
    assert not unresolved, unresolved


def test_every_schema_the_tests_use_is_there() -> None:
    schemas = spec()["components"]["schemas"]
    missing = sorted((set(EVENT_SCHEMAS.values()) | USED_SCHEMAS) - set(schemas))
    assert not missing, missing


def test_vendored_schema_matches_shared() -> None:
    if not SHARED_SPEC_PATH.exists():
        pytest.skip("no ../shared beside the repo (a fresh clone): the checks above cover the copy")
    assert SPEC_PATH.read_bytes() == SHARED_SPEC_PATH.read_bytes()


def _refs(node: Any) -> Iterator[str]:
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from _refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from _refs(item)


def _resolves(document: dict[str, Any], ref: str) -> bool:
    if not ref.startswith("#/"):
        return False  # the copy must stand alone
    node: Any = document
    for part in ref[2:].split("/"):
        part = part.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True
