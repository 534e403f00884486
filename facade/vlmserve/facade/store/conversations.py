"""Conversations (SQLite and PostgreSQL alike): their items, the contract messages those were
translated to (for replays), sizes and quotas.

Positions come from a per-conversation counter that only grows, so a batch of messages is named
by (conversation, position) for good: every facade sharing the store may cache it under that.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

from vlmserve.common.wire_encode import HeldMessages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.store.database import (
    Database,
    Transaction,
    encoded_size,
    free_unused_images,
    json_value,
    messages_value,
    put_images,
)
from vlmserve.facade.store.message_codec import as_held, cacheable, encode_messages
from vlmserve.facade.store.records import ConversationRecord, ItemPage, Order, Replay, StoredItem


class ConversationRepository:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(
        self,
        conversation_id: str,
        *,
        metadata: dict[str, str],
        items: Sequence[StoredItem] = (),
        messages: Sequence[pb.Message] | None = None,
        owner: str = "",
        max_stored_bytes: int | None = None,
        model: str | None = None,
    ) -> ConversationRecord:
        """A new conversation, with its first items (and the messages they were translated to)
        and the model its responses continue with; StorageQuotaExceededError (nothing stored)
        past `max_stored_bytes`."""
        return await self._db.run(
            self._create, conversation_id, metadata, items, messages, owner, max_stored_bytes, model
        )

    async def get(self, conversation_id: str, *, owner: str = "") -> ConversationRecord | None:
        return await self._db.run(self._get, conversation_id, owner)

    async def update(
        self, conversation_id: str, *, metadata: dict[str, str], owner: str = ""
    ) -> ConversationRecord | None:
        """Replace a conversation's metadata; None when it is gone."""
        return await self._db.run(self._update, conversation_id, metadata, owner)

    async def delete(self, conversation_id: str, *, owner: str = "") -> bool:
        return await self._db.run(self._delete, conversation_id, owner)

    async def get_item(self, conversation_id: str, item_id: str, *, owner: str = "") -> StoredItem | None:
        return await self._db.run(self._get_item, conversation_id, item_id, owner)

    async def delete_item(self, conversation_id: str, item_id: str, *, owner: str = "") -> bool:
        """Remove one item. The stored contract messages of the batch it was added with go too:
        the conversation then replays by translating its raw items (see `replay`)."""
        return await self._db.run(self._delete_item, conversation_id, item_id, owner)

    async def list_items(
        self,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None:
        """A page of a conversation's items; reads only that page (and its cursor)."""
        return await self._db.run(self._list_items, conversation_id, after, limit, order, owner)

    async def append(
        self,
        conversation_id: str,
        items: Sequence[StoredItem],
        *,
        messages: Sequence[pb.Message] | None = None,
        owner: str = "",
        max_stored_bytes: int | None = None,
    ) -> bool:
        """Add items (and the contract messages they were translated to) at the end of a
        conversation; False when it is gone. StorageQuotaExceededError (nothing added) when the
        owner's bytes would pass `max_stored_bytes`."""
        return await self._db.run(self._append, conversation_id, items, messages, owner, max_stored_bytes)

    async def replay(self, conversation_id: str, *, owner: str = "") -> Replay | None:
        """A conversation's items, oldest first: as contract messages when every item has them
        (items added by older versions have not), else as raw items."""
        return await self._db.run(self._replay, conversation_id, owner)

    async def size(self, conversation_id: str, *, owner: str = "") -> int | None:
        """The bytes a conversation takes (what `--max-conversation-bytes` bounds); None if gone."""
        return await self._db.run(self._size, conversation_id, owner)

    # ---- in the database's worker thread ---------------------------------------------------

    def _create(
        self,
        conversation_id: str,
        metadata: dict[str, str],
        items: Sequence[StoredItem],
        messages: Sequence[pb.Message] | None,
        owner: str,
        max_stored_bytes: int | None,
        model: str | None,
    ) -> ConversationRecord:
        record = ConversationRecord(conversation_id, int(time.time()), metadata, model)
        metadata_text = record.metadata_text()
        with self._db.transaction() as tx:
            tx.execute(
                "INSERT INTO conversations (id, owner, created_at, metadata, size, model)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, owner, record.created_at, metadata_text, len(metadata_text), model),
            )
            tx.add_usage(owner, len(metadata_text), max_bytes=max_stored_bytes)
            if items:
                append_items(tx, conversation_id, owner, items, messages)
        return record

    def _get(self, conversation_id: str, owner: str) -> ConversationRecord | None:
        rows = self._db.query(
            "SELECT created_at, metadata, model FROM conversations WHERE id = ? AND owner = ?",
            (conversation_id, owner),
        )
        return ConversationRecord.from_row(conversation_id, *rows[0]) if rows else None

    def _delete(self, conversation_id: str, owner: str) -> bool:
        with self._db.transaction(frees_images=True) as tx:
            used = tx.execute(
                "SELECT hash FROM conversation_images WHERE conversation_id = ?", (conversation_id,)
            )
            hashes = {digest for (digest,) in used.fetchall()}
            rows = tx.execute(
                "DELETE FROM conversations WHERE id = ? AND owner = ? RETURNING size",
                (conversation_id, owner),
            ).fetchall()
            if rows:
                tx.add_usage(owner, -int(rows[0][0]))
                free_unused_images(tx, hashes)
        self._db.cache.forget(conversation_id)
        if rows:
            self._db.vacuum()
        return bool(rows)

    def _update(
        self, conversation_id: str, metadata: dict[str, str], owner: str
    ) -> ConversationRecord | None:
        with self._db.transaction() as tx:
            rows = tx.execute(
                "SELECT created_at, metadata, model FROM conversations"
                f" WHERE id = ? AND owner = ?{self._db.FOR_UPDATE}",
                (conversation_id, owner),
            ).fetchall()
            if not rows:
                return None
            created_at, old_metadata, model = rows[0]
            updated = ConversationRecord(conversation_id, int(created_at), metadata, model)
            metadata_text = updated.metadata_text()
            change = len(metadata_text) - len(old_metadata)
            tx.execute(
                "UPDATE conversations SET metadata = ?, size = size + ? WHERE id = ?",
                (metadata_text, change, conversation_id),
            )
            tx.add_usage(owner, change)
        return updated

    def _get_item(self, conversation_id: str, item_id: str, owner: str) -> StoredItem | None:
        rows = self._db.query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id"
            " WHERE i.conversation_id = ? AND i.item_id = ? AND c.owner = ? ORDER BY i.position LIMIT 1",
            (conversation_id, item_id, owner),
        )
        return StoredItem.from_row(item_id, rows[0][0]) if rows else None

    def _delete_item(self, conversation_id: str, item_id: str, owner: str) -> bool:
        with self._db.transaction() as tx:
            if not self._lock(tx, conversation_id, owner):
                return False
            rows = tx.execute(
                "SELECT position, length(item) FROM conversation_items"
                " WHERE conversation_id = ? AND item_id = ? ORDER BY position LIMIT 1",
                (conversation_id, item_id),
            ).fetchall()
            if not rows:
                return False
            position, size = rows[0]
            tx.execute(
                "DELETE FROM conversation_items WHERE conversation_id = ? AND position = ?",
                (conversation_id, position),
            )
            chunks = tx.execute(
                "DELETE FROM conversation_messages WHERE conversation_id = ? AND position <= ?"
                " AND position + item_count > ? RETURNING length(messages)",
                (conversation_id, position, position),
            ).fetchall()
            size = int(size) + sum(int(length) for (length,) in chunks)
            tx.execute(
                "UPDATE conversations SET size = CASE WHEN size > ? THEN size - ? ELSE 0 END WHERE id = ?",
                (size, size, conversation_id),
            )
            tx.add_usage(owner, -size)
        self._db.cache.forget(conversation_id)
        return True

    def _list_items(
        self, conversation_id: str, after: str | None, limit: int, order: Order, owner: str
    ) -> ItemPage | None:
        if self._get(conversation_id, owner) is None:
            return None
        return self._db.page(
            "conversation_items", "conversation_id = ?", (conversation_id,), after, limit, order
        )

    def _append(
        self,
        conversation_id: str,
        items: Sequence[StoredItem],
        messages: Sequence[pb.Message] | None,
        owner: str,
        max_stored_bytes: int | None,
    ) -> bool:
        with self._db.transaction() as tx:
            return append_items(tx, conversation_id, owner, items, messages, max_stored_bytes)

    def _lock(self, tx: Transaction, conversation_id: str, owner: str) -> bool:
        rows = tx.execute(
            f"SELECT 1 FROM conversations WHERE id = ? AND owner = ?{self._db.FOR_UPDATE}",
            (conversation_id, owner),
        ).fetchall()
        return bool(rows)

    def _replay(self, conversation_id: str, owner: str) -> Replay | None:
        db = self._db
        if self._get(conversation_id, owner) is None:
            return None
        chunks = db.query(
            "SELECT position, item_count FROM conversation_messages"
            " WHERE conversation_id = ? ORDER BY position",
            (conversation_id,),
        )
        (count,) = db.query(
            "SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
        )[0]
        if sum(int(item_count) for _, item_count in chunks) != int(count):
            rows = db.query(
                "SELECT item_id, item FROM conversation_items WHERE conversation_id = ? ORDER BY position",
                (conversation_id,),
            )
            return Replay(items=[StoredItem.from_row(item_id, item) for item_id, item in rows])
        keys = [(conversation_id, str(position)) for position, _ in chunks]
        found = {key: cached for key in keys if (cached := db.cache.get(key)) is not None}
        wanted = [key for key in keys if key not in found]
        stored: dict[tuple[str, str], tuple[bytes, list[str]]] = {}
        if wanted:
            rows = db.query(
                "SELECT position, messages, images FROM conversation_messages"
                " WHERE conversation_id = ? AND position >= ?",
                (conversation_id, min(int(position) for _, position in wanted)),
            )
            stored = {
                (conversation_id, str(position)): (bytes(blob), json.loads(hashes))
                for position, blob, hashes in rows
            }
        if any(key not in stored for key in wanted):
            # Changed by another facade between the two reads: read it all again.
            return self._replay(conversation_id, owner)
        for key, messages in zip(wanted, db.decode([stored[key] for key in wanted]), strict=True):
            db.cache.put(key, messages)
            found[key] = messages
        return Replay(messages=[message for key in keys for message in found[key]])

    def _size(self, conversation_id: str, owner: str) -> int | None:
        rows = self._db.query(
            "SELECT size FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
        )
        return int(rows[0][0]) if rows else None


