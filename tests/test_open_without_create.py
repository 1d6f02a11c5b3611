"""Opening without create reads what is there: it writes nothing and waits for no writer."""

from __future__ import annotations

import pytest

import compactstore as cs
from compactstore.backends import open_backend


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

