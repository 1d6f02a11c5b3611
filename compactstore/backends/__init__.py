"""The storage protocol every backend implements, and the choice of backend by target.

A backend stores rows and answers range queries; it knows nothing of hashing, events
or compaction. The store above it does the Merkle arithmetic once, for every backend.
The protocol is typed verbs over rows: no SQL text crosses it, each backend writes its
own statements (those both share are in :mod:`compactstore.backends.queries`).

Tables (the same in every backend):

- ``meta(name, value)``: schema version, hash, key check, the store's identity. Checked on open.
- ``sessions(id, name)``: covered by the tree heads, whose seals include the name.
- ``events(seq, session_id, pos, kind, idem_key, leaf, body)``: the log. ``leaf`` is
  ``H(0x00 || body)``; ``kind`` and ``idem_key`` repeat what the body says, for indexes.
- ``subtrees(session_id, level, idx, hash)``: the root of every complete subtree at a
  stored level above the leaves (the leaves are ``events.leaf``).
- ``heads(session_id, size, root, prev, seal, seqs)``: a tree head per write
  transaction, chained to the previous one by its size ``prev``, with the global ``seq``
  of each event the transaction added (``seqs``, runs of consecutive numbers), sealed
  with a keyed BLAKE3 MAC when the store has a key (a plain BLAKE3 digest otherwise).
  The chain makes a removed head as visible as a changed one; ``seqs`` puts the order of
  events across sessions under the seals.
- ``structure_index(session_id, pos, rel, key, num, text)``: the structural facts
  of each session's events (see :mod:`compactstore.backends.queries`), insert-only.
- ``redactions(session_id, pos, by)``: positions whose body was erased by the
  redaction event at ``by``. The only change the log tables allow is setting the
  body of such a position to NULL; its leaf stays, so the tree still verifies.
"""

from __future__ import annotations

from ..errors import CompactStoreError
from .protocol import (
    SCHEMA_VERSION as SCHEMA_VERSION,
    Backend as Backend,
    HeadRow as HeadRow,
    Row as Row,
    Rows as Rows,
    Writer as Writer,
    all_heads as all_heads,
    chunked as chunked,
    keyset as keyset,
)


def is_postgres(target: str) -> bool:
    """Return whether ``target`` names a PostgreSQL store (a ``postgresql://`` or ``postgres://`` URL)."""
    return target.startswith(("postgresql://", "postgres://"))


def open_backend(target: str, *, durable: bool, create: bool = True) -> Backend:
    """Return the backend for ``target``: a PostgreSQL URL, or a SQLite path (":memory:" too).

    ``create``: make the schema where there is none (a missing or 0-byte file, an empty
    database); otherwise such a target is refused and left as it was.

    ``postgresql://`` and ``postgres://`` URLs need the ``postgres`` extra (psycopg 3 and
    psycopg-pool), imported only here, so a SQLite-only install never loads them.

    Raises:
        CompactStoreError: a PostgreSQL URL was given and the driver is not installed.
        NotAStore: the target holds no store (and ``create`` is false), or something else.
    """
    if is_postgres(target):
        try:
            from .postgres import PostgresBackend
        except ImportError as exc:
            raise CompactStoreError(
                "the PostgreSQL backend needs the compactstore[postgres] extra (psycopg 3 and psycopg-pool), "
                f"which is not installed: {exc}",
                hint="pip install 'compactstore[postgres]'",
            ) from exc
        return PostgresBackend(target, durable=durable, create=create)
    from .sqlite import SQLiteBackend

    return SQLiteBackend(target, durable=durable, create=create)
