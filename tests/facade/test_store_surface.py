"""The store's surface is async repositories that leave the event loop themselves (issue 20.4):
callers await them; nothing outside the store hands store work to a thread."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

from vlmserve.facade.store.conversations import ConversationRepository
from vlmserve.facade.store.events import EventRepository
from vlmserve.facade.store.files import FileRepository
from vlmserve.facade.store.leases import LeaseRepository
from vlmserve.facade.store.repositories import Store
from vlmserve.facade.store.responses import ResponseRepository

PACKAGE = Path(__file__).resolve().parents[2] / "facade" / "vlmserve" / "facade"
# The blocking methods kept, each with its reason.
BLOCKING = {
    (Store, "close"),  # at shutdown, after every request
    (FileRepository, "read_blocking"),  # for the translation, already on a worker thread
}
# Work handed to a thread outside the store: not the store's.
THREADS_OUTSIDE_THE_STORE = {
    "http/request_body.py",  # parsing a large JSON body
    "routes/files.py",  # sniffing an upload's content
}


@pytest.mark.parametrize(
    "repository",
    [Store, ResponseRepository, ConversationRepository, EventRepository, LeaseRepository, FileRepository],
)
def test_every_public_method_is_a_coroutine(repository: type) -> None:
    for name, member in vars(repository).items():
        if name.startswith("_") or not inspect.isfunction(member) or (repository, name) in BLOCKING:
            continue
        assert inspect.iscoroutinefunction(member), f"{repository.__name__}.{name} blocks"


def test_no_module_outside_the_store_sends_work_to_a_thread_but_the_known_ones() -> None:
    found = set()
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("store/"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "to_thread":
                found.add(relative)
    assert found == THREADS_OUTSIDE_THE_STORE
