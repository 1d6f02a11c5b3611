"""Tree-head seals: a keyed BLAKE3 MAC when the store has a key, a plain digest otherwise.

The seal binds a head to its session's name, so renaming a session in the database
breaks every head of it, and to the global sequence numbers (``seq``) of the events its
write transaction added, so with a key the store-wide order of events across sessions is
sealed too: moving an event before or after another session's changes its ``seq``.
Without a key the seal only catches edits that do not
recompute it; with a key, an attacker who rewrites the database and recomputes
every hash still cannot produce a valid head.
"""

from __future__ import annotations

import struct
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate

from blake3 import blake3

from . import merkle
from .errors import InvalidArgument

_KEY_CONTEXT = "compactstore 2026-11 tree head MAC v1"
_SEAL_DOMAIN = b"compactstore/seal/v2\x00"
_HEAD_DOMAIN = b"compactstore/head/v1\x00"
_KEY_CHECK = b"compactstore/key-check/v1"
#: BLAKE3 of bytes, keyed unless the key is None: natively when the extension is built.
_digest = merkle.digest_fn()
#: One run of consecutive sequence numbers: the first and the length, signed 8-byte big-endian.
_RUN = struct.Struct(">qq")


def derive_key(key: bytes | str) -> bytes:
    """Return the 32-byte MAC key derived from a caller's key of any length."""
    try:
        raw = key.encode() if isinstance(key, str) else key
    except UnicodeEncodeError:
        raise InvalidArgument("key", "a str key must be valid Unicode text") from None
    if not isinstance(raw, bytes) or not raw:
        raise InvalidArgument("key", "must be non-empty bytes or str")
    return blake3(raw, derive_key_context=_KEY_CONTEXT).digest()


def _message(domain: bytes, session: str, size: int, root: bytes, prev: int, tail: bytes = b"") -> bytes:
    name = session.encode()
    return b"".join(
        # Signed: equal to unsigned for every real size, and a tampered negative one
        # still gets a seal (that does not match) instead of an OverflowError.
        (domain, len(name).to_bytes(4, "big"), name, size.to_bytes(8, "big", signed=True), root,
         prev.to_bytes(8, "big", signed=True), tail)
    )


def seq_runs(seqs: Sequence[int]) -> bytes:
    """Return the sequence numbers of a commit's events, in position order, as stored and sealed.

    Each maximal run of consecutive numbers is 16 bytes: its first number and its length,
    8 bytes each, big-endian (signed, as for sizes). One writer's commit is one run;
    writers drawing at once on PostgreSQL may interleave a batch's numbers.
    """
    if type(seqs) is range and seqs.step == 1:  # the common case: one run, no loop
        return _RUN.pack(seqs.start, len(seqs)) if seqs else b""
    runs: list[tuple[int, int]] = []
    start = count = 0
    for q in seqs:
        if count and q == start + count:
            count += 1
            continue
        if count:
            runs.append((start, count))
        start, count = q, 1
    if count:
        runs.append((start, count))
    return pack_runs(runs)


def pack_runs(runs: Iterable[tuple[int, int]]) -> bytes:
    """Return ``(first, length)`` runs packed as :func:`seq_runs` packs them (maximal runs give its bytes)."""
    return b"".join(_RUN.pack(a, n) for a, n in runs)


def runs_of(packed: bytes) -> list[tuple[int, int]]:
    """Return ``(first, length)`` of each run :func:`seq_runs` packed (a trailing partial run is dropped)."""
    return [(int.from_bytes(packed[i : i + 8], "big", signed=True), int.from_bytes(packed[i + 8 : i + 16], "big", signed=True))
            for i in range(0, len(packed) - 15, 16)]


def seq_lookup(packed: bytes) -> Callable[[int], int | None]:
    """Return a function giving the ``index``-th sequence number :func:`seq_runs` packed (0 first), None outside them.

    The runs are unpacked once, and each lookup is a bisection over their starts.
    """
    runs = runs_of(packed)
    starts = list(accumulate((n for _, n in runs), initial=0))
    firsts = [f for f, _ in runs]
    total = starts[-1]

    def at(index: int) -> int | None:
        if not 0 <= index < total:
            return None
        k = bisect_right(starts, index) - 1
        return firsts[k] + index - starts[k]

    return at


def seal(mac_key: bytes | None, session: str, size: int, root: bytes, prev: int, seqs: bytes) -> bytes:
    """Return the seal of a stored tree head.

    Args:
        prev: the size of the session's head before it, 0 first.
        seqs: the global sequence numbers of the events at positions ``[prev, size)``, as
            :func:`seq_runs` packs them.
    """
    # The seqs come last: the fields before have fixed widths or a length, so they need none.
    return _digest(_message(_SEAL_DOMAIN, session, size, root, prev, seqs), mac_key or None)


def head_mac(mac_key: bytes, session: str, size: int, root: bytes) -> bytes:
    """Return the MAC of a tree head handed to a caller: over session name, size and root."""
    return blake3(_message(_HEAD_DOMAIN, session, size, root, 0), key=mac_key).digest()


def key_check(mac_key: bytes) -> str:
    """Return the hex check value stored with a keyed store, to recognise its key."""
    return blake3(_KEY_CHECK, key=mac_key).hexdigest()


_STORE_ID_DOMAIN = b"compactstore/store-id/v1\x00"


def store_id(nonce: bytes) -> str:
    """Return the store identity made of ``nonce`` (16 random bytes): the nonce and an 8-byte check, in hex.

    Written once into a new store's meta table and bound into every artifact it
    makes, so that an artifact is held only against the store that made it, even
    when another store holds the very same events. The check catches an edited id
    as the unkeyed seals catch edited heads.
    """
    return (nonce + blake3(_STORE_ID_DOMAIN + nonce).digest(length=8)).hex()


def store_id_ok(text: object) -> bool:
    """Return whether ``text`` is a store identity as :func:`store_id` makes it."""
    if not isinstance(text, str) or len(text) != 48:
        return False
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return False
    return text == raw.hex() and blake3(_STORE_ID_DOMAIN + raw[:16]).digest(length=8) == raw[16:]
