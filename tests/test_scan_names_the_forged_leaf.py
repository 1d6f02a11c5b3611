"""A scan refused for one forged leaf names the first position whose proof fails, and says a row it rests on may be the altered one."""

from __future__ import annotations

import sqlite3

import pytest

import compactstore as cs


def test_a_forged_leaf_is_named_by_its_position_or_its_left_neighbour(sqlite_target: str) -> None:
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        st.session("a").extend([cs.Turn("user", f"t{i}") for i in range(68)])
    conn = sqlite3.connect(sqlite_target)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("UPDATE events SET leaf = ? WHERE pos = 20", (bytes(32),))
    conn.commit()
    conn.close()
    with cs.open(sqlite_target) as st:
        with pytest.raises(cs.IntegrityError) as caught:
            list(st.session("a").scan())
    # The proof of pos 16 rests on the forged leaf 20 (their paths share [20, 24)): 16 is named,
    # and the message says a row its proof rests on may be the altered one.
    assert caught.value.pos is not None and 16 <= caught.value.pos <= 20, str(caught.value)
    assert "or a stored row its proof rests on was altered" in str(caught.value)
