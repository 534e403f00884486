"""What the SQLite and PostgreSQL stores share: every query on responses, their events, the
facade leases and upkeep (conversations: `sql_conversations`; machinery: `sql_base`). A backend
(`store.ResponseStore`, `postgres_store.PostgresStore`) supplies connections and its schema.

Kept per response: its resource, its raw input items exactly as the client sent them (for
`input_items`, images included) and its output items; and, for replays, the raw contract
messages its input and its output were translated to (`message_codec`), images by content hash
in `images`. A later turn replays those messages instead of translating the items (and
decoding their images) again, so a turn costs its own items, not the whole chain's.

Several facades may share one store (PostgreSQL): each is an instance with a lease it renews;
a response records the instance generating it, and only responses whose instance's lease
expired are swept to `failed` (`fail_unfinished`).
"""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterable, Sequence
from typing import Any

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.store.message_codec import EncodedMessages, encode_messages
from vlmserve.facade.store.protocol import (
    ItemPage,
    Maintenance,
    MissingChainLinkError,
    Order,
    Replay,
    StoredItem,
)
from vlmserve.facade.store.sql_backend import (
    BATCH,
    DEFAULT_CACHE_BYTES,
    Transaction,
    batches,
    encoded_size,
    free_unused_images,
    put_images,
)
from vlmserve.facade.store.sql_conversations import ConversationQueries

__all__ = ["DEFAULT_CACHE_BYTES", "SQLStore"]

UNFINISHED = ("queued", "in_progress")