def append_items(
    tx: Transaction,
    conversation_id: str,
    owner: str,
    items: Sequence[StoredItem],
    messages: HeldMessages | Sequence[pb.Message] | None,
    max_stored_bytes: int | None = None,
    model: str | None = None,
) -> bool:
    """`ConversationRepository.append` inside a transaction of another write (a response's end,
    a new conversation). `model`: the model whose response added these items, now the
    conversation's (None: added by the client, the conversation's model stays). `messages` may
    hold a request's texts apart (`HeldMessages`)."""
    # Positions come from a counter that only grows: one a deleted item had is never given
    # again, so a chunk's (conversation, position) names the same messages in every facade's cache.
    rows = tx.execute(
        "UPDATE conversations SET next_position = next_position + ?, model = COALESCE(?, model)"
        " WHERE id = ? AND owner = ? RETURNING next_position",
        (len(items), model, conversation_id, owner),
    ).fetchall()
    if not rows:
        return False
    start = int(rows[0][0]) - len(items)
    size = 0
    for index, stored in enumerate(items):
        # In pieces: a 30 MiB input's JSON is never made whole (`json_value`).
        value = json_value(stored.item)
        tx.insert_large(
            "INSERT INTO conversation_items (conversation_id, position, item_id, item)"
            " VALUES (?, ?, ?, {value})",
            (conversation_id, start + index, stored.id),
            value,
            table="conversation_items",
            column="item",
        )
        size += value.size
    if messages is not None:
        encoded = encode_messages(messages)
        tx.insert_large(
            "INSERT INTO conversation_messages (conversation_id, position, item_count, images, messages)"
            " VALUES (?, ?, ?, ?, {value})",
            (conversation_id, start, len(items), json.dumps(encoded.image_hashes)),
            messages_value(encoded),
            table="conversation_messages",
            column="messages",
        )
        put_images(tx, encoded.images)
        tx.executemany(
            "INSERT INTO conversation_images (conversation_id, hash) VALUES (?, ?) ON CONFLICT DO NOTHING",
            [(conversation_id, digest) for digest in encoded.images],
        )
        size += encoded_size(encoded)
        # For the cache, once the transaction has committed.
        if cacheable(messages):
            plain = as_held(messages).plain()
            tx.appended.append(((conversation_id, str(start)), plain, encoded_size(encoded)))
    tx.execute("UPDATE conversations SET size = size + ? WHERE id = ?", (size, conversation_id))
    tx.add_usage(owner, size, max_bytes=max_stored_bytes)
    return True
