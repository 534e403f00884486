"""Responses (SQLite and PostgreSQL alike): each with its resource, its raw input items exactly
as the client sent them (for `input_items`, images included) and its output items; and, for
replays, the raw contract messages its input and its output were translated to
(`message_codec`), images by content hash in `images`. A later turn replays those messages
instead of translating the items (and decoding their images) again, so a turn costs its own
items, not the whole chain's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from vlmserve.common.wire_encode import HeldMessages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.store.conversations import append_items
from vlmserve.facade.store.database import (
    Database,
    Transaction,
    batches,
    encoded_size,
    free_unused_images,
    json_value,
    messages_value,
    put_images,
)
from vlmserve.facade.store.events import append_events
from vlmserve.facade.store.leases import LeaseRepository
from vlmserve.facade.store.message_codec import (
    EncodedMessages,
    MessageCache,
    as_held,
    cacheable,
    encode_messages,
)
from vlmserve.facade.store.records import (
    ItemPage,
    MissingChainLinkError,
    Order,
    Replay,
    ResponseRecord,
    StoredEvent,
    StoredItem,
)


class ResponseRepository:
    def __init__(self, db: Database, leases: LeaseRepository) -> None:
        self._db = db
        # Whose a response stored now is (the facade instance running it).
        self._leases = leases

    async def put(
        self,
        record: ResponseRecord,
        input_items: Sequence[StoredItem],
        *,
        owner: str = "",
        conversation_id: str | None = None,
        input_messages: HeldMessages | Sequence[pb.Message] | None = None,
        max_stored_bytes: int | None = None,
    ) -> None:
        """Store a new response (any status) with its raw input items and, for replays, the
        contract messages they were translated to (None: replays translate the items again;
        `HeldMessages`: with the texts they hold apart, `TranslatedRequest.input_messages`).
        StorageQuotaExceededError (nothing stored) when the owner's bytes would pass
        `max_stored_bytes`."""
        await self._db.run(
            self._put, record, input_items, owner, conversation_id, input_messages, max_stored_bytes
        )

    async def update(self, record: ResponseRecord, *, owner: str = "") -> bool:
        """Replace a stored response's resource (its status, output, usage); False if it is gone.
        Its output messages are dropped: replays then translate its output items."""
        return await self._db.run(self._update, record, owner)

    async def cancel(self, response_id: str, *, owner: str = "") -> ResponseRecord | None:
        """Mark a stored background response `cancelled` if it is not over yet (the facade running
        it reads that and stops: responses/background.py), in one transaction, so an end written
        meanwhile is never overwritten; the resource as stored after. None: no such response.
        A response that is not a background one, or already over, is returned unchanged."""
        return await self._db.run(self._cancel, response_id, owner)

    async def finish(
        self,
        record: ResponseRecord | None,
        *,
        owner: str = "",
        output_messages: Sequence[pb.Message] | None = None,
        conversation_id: str | None = None,
        conversation_items: Sequence[StoredItem] = (),
        conversation_messages: HeldMessages | Sequence[pb.Message] | None = None,
        events: Sequence[StoredEvent] = (),
        conversation_model: str | None = None,
    ) -> None:
        """In one transaction: a response's final state (None: not stored) with the messages
        its output was translated to, its last streaming `events` (background responses: see
        `events.EventRepository.append`), and the items (and messages) it adds to its
        conversation (a conversation deleted meanwhile gets nothing), whose model becomes
        `conversation_model`."""
        await self._db.run(
            self._finish,
            record,
            owner,
            output_messages,
            conversation_id,
            conversation_items,
            conversation_messages,
            events,
            conversation_model,
        )

    async def get(self, response_id: str, *, owner: str = "") -> ResponseRecord | None:
        return await self._db.run(self._get, response_id, owner)

    async def delete(self, response_id: str, *, owner: str = "") -> bool:
        return await self._db.run(self._delete, response_id, owner)

    async def list_input_items(
        self,
        response_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None:
        """A page of a response's input items; None when the response is unknown. Reads only
        the page (and its cursor), however many items the response has."""
        return await self._db.run(self._list_input_items, response_id, after, limit, order, owner)

    async def replay(self, response_id: str, *, owner: str = "", max_depth: int = 256) -> Replay | None:
        """Everything the model saw and said up to and including `response_id`, oldest first.

        None when `response_id` is unknown; MissingChainLinkError when an older link was deleted.
        """
        return await self._db.run(self._replay, response_id, owner, max_depth)

    async def replay_items(
        self, response_id: str, *, owner: str = "", max_depth: int = 256
    ) -> list[StoredItem] | None:
        """The items of a chain, oldest first (what `replay` falls back to)."""
        return await self._db.run(self._replay_items_of, response_id, owner, max_depth)

    async def find_item(self, item_id: str, *, owner: str = "") -> StoredItem | None:
        """The most recently stored item with this id (for `item_reference`): the last one written
        to a response, else to a conversation (in insertion order)."""
        return await self._db.run(self._find_item, item_id, owner)

    # ---- in the database's worker thread ---------------------------------------------------

    def _put(
        self,
        record: ResponseRecord,
        input_items: Sequence[StoredItem],
        owner: str,
        conversation_id: str | None,
        input_messages: HeldMessages | Sequence[pb.Message] | None,
        max_stored_bytes: int | None,
    ) -> None:
        response_id = record.id
        resource_text = record.resource_text()
        with self._db.transaction() as tx:
            tx.execute(
                "INSERT INTO responses (id, owner, created_at, previous_response_id, conversation_id,"
                " resource, input_size, size, status, facade_id) VALUES (?, ?, ?, ?, ?, ?, 0, 0, ?, ?)",
                (
                    response_id,
                    owner,
                    record.created_at,
                    record.previous_response_id,
                    conversation_id,
                    resource_text,
                    record.status,
                    self._leases.instance_id,
                ),
            )
            # Each stored form is made just before its INSERT and gone after it: a 30 MiB input's
            # JSON and its serialized messages (and SQLite's copy of each) are never held together.
            input_size = _write_input_items(tx, response_id, input_items)
            output_size = _write_outputs(tx, record)
            messages_size = 0
            if input_messages is not None:
                messages_size = _write_response_messages(
                    tx, response_id, "input", encode_messages(input_messages)
                )
                # An empty output until the response finishes: the response replays either way.
                output_size += _write_response_messages(tx, response_id, "output", encode_messages([]))
            input_size += messages_size
            size = input_size + len(resource_text) + output_size
            tx.execute(
                "UPDATE responses SET input_size = ?, size = ? WHERE id = ?", (input_size, size, response_id)
            )
            tx.add_usage(owner, size, max_bytes=max_stored_bytes)
        if input_messages is not None:
            # Sized by what was stored: ByteSize() would serialize the messages once more. Copies:
            # the input's messages are the request's own, and would keep it whole.
            if cacheable(input_messages):
                owned = as_held(input_messages).owned()
                self._db.cache.put((response_id, "input"), owned, size=messages_size)
            self._db.cache.put((response_id, "output"), [], size=0)

    def _update(self, record: ResponseRecord, owner: str) -> bool:
        with self._db.transaction() as tx:
            updated = self._write_end(tx, record, owner, None)
        self._db.cache.drop((record.id, "output"))
        return updated

    def _finish(
        self,
        record: ResponseRecord | None,
        owner: str,
        output_messages: Sequence[pb.Message] | None,
        conversation_id: str | None,
        conversation_items: Sequence[StoredItem],
        conversation_messages: HeldMessages | Sequence[pb.Message] | None,
        events: Sequence[StoredEvent],
        conversation_model: str | None,
    ) -> None:
        encoded = encode_messages(output_messages) if output_messages is not None else None
        with self._db.transaction() as tx:
            if record is not None and events:
                append_events(self._db, tx, record.id, owner, events)
            updated = record is not None and self._write_end(tx, record, owner, encoded)
            if conversation_id is not None and conversation_items:
                append_items(
                    tx,
                    conversation_id,
                    owner,
                    conversation_items,
                    conversation_messages,
                    model=conversation_model,
                )
        if record is not None:
            if updated and output_messages is not None:
                assert encoded is not None
                self._db.cache.put((record.id, "output"), output_messages, size=encoded_size(encoded))
            else:
                self._db.cache.drop((record.id, "output"))

    def _write_end(
        self, tx: Transaction, record: ResponseRecord, owner: str, output: EncodedMessages | None
    ) -> bool:
        response_id = record.id
        rows = tx.execute(
            "SELECT input_size + events_size, size FROM responses"
            f" WHERE id = ? AND owner = ?{self._db.FOR_UPDATE}",
            (response_id, owner),
        ).fetchall()
        if not rows:
            return False
        input_size, old_size = rows[0]
        resource_text = record.resource_text()
        tx.execute(
            "UPDATE responses SET resource = ?, status = ? WHERE id = ?",
            (resource_text, record.status, response_id),
        )
        tx.execute("DELETE FROM response_items WHERE response_id = ? AND kind = 'output'", (response_id,))
        size = int(input_size) + len(resource_text) + _write_outputs(tx, record)
        if output is not None:
            size += _write_response_messages(tx, response_id, "output", output)
        else:
            tx.execute(
                "DELETE FROM response_messages WHERE response_id = ? AND kind = 'output'", (response_id,)
            )
        tx.execute("UPDATE responses SET size = ? WHERE id = ?", (size, response_id))
        tx.add_usage(owner, size - int(old_size))
        return True

    def _cancel(self, response_id: str, owner: str) -> ResponseRecord | None:
        with self._db.transaction() as tx:
            rows = tx.execute(
                f"SELECT resource FROM responses WHERE id = ? AND owner = ?{self._db.FOR_UPDATE}",
                (response_id, owner),
            ).fetchall()
            if not rows:
                return None
            stored = ResponseRecord.from_row(rows[0][0])
            if not stored.cancellable:
                return stored
            cancelled = stored.ended("cancelled")
            self._write_end(tx, cancelled, owner, None)
        self._db.cache.drop((response_id, "output"))
        return cancelled

    def _get(self, response_id: str, owner: str) -> ResponseRecord | None:
        rows = self._db.query(
            "SELECT resource FROM responses WHERE id = ? AND owner = ?", (response_id, owner)
        )
        return ResponseRecord.from_row(rows[0][0]) if rows else None

    def _delete(self, response_id: str, owner: str) -> bool:
        with self._db.transaction(frees_images=True) as tx:
            deleted = delete_responses(tx, self._db.cache, [(response_id, owner)])
        if deleted:
            self._db.vacuum()
        return deleted > 0

    def _list_input_items(
        self, response_id: str, after: str | None, limit: int, order: Order, owner: str
    ) -> ItemPage | None:
        if self._get(response_id, owner) is None:
            return None
        return self._db.page(
            "response_items", "response_id = ? AND kind = 'input'", (response_id,), after, limit, order
        )

    def _chain(self, response_id: str, owner: str, max_depth: int) -> list[str] | None:
        """The ids of a `previous_response_id` chain, newest first (at most `max_depth`)."""
        rows = self._db.query(
            "WITH RECURSIVE chain(id, previous, depth) AS ("
            " SELECT id, previous_response_id, 1 FROM responses WHERE id = ? AND owner = ?"
            " UNION ALL"
            " SELECT r.id, r.previous_response_id, c.depth + 1 FROM responses r"
            " JOIN chain c ON r.id = c.previous AND r.owner = ? WHERE c.depth < ?"
            ") SELECT id, previous, depth FROM chain ORDER BY depth",
            (response_id, owner, owner, max_depth),
        )
        if not rows:
            return None
        _, previous, depth = rows[-1]
        if previous is not None and depth < max_depth:
            raise MissingChainLinkError(previous)
        return [row[0] for row in rows]

    def _replay(self, response_id: str, owner: str, max_depth: int) -> Replay | None:
        db = self._db
        chain = self._chain(response_id, owner, max_depth)
        if chain is None:
            return None
        links = list(reversed(chain))
        keys = [(link, kind) for link in links for kind in ("input", "output")]
        found: dict[tuple[str, str], list[pb.Message]] = {}
        for key in keys:
            cached = db.cache.get(key)
            if cached is not None:
                found[key] = cached
        missing = sorted(
            {link for link, _ in keys if (link, "input") not in found or (link, "output") not in found}
        )
        stored: dict[tuple[str, str], tuple[bytes, list[str]]] = {}
        for batch in batches(missing):
            marks = ",".join("?" * len(batch))
            for link, kind, blob, hashes in db.query(
                "SELECT response_id, kind, messages, images FROM response_messages"
                f" WHERE response_id IN ({marks})",
                batch,
            ):
                stored[(link, kind)] = (bytes(blob), json.loads(hashes))
        wanted = [key for key in keys if key not in found]
        if any(key not in stored for key in wanted):
            return Replay(items=self._replay_items(links))
        for key, messages in zip(wanted, db.decode([stored[key] for key in wanted]), strict=True):
            # An empty output is what a response still running (maybe in another facade) has:
            # not cached, so its real output is read once it is there.
            if messages:
                db.cache.put(key, messages)
            found[key] = messages
        return Replay(messages=[message for key in keys for message in found[key]])

    def _replay_items_of(self, response_id: str, owner: str, max_depth: int) -> list[StoredItem] | None:
        chain = self._chain(response_id, owner, max_depth)
        return None if chain is None else self._replay_items(list(reversed(chain)))

    def _replay_items(self, links: Sequence[str]) -> list[StoredItem]:
        items: list[StoredItem] = []
        for link in links:
            rows = self._db.query(
                "SELECT item_id, item FROM response_items WHERE response_id = ?"
                " ORDER BY CASE kind WHEN 'input' THEN 0 ELSE 1 END, position",
                (link,),
            )
            items.extend(StoredItem.from_row(item_id, item) for item_id, item in rows)
        return items

    def _find_item(self, item_id: str, owner: str) -> StoredItem | None:
        order = self._db.INSERT_ORDER
        rows = self._db.query(
            "SELECT i.item FROM response_items i JOIN responses r ON r.id = i.response_id"
            f" WHERE i.item_id = ? AND r.owner = ? ORDER BY i.{order} DESC LIMIT 1",
            (item_id, owner),
        )
        if not rows:
            rows = self._db.query(
                "SELECT i.item FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id"
                f" WHERE i.item_id = ? AND c.owner = ? ORDER BY i.{order} DESC LIMIT 1",
                (item_id, owner),
            )
        return StoredItem.from_row(item_id, rows[0][0]) if rows else None


def delete_responses(tx: Transaction, cache: MessageCache, keys: Iterable[tuple[str, str]]) -> int:
    """Delete responses by (id, owner), keeping `usage` right and freeing unused images."""
    deleted = 0
    hashes: set[str] = set()
    for response_id, owner in keys:
        used = tx.execute("SELECT hash FROM response_images WHERE response_id = ?", (response_id,))
        hashes.update(digest for (digest,) in used.fetchall())
        rows = tx.execute(
            "DELETE FROM responses WHERE id = ? AND owner = ? RETURNING size", (response_id, owner)
        ).fetchall()
        if rows:
            deleted += 1
            tx.add_usage(owner, -int(rows[0][0]))
            cache.forget(response_id)
    # The cascade removed their response_images rows: free what nothing else uses.
    free_unused_images(tx, hashes)
    return deleted


def _write_outputs(tx: Transaction, record: ResponseRecord) -> int:
    rows = [
        (record.id, i, stored.id, json.dumps(stored.item)) for i, stored in enumerate(record.output_items())
    ]
    tx.executemany(
        "INSERT INTO response_items (response_id, kind, position, item_id, item)"
        " VALUES (?, 'output', ?, ?, ?)",
        rows,
    )
    return sum(len(row[3]) for row in rows)


def _write_input_items(tx: Transaction, response_id: str, items: Sequence[StoredItem]) -> int:
    """A new response's input items, each serialized just before its row is written; their size."""
    size = 0
    for position, stored in enumerate(items):
        # In pieces: a 30 MiB input's JSON is never made whole (`json_value`).
        value = json_value(stored.item)
        tx.insert_large(
            "INSERT INTO response_items (response_id, kind, position, item_id, item)"
            " VALUES (?, 'input', ?, ?, {value})",
            (response_id, position, stored.id),
            value,
            table="response_items",
            column="item",
        )
        size += value.size
    return size


def _write_response_messages(tx: Transaction, response_id: str, kind: str, encoded: EncodedMessages) -> int:
    tx.insert_large(
        "INSERT INTO response_messages (response_id, kind, images, messages) VALUES (?, ?, ?, {value})"
        " ON CONFLICT (response_id, kind)"
        " DO UPDATE SET messages = excluded.messages, images = excluded.images",
        (response_id, kind, json.dumps(encoded.image_hashes)),
        messages_value(encoded),
        table="response_messages",
        column="messages",
    )
    put_images(tx, encoded.images)
    tx.executemany(
        "INSERT INTO response_images (response_id, hash) VALUES (?, ?) ON CONFLICT DO NOTHING",
        [(response_id, digest) for digest in encoded.images],
    )
    return encoded_size(encoded)
