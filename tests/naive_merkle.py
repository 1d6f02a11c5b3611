"""A naive RFC 9162 Merkle tree, written straight from the RFC text; a test oracle only.

RFC 9162, section 2.1.1 (Merkle Tree Hash), 2.1.3.1 (PATH) and 2.1.4.1 (SUBPROOF),
transcribed recursively with no shortcuts. It is deliberately slow and shares no
code with ``compactstore.merkle``: tests compare the two.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Sequence
from functools import lru_cache

from blake3 import blake3


def _blake3(data: bytes) -> bytes:
    return blake3(data).digest()


def _sha256(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


HASHES: dict[str, Callable[[bytes], bytes]] = {"blake3": _blake3, "sha256": _sha256}


def _k(n: int) -> int:
    """The largest power of two smaller than n (n > 1)."""
    k = 1
    while k * 2 < n:
        k *= 2
    return k


def leaf(entry: bytes, algo: str = "blake3") -> bytes:
    """HASH(0x00 || d)."""
    return HASHES[algo](b"\x00" + entry)


def node(left: bytes, right: bytes, algo: str = "blake3") -> bytes:
    """HASH(0x01 || left || right)."""
    return HASHES[algo](b"\x01" + left + right)


def mth(d: Sequence[bytes], algo: str = "blake3") -> bytes:
    """MTH(D[n]): HASH() for n = 0, the leaf hash for n = 1, else split at k."""
    return _mth(tuple(d), algo)


@lru_cache(maxsize=1 << 16)
def _mth(d: tuple[bytes, ...], algo: str) -> bytes:
    # Memoized only to keep exhaustive tests quick; the recursion is the RFC's.
    n = len(d)
    if n == 0:
        return HASHES[algo](b"")
    if n == 1:
        return leaf(d[0], algo)
    k = _k(n)
    return node(_mth(d[:k], algo), _mth(d[k:], algo), algo)


def path(m: int, d: Sequence[bytes], algo: str = "blake3") -> list[bytes]:
    """PATH(m, D[n]): the audit path of leaf m, from the leaf's sibling upwards."""
    n = len(d)
    assert 0 <= m < n
    if n == 1:
        return []
    k = _k(n)
    if m < k:
        return path(m, d[:k], algo) + [mth(d[k:], algo)]
    return path(m - k, d[k:], algo) + [mth(d[:k], algo)]


def subproof(m: int, d: Sequence[bytes], b: bool, algo: str = "blake3") -> list[bytes]:
    """SUBPROOF(m, D[n], b)."""
    n = len(d)
    if m == n:
        return [] if b else [mth(d, algo)]
    k = _k(n)
    if m <= k:
        return subproof(m, d[:k], b, algo) + [mth(d[k:], algo)]
    return subproof(m - k, d[k:], False, algo) + [mth(d[:k], algo)]


def proof(m: int, d: Sequence[bytes], algo: str = "blake3") -> list[bytes]:
    """PROOF(m, D[n]) = SUBPROOF(m, D[n], true), defined by the RFC for 0 < m <= n."""
    assert 0 < m <= len(d)
    return subproof(m, d, True, algo)


def complete_subtrees(d: Sequence[bytes], algo: str = "blake3") -> dict[tuple[int, int], bytes]:
    """Every complete aligned subtree of D[n] as ``{(level, index): MTH}``, leaves included."""
    out: dict[tuple[int, int], bytes] = {}
    level = 0
    while (1 << level) <= len(d):
        width = 1 << level
        for index in range(len(d) // width):
            out[(level, index)] = mth(d[index * width : (index + 1) * width], algo)
        level += 1
    return out
