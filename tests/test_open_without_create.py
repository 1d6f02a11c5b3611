"""Opening without create reads what is there: it writes nothing and waits for no writer."""

from __future__ import annotations

import sqlite3

import pytest

import compactstore as cs
from compactstore.backends import open_backend
from compactstore.backends import sqlite as sqlite_backend


def test_opening_without_create_where_the_schema_has_no_identity_yet_leaves_it_to_the_creator(target: str) -> None:
    """A store whose tables are made but whose meta row is not yet written (a creator between its two steps) is not one to open without create.

    Opening it with create=False must refuse and write nothing: the creator, which opens
    with its key, then makes the keyed store it asked for.
    """
    open_backend(target, durable=False).close()  # the schema, as the creator's first step commits it
    with pytest.raises(cs.NotAStore):
        cs.open(target, create=False).close()
    with cs.open(target, key=b"k" * 32) as st:
        assert st.keyed


def test_opening_an_existing_sqlite_store_without_create_does_not_wait_for_a_writer(
    sqlite_target: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """open(create=False) of an existing store reads it while another connection holds the write lock."""
    with cs.open(sqlite_target) as st:
        st.session("a").append(cs.Turn("user", "one"))
    monkeypatch.setattr(sqlite_backend, "BUSY_TIMEOUT_MS", 500)
    writer = sqlite3.connect(sqlite_target, isolation_level=None)
    writer.execute("BEGIN IMMEDIATE")
    try:
        with cs.open(sqlite_target, create=False) as st:
            assert st.session("a").size == 1
    finally:
        writer.execute("ROLLBACK")
        writer.close()
