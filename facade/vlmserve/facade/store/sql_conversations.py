"""Conversations in the SQL stores (SQLite and PostgreSQL alike): their items, the contract
messages those were translated to (for replays), sizes and quotas.

Positions come from a per-conversation counter that only grows, so a batch of messages is named
by (conversation, position) for good: every facade sharing the store may cache it under that.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.store.message_codec import encode_messages
from vlmserve.facade.store.protocol import ItemPage, Order, Replay, StoredItem
from vlmserve.facade.store.sql_backend import (
    SQLBase,
    Transaction,
    encoded_size,
    free_unused_images,
    put_images,
)


class ConversationQueries(SQLBase):
    def create_conversation(
        self,
        conversation_id: str,
        *,
        metadata: dict[str, str],
        items: Sequence[StoredItem] = (),
        messages: Sequence[pb.Message] | None = None,
        owner: str = "",
        max_stored_bytes: int | None = None,
        model: str | None = None,
    ) -> dict[str, Any]:
        created_at = int(time.time())
        metadata_text = json.dumps(metadata)
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO conversations (id, owner, created_at, metadata, size, model)"
                " VALUES (?, ?, ?, ?, ?, ?)",
                (conversation_id, owner, created_at, metadata_text, len(metadata_text), model),
            )
            tx.add_usage(owner, len(metadata_text), max_bytes=max_stored_bytes)
            if items:
                self._append(tx, conversation_id, owner, items, messages)
        return _conversation_object(conversation_id, created_at, metadata, model)

    def get_conversation(self, conversation_id: str, *, owner: str = "") -> dict[str, Any] | None:
        rows = self._query(
            "SELECT created_at, metadata, model FROM conversations WHERE id = ? AND owner = ?",
            (conversation_id, owner),
        )
        if not rows:
            return None
        created_at, metadata, model = rows[0]
        return _conversation_object(conversation_id, created_at, json.loads(metadata), model)

    def delete_conversation(self, conversation_id: str, *, owner: str = "") -> bool:
        with self._transaction(frees_images=True) as tx:
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
        self._cache.forget(conversation_id)
        if rows:
            self._vacuum()
        return bool(rows)

    def update_conversation(
        self, conversation_id: str, *, metadata: dict[str, str], owner: str = ""
    ) -> dict[str, Any] | None:
        """Replace a conversation's metadata; None when it is gone."""
        metadata_text = json.dumps(metadata)
        with self._transaction() as tx:
            rows = tx.execute(
                "SELECT created_at, metadata, model FROM conversations"
                f" WHERE id = ? AND owner = ?{self.FOR_UPDATE}",
                (conversation_id, owner),
            ).fetchall()
            if not rows:
                return None
            change = len(metadata_text) - len(rows[0][1])
            tx.execute(
                "UPDATE conversations SET metadata = ?, size = size + ? WHERE id = ?",
                (metadata_text, change, conversation_id),
            )
            tx.add_usage(owner, change)
        return _conversation_object(conversation_id, rows[0][0], metadata, rows[0][2])

    def get_conversation_item(
        self, conversation_id: str, item_id: str, *, owner: str = ""
    ) -> StoredItem | None:
        rows = self._query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id"
            " WHERE i.conversation_id = ? AND i.item_id = ? AND c.owner = ? ORDER BY i.position LIMIT 1",
            (conversation_id, item_id, owner),
        )
        return StoredItem(item_id, json.loads(rows[0][0])) if rows else None

    def delete_conversation_item(self, conversation_id: str, item_id: str, *, owner: str = "") -> bool:
        """Remove one item. The stored contract messages of the batch it was added with go too:
        the conversation then replays by translating its raw items (see conversation_replay)."""
        with self._transaction() as tx:
            if not self._lock_conversation(tx, conversation_id, owner):
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
        self._cache.forget(conversation_id)
        return True

    def list_conversation_items(
        self,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int = 20,
        order: Order = "desc",
        owner: str = "",
    ) -> ItemPage | None:
        """A page of a conversation's items; reads only that page (and its cursor)."""
        if self.get_conversation(conversation_id, owner=owner) is None:
            return None
        return self._page(
            "conversation_items", "conversation_id = ?", (conversation_id,), after, limit, order
        )

    def append_conversation_items(
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
        with self._transaction() as tx:
            return self._append(tx, conversation_id, owner, items, messages, max_stored_bytes)

    def _lock_conversation(self, tx: Transaction, conversation_id: str, owner: str) -> bool:
        rows = tx.execute(
            f"SELECT 1 FROM conversations WHERE id = ? AND owner = ?{self.FOR_UPDATE}",
            (conversation_id, owner),
        ).fetchall()
        return bool(rows)

    def _append(
        self,
        tx: Transaction,
        conversation_id: str,
        owner: str,
        items: Sequence[StoredItem],
        messages: Sequence[pb.Message] | None,
        max_stored_bytes: int | None = None,
        model: str | None = None,
    ) -> bool:
        """`model`: the model whose response added these items, now the conversation's (None:
        added by the client, the conversation's model stays)."""
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
        item_rows = [(conversation_id, start + i, s.id, json.dumps(s.item)) for i, s in enumerate(items)]
        tx.executemany(
            "INSERT INTO conversation_items (conversation_id, position, item_id, item) VALUES (?, ?, ?, ?)",
            item_rows,
        )
        size = sum(len(row[3]) for row in item_rows)
        if messages is not None:
            encoded = encode_messages(messages)
            tx.execute(
                "INSERT INTO conversation_messages (conversation_id, position, item_count, messages, images)"
                " VALUES (?, ?, ?, ?, ?)",
                (conversation_id, start, len(items), encoded.blob, json.dumps(encoded.image_hashes)),
            )
            put_images(tx, encoded.images)
            tx.executemany(
                "INSERT INTO conversation_images (conversation_id, hash) VALUES (?, ?)"
                " ON CONFLICT DO NOTHING",
                [(conversation_id, digest) for digest in encoded.images],
            )
            size += encoded_size(encoded)
            # For the cache, once the transaction has committed.
            tx.appended.append(((conversation_id, str(start)), messages))
        tx.execute("UPDATE conversations SET size = size + ? WHERE id = ?", (size, conversation_id))
        tx.add_usage(owner, size, max_bytes=max_stored_bytes)
        return True

    def conversation_replay(self, conversation_id: str, *, owner: str = "") -> Replay | None:
        """A conversation's items, oldest first: as contract messages when every item has them
        (items added by older versions have not), else as raw items."""
        if self.get_conversation(conversation_id, owner=owner) is None:
            return None
        chunks = self._query(
            "SELECT position, item_count FROM conversation_messages"
            " WHERE conversation_id = ? ORDER BY position",
            (conversation_id,),
        )
        (count,) = self._query(
            "SELECT COUNT(*) FROM conversation_items WHERE conversation_id = ?", (conversation_id,)
        )[0]
        if sum(int(item_count) for _, item_count in chunks) != int(count):
            items = self._query(
                "SELECT item FROM conversation_items WHERE conversation_id = ? ORDER BY position",
                (conversation_id,),
            )
            return Replay(items=[json.loads(item) for (item,) in items])
        keys = [(conversation_id, str(position)) for position, _ in chunks]
        found = {key: cached for key in keys if (cached := self._cache.get(key)) is not None}
        wanted = [key for key in keys if key not in found]
        stored: dict[tuple[str, str], tuple[bytes, list[str]]] = {}
        if wanted:
            rows = self._query(
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
            return self.conversation_replay(conversation_id, owner=owner)
        for key, messages in zip(wanted, self._decode([stored[key] for key in wanted]), strict=True):
            self._cache.put(key, messages)
            found[key] = messages
        return Replay(messages=[message for key in keys for message in found[key]])

    def conversation_bytes(self, conversation_id: str, *, owner: str = "") -> int | None:
        rows = self._query(
            "SELECT size FROM conversations WHERE id = ? AND owner = ?", (conversation_id, owner)
        )
        return int(rows[0][0]) if rows else None


def _conversation_object(
    conversation_id: str, created_at: int, metadata: dict[str, str], model: str | None
) -> dict[str, Any]:
    conversation: dict[str, Any] = {
        "id": conversation_id,
        "object": "conversation",
        "created_at": int(created_at),
        "metadata": metadata,
    }
    # An extension: the model its responses continue with when they name none (the model of
    # its latest response, else the one it was created with); absent until it has one.
    if model is not None:
        conversation["model"] = model
    return conversation
