"""A keyed store's head MAC vouches for a root: only for one the sealed head agrees with."""

from __future__ import annotations

import sqlite3

import pytest

import compactstore as cs


def _turns(n: int, tag: str = "t") -> list[cs.Event]:
    return [cs.Turn("user", f"{tag} {i}") for i in range(n)]


def test_session_head_does_not_mac_a_root_the_sealed_head_refutes(sqlite_target: str) -> None:
    """In a keyed store, a head MAC vouches for a root: one recomputed from an edited subtree table must not get one."""
    with cs.open(sqlite_target, key=b"secret", clock=cs.events.tick_clock()) as st:
        st.session("s").extend(_turns(40))
        sealed = st.session("s").sealed_head()
    conn = sqlite3.connect(sqlite_target)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("UPDATE subtrees SET hash = ? WHERE level = 4 AND idx = 1", (b"\x07" * 32,))
    conn.commit()
    conn.close()
    with cs.open(sqlite_target, key=b"secret") as st:
        s = st.session("s")
        assert s.sealed_head().root == sealed.root  # the sealed head still says the true root
        try:
            head = s.head()
        except cs.IntegrityError:
            return  # refusing is fine
        # Otherwise the MAC must not vouch for a root other than the sealed one at the same size.
        assert head.root == sealed.root or not st.check_head(head)


def test_an_unverified_head_is_the_stored_roots_root_and_carries_no_mac(sqlite_target: str) -> None:
    """head(verify=False) folds the stored roots as they are, for drawing a store that does not verify: never MACed."""
    with cs.open(sqlite_target, key=b"secret", clock=cs.events.tick_clock()) as st:
        st.session("s").extend(_turns(40))
        sealed = st.session("s").head()
        assert sealed.mac is not None and st.check_head(sealed)
        unverified = st.session("s").head(verify=False)
        assert (unverified.size, unverified.root, unverified.mac) == (sealed.size, sealed.root, None)
    conn = sqlite3.connect(sqlite_target)
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f"DROP TRIGGER {name}")
    conn.execute("UPDATE subtrees SET hash = ? WHERE level = 4 AND idx = 1", (b"\x07" * 32,))
    conn.execute("UPDATE heads SET seal = zeroblob(32)")
    conn.commit()
    conn.close()
    with cs.open(sqlite_target, key=b"secret") as st:
        s = st.session("s")
        with pytest.raises(cs.IntegrityError):
            s.head()
        unverified = s.head(verify=False)
        assert unverified.mac is None and unverified.root != sealed.root and not st.check_head(unverified)