class SQLStore(ConversationQueries):
    def __init__(self, *, cache_bytes: int = DEFAULT_CACHE_BYTES) -> None:
        super().__init__(cache_bytes=cache_bytes)
        # Responses this store object writes belong to this instance; it holds no lease until
        # `start_lease`, so what it leaves unfinished counts as abandoned.
        self._instance_id = _new_instance_id()
        self._lease_ttl_s: float | None = None

    # ---- leases --------------------------------------------------------------------------------

    def start_lease(self, ttl_s: float) -> str:
        """From now on this store object is a new facade instance, alive while it renews its lease
        (every fraction of `ttl_s`); the responses it starts are its own. Its id."""
        self._instance_id = _new_instance_id()
        self._lease_ttl_s = ttl_s
        self.renew_lease()
        return self._instance_id

    def renew_lease(self) -> None:
        if self._lease_ttl_s is None:
            return
        with self._transaction() as tx:
            tx.execute(
                f"INSERT INTO facades (id, expires_at) VALUES (?, {self.NOW} + ?)"
                " ON CONFLICT (id) DO UPDATE SET expires_at = excluded.expires_at",
                (self._instance_id, float(self._lease_ttl_s)),
            )

    def release_lease(self) -> None:
        """A clean stop: this instance is gone (what it left unfinished may be swept at once)."""
        if self._lease_ttl_s is None:
            return
        self._lease_ttl_s = None
        with self._transaction() as tx:
            tx.execute("DELETE FROM facades WHERE id = ?", (self._instance_id,))

    def fail_unfinished(self, error: dict[str, str]) -> list[str]:
        """Mark `failed` with `error` every response still `queued` or `in_progress`, whoever owns
        it, whose facade instance holds no live lease (it died: nothing will finish them); their
        ids. Live facades' responses, this one's included, are left alone. A background
        response also gets its terminal `response.failed` event, so a resumed stream ends."""
        with self._transaction() as tx:
            rows = tx.execute(
                "SELECT id, owner, resource FROM responses r WHERE status IN (?, ?) AND NOT EXISTS"
                f" (SELECT 1 FROM facades f WHERE f.id = r.facade_id AND f.expires_at > {self.NOW})"
                f"{self.FOR_UPDATE}",
                UNFINISHED,
            ).fetchall()
            for response_id, owner, text in rows:
                resource = json.loads(text)
                resource["status"] = "failed"
                resource["error"] = dict(error)
                if resource.get("background"):
                    self._append_events(tx, response_id, owner, [_failed_event(tx, response_id, resource)])
                tx.execute(
                    "UPDATE responses SET resource = ?, status = 'failed' WHERE id = ?",
                    (json.dumps(resource), response_id),
                )
            tx.execute(f"DELETE FROM facades WHERE expires_at <= {self.NOW}")
        return [response_id for response_id, _, _ in rows]

    # ---- streaming events of background responses --------------------------------------------

    def append_events(
        self, response_id: str, events: Sequence[dict[str, Any]], *, owner: str = ""
    ) -> int | None:
        """Store streaming events of a response (each with its `sequence_number`; one already
        stored is kept as it was); the bytes its events now take, None when the response is
        not stored (deleted meanwhile). The bytes count in its size and its owner's usage."""
        with self._transaction() as tx:
            return self._append_events(tx, response_id, owner, events)

    def _append_events(
        self, tx: Transaction, response_id: str, owner: str, events: Sequence[dict[str, Any]]
    ) -> int | None:
        rows = tx.execute(
            f"SELECT events_size FROM responses WHERE id = ? AND owner = ?{self.FOR_UPDATE}",
            (response_id, owner),
        ).fetchall()
        if not rows:
            return None
        added = 0
        for event in events:
            text = json.dumps(event, separators=(",", ":"))
            inserted = tx.execute(
                "INSERT INTO response_events (response_id, sequence_number, event) VALUES (?, ?, ?)"
                " ON CONFLICT DO NOTHING",
                (response_id, int(event["sequence_number"]), text),
            ).rowcount
            added += len(text) if inserted else 0
        if added:
            tx.execute(
                "UPDATE responses SET events_size = events_size + ?, size = size + ? WHERE id = ?",
                (added, added, response_id),
            )
            tx.add_usage(owner, added)
        return int(rows[0][0]) + added

    def list_events(
        self, response_id: str, *, after: int | None = None, limit: int = 1000, owner: str = ""
    ) -> list[dict[str, Any]] | None:
        """Up to `limit` stored events of a response with a sequence number above `after`
        (None: from the first), in order; None when the response is not stored."""
        if not self._query("SELECT 1 FROM responses WHERE id = ? AND owner = ?", (response_id, owner)):
            return None
        rows = self._query(
            "SELECT event FROM response_events WHERE response_id = ? AND sequence_number > ?"
            " ORDER BY sequence_number LIMIT ?",
            (response_id, -1 if after is None else after, limit),
        )
        return [json.loads(event) for (event,) in rows]

    # ---- responses -------------------------------------------------------------------------

    def put_response(
        self,
        resource: dict[str, Any],
        input_items: Sequence[StoredItem],
        *,
        owner: str = "",
        conversation_id: str | None = None,
        input_messages: Sequence[pb.Message] | None = None,
        max_stored_bytes: int | None = None,
    ) -> None:
        """Store a new response (any status) with its raw input items and, for replays, the
        contract messages they were translated to (None: replays translate the items again).
        StorageQuotaExceededError (nothing stored) when the owner's bytes would pass
        `max_stored_bytes`."""
        response_id = resource["id"]
        resource_text = json.dumps(resource)
        items = [(s.id, json.dumps(s.item)) for s in input_items]
        encoded = encode_messages(input_messages) if input_messages is not None else None
        input_size = sum(len(text) for _, text in items) + (encoded_size(encoded) if encoded else 0)
        with self._transaction() as tx:
            tx.execute(
                "INSERT INTO responses (id, owner, created_at, previous_response_id, conversation_id,"
                " resource, input_size, size, status, facade_id) VALUES (?, ?, ?, ?, ?, ?, ?, 0, ?, ?)",
                (
                    response_id,
                    owner,
                    int(resource["created_at"]),
                    resource.get("previous_response_id"),
                    conversation_id,
                    resource_text,
                    input_size,
                    resource.get("status"),
                    self._instance_id,
                ),
            )
            tx.executemany(
                "INSERT INTO response_items (response_id, kind, position, item_id, item)"
                " VALUES (?, 'input', ?, ?, ?)",
                [(response_id, i, item_id, text) for i, (item_id, text) in enumerate(items)],
            )
            output_size = _write_outputs(tx, resource)
            if encoded is not None:
                # An empty output until the response finishes: the response replays either way.
                _write_response_messages(tx, response_id, "input", encoded)
                output_size += _write_response_messages(tx, response_id, "output", encode_messages([]))
            size = input_size + len(resource_text) + output_size
            tx.execute("UPDATE responses SET size = ? WHERE id = ?", (size, response_id))
            tx.add_usage(owner, size, max_bytes=max_stored_bytes)
        if input_messages is not None:
            self._cache.put((response_id, "input"), input_messages)
            self._cache.put((response_id, "output"), [])

    def update_response(self, resource: dict[str, Any], *, owner: str = "") -> bool:
        """Replace a stored response's resource (its status, output, usage); False if it is gone.
        Its output messages are dropped: replays then translate its output items."""
        with self._transaction() as tx:
            updated = self._update_response(tx, resource, owner, None)
        self._cache.drop((resource["id"], "output"))
        return updated

    def finish_response(
        self,
        resource: dict[str, Any] | None,
        *,
        owner: str = "",
        output_messages: Sequence[pb.Message] | None = None,
        conversation_id: str | None = None,
        conversation_items: Sequence[StoredItem] = (),
        conversation_messages: Sequence[pb.Message] | None = None,
        events: Sequence[dict[str, Any]] = (),
        conversation_model: str | None = None,
    ) -> None:
        """In one transaction: a response's final state (None: not stored) with the messages
        its output was translated to, its last streaming `events` (background responses: see
        `append_events`), and the items (and messages) it adds to its conversation (a
        conversation deleted meanwhile gets nothing), whose model becomes `conversation_model`."""
        encoded = encode_messages(output_messages) if output_messages is not None else None
        with self._transaction() as tx:
            if resource is not None and events:
                self._append_events(tx, resource["id"], owner, events)
            updated = resource is not None and self._update_response(tx, resource, owner, encoded)
            if conversation_id is not None and conversation_items:
                self._append(
                    tx,
                    conversation_id,
                    owner,
                    conversation_items,
                    conversation_messages,
                    model=conversation_model,
                )
        if resource is not None:
            if updated and output_messages is not None:
                self._cache.put((resource["id"], "output"), output_messages)
            else:
                self._cache.drop((resource["id"], "output"))

    def _update_response(
        self, tx: Transaction, resource: dict[str, Any], owner: str, output: EncodedMessages | None
    ) -> bool:
        response_id = resource["id"]
        rows = tx.execute(
            "SELECT input_size + events_size, size FROM responses"
            f" WHERE id = ? AND owner = ?{self.FOR_UPDATE}",
            (response_id, owner),
        ).fetchall()
        if not rows:
            return False
        input_size, old_size = rows[0]
        resource_text = json.dumps(resource)
        tx.execute(
            "UPDATE responses SET resource = ?, status = ? WHERE id = ?",
            (resource_text, resource.get("status"), response_id),
        )
        tx.execute("DELETE FROM response_items WHERE response_id = ? AND kind = 'output'", (response_id,))
        size = int(input_size) + len(resource_text) + _write_outputs(tx, resource)
        if output is not None:
            size += _write_response_messages(tx, response_id, "output", output)
        else:
            tx.execute(
                "DELETE FROM response_messages WHERE response_id = ? AND kind = 'output'", (response_id,)
            )
        tx.execute("UPDATE responses SET size = ? WHERE id = ?", (size, response_id))
        tx.add_usage(owner, size - int(old_size))
        return True

    def get_response(self, response_id: str, *, owner: str = "") -> dict[str, Any] | None:
        rows = self._query("SELECT resource FROM responses WHERE id = ? AND owner = ?", (response_id, owner))
        return json.loads(rows[0][0]) if rows else None

    def delete_response(self, response_id: str, *, owner: str = "") -> bool:
        with self._transaction(frees_images=True) as tx:
            deleted = self._delete_responses(tx, [(response_id, owner)])
        if deleted:
            self._vacuum()
        return deleted > 0

    def _delete_responses(self, tx: Transaction, keys: Iterable[tuple[str, str]]) -> int:
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
                self._cache.forget(response_id)
        # The cascade removed their response_images rows: free what nothing else uses.
        free_unused_images(tx, hashes)
        return deleted

    def list_input_items(
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
        if self.get_response(response_id, owner=owner) is None:
            return None
        return self._page(
            "response_items", "response_id = ? AND kind = 'input'", (response_id,), after, limit, order
        )

    def _chain(self, response_id: str, owner: str, max_depth: int) -> list[str] | None:
        """The ids of a `previous_response_id` chain, newest first (at most `max_depth`)."""
        rows = self._query(
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

    def replay(self, response_id: str, *, owner: str = "", max_depth: int = 256) -> Replay | None:
        """Everything the model saw and said up to and including `response_id`, oldest first.

        None when `response_id` is unknown; MissingChainLinkError when an older link was deleted.
        """
        chain = self._chain(response_id, owner, max_depth)
        if chain is None:
            return None
        links = list(reversed(chain))
        keys = [(link, kind) for link in links for kind in ("input", "output")]
        found: dict[tuple[str, str], list[pb.Message]] = {}
        for key in keys:
            cached = self._cache.get(key)
            if cached is not None:
                found[key] = cached
        missing = sorted(
            {link for link, _ in keys if (link, "input") not in found or (link, "output") not in found}
        )
        stored: dict[tuple[str, str], tuple[bytes, list[str]]] = {}
        for batch in batches(missing):
            marks = ",".join("?" * len(batch))
            for link, kind, blob, hashes in self._query(
                f"SELECT response_id, kind, messages, images FROM response_messages"
                f" WHERE response_id IN ({marks})",
                batch,
            ):
                stored[(link, kind)] = (bytes(blob), json.loads(hashes))
        wanted = [key for key in keys if key not in found]
        if any(key not in stored for key in wanted):
            return Replay(items=self._replay_items(links))
        for key, messages in zip(wanted, self._decode([stored[key] for key in wanted]), strict=True):
            # An empty output is what a response still running (maybe in another facade) has:
            # not cached, so its real output is read once it is there.
            if messages:
                self._cache.put(key, messages)
            found[key] = messages
        return Replay(messages=[message for key in keys for message in found[key]])

    def replay_items(
        self, response_id: str, *, owner: str = "", max_depth: int = 256
    ) -> list[dict[str, Any]] | None:
        """The raw items of a chain, oldest first (what `replay` falls back to)."""
        chain = self._chain(response_id, owner, max_depth)
        return None if chain is None else self._replay_items(list(reversed(chain)))

    def _replay_items(self, links: Sequence[str]) -> list[dict[str, Any]]:
        items: list[dict[str, Any]] = []
        for link in links:
            rows = self._query(
                "SELECT item FROM response_items WHERE response_id = ?"
                " ORDER BY CASE kind WHEN 'input' THEN 0 ELSE 1 END, position",
                (link,),
            )
            items.extend(json.loads(item) for (item,) in rows)
        return items

    def find_item(self, item_id: str, *, owner: str = "") -> dict[str, Any] | None:
        """The most recently stored item with this id (for `item_reference`): the last one written
        to a response, else to a conversation (in insertion order)."""
        rows = self._query(
            "SELECT i.item FROM response_items i JOIN responses r ON r.id = i.response_id"
            f" WHERE i.item_id = ? AND r.owner = ? ORDER BY i.{self.INSERT_ORDER} DESC LIMIT 1",
            (item_id, owner),
        )
        if rows:
            found: dict[str, Any] = json.loads(rows[0][0])
            return found
        rows = self._query(
            "SELECT i.item FROM conversation_items i JOIN conversations c ON c.id = i.conversation_id"
            f" WHERE i.item_id = ? AND c.owner = ? ORDER BY i.{self.INSERT_ORDER} DESC LIMIT 1",
            (item_id, owner),
        )
        return json.loads(rows[0][0]) if rows else None

    # ---- quotas and upkeep -----------------------------------------------------------------

    def stored_bytes(self, owner: str) -> int:
        """Bytes `owner`'s responses and conversations take (JSON, messages, images they use)."""
        rows = self._query("SELECT bytes FROM usage WHERE owner = ?", (owner,))
        return int(rows[0][0]) if rows else 0

    def maintain(self, *, expire_before: int | None = None) -> Maintenance:
        """Delete responses created before `expire_before` (unix seconds; None: none), free the
        images nothing uses any more, and give free space back. One facade at a time: while
        another sharing the store runs it, this does nothing."""
        with self._upkeep_turn() as mine:
            if not mine:
                return Maintenance(0, 0, 0)
            expired = 0
            while expire_before is not None:
                with self._transaction(frees_images=True) as tx:
                    keys = tx.execute(
                        "SELECT id, owner FROM responses WHERE created_at < ? LIMIT ?", (expire_before, BATCH)
                    ).fetchall()
                    expired += self._delete_responses(tx, [(key, owner) for key, owner in keys])
                if len(keys) < BATCH:
                    break
            with self._transaction(frees_images=True) as tx:
                freed_images = free_unused_images(tx, None)
            return Maintenance(expired, freed_images, self._vacuum())


def _new_instance_id() -> str:
    return "facade_" + secrets.token_hex(12)


def _write_outputs(tx: Transaction, resource: dict[str, Any]) -> int:
    rows = [
        (resource["id"], i, str(item.get("id", "")), json.dumps(item))
        for i, item in enumerate(resource.get("output") or [])
    ]
    tx.executemany(
        "INSERT INTO response_items (response_id, kind, position, item_id, item)"
        " VALUES (?, 'output', ?, ?, ?)",
        rows,
    )
    return sum(len(row[3]) for row in rows)


def _write_response_messages(tx: Transaction, response_id: str, kind: str, encoded: EncodedMessages) -> int:
    tx.execute(
        "INSERT INTO response_messages (response_id, kind, messages, images) VALUES (?, ?, ?, ?)"
        " ON CONFLICT (response_id, kind)"
        " DO UPDATE SET messages = excluded.messages, images = excluded.images",
        (response_id, kind, encoded.blob, json.dumps(encoded.image_hashes)),
    )
    put_images(tx, encoded.images)
    tx.executemany(
        "INSERT INTO response_images (response_id, hash) VALUES (?, ?) ON CONFLICT DO NOTHING",
        [(response_id, digest) for digest in encoded.images],
    )
    return encoded_size(encoded)


def _failed_event(tx: Transaction, response_id: str, resource: dict[str, Any]) -> dict[str, Any]:
    """The `response.failed` event that ends a response's stored events, numbered after them."""
    (last,) = tx.execute(
        "SELECT MAX(sequence_number) FROM response_events WHERE response_id = ?", (response_id,)
    ).fetchone()
    sequence = 0 if last is None else int(last) + 1
    return {"type": "response.failed", "sequence_number": sequence, "response": resource}
