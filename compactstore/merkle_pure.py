"""The pure-Python implementation of :mod:`compactstore.merkle`: the reference.

Every function here gives the bytes that ``compactstore.native`` must give; the tests
hold the two to each other and both to a naive oracle. :mod:`compactstore.merkle`
documents the trees and proofs, re-exports what is the same in both (the coordinate
arithmetic, serving from stored roots) and calls the native module for BLAKE3 when it is
built.

Everything here is pure: functions over in-memory entries (leaf data, not hashes),
plus the coordinate arithmetic a store uses to serve the same answers from stored
subtree roots in O(log n). A subtree is named by ``(level, index)``: it covers
positions ``[index << level, (index + 1) << level)``; level 0 is a leaf.
"""

from __future__ import annotations

import hashlib
import threading
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Self

from blake3 import blake3

from .errors import InvalidArgument, shown

#: Interior subtree roots are stored only at levels that are multiples of this; the
#: levels between are recomputed from at most 2**TILE_HEIGHT stored roots below them.
#: Storing every level costs about one extra row per append; storing every fourth
#: costs one per sixteen, for at most 15 extra node hashes per coordinate served.
TILE_HEIGHT = 4

LEAF_PREFIX = b"\x00"
NODE_PREFIX = b"\x01"
HASH_SIZE = 32
ALGOS = ("blake3", "sha256")

Coord = tuple[int, int]
"""A complete, aligned subtree: ``(level, index)``."""

Span = tuple[int, int]
"""Positions ``[start, stop)``."""


#: Up to this size a leaf is hashed as two updates, the prefix and then the entry (no
#: concatenation). Above it, one update over ``prefix + entry`` is cheaper: BLAKE3 hashes
#: the 1 KiB chunks of one call in parallel (SIMD), but the chunks of a later update start
#: one prefix byte off and the first is hashed alone, which costs more than the copy.
_PREABSORB_MAX = 1024

_local = threading.local()


def _b3_fns() -> tuple[Callable[[bytes], bytes], Callable[[bytes, bytes], bytes]]:
    """Return the calling thread's BLAKE3 leaf and node hashers: one hasher, reset per hash.

    Making a hasher (or copying one) costs as much as hashing a short leaf; resetting one
    costs little. Each call finishes its hash before it returns, so the two never
    interleave, and each thread has hashers of its own.
    """
    try:
        fns: tuple[Callable[[bytes], bytes], Callable[[bytes, bytes], bytes]] = _local.b3
        return fns
    except AttributeError:
        pass
    h = blake3()
    reset, update, digest = h.reset, h.update, h.digest
    leaf_prefix, node_prefix, most = LEAF_PREFIX, NODE_PREFIX, _PREABSORB_MAX

    def leaf(entry: bytes) -> bytes:
        reset()
        if len(entry) <= most:
            update(leaf_prefix)
            update(entry)
        else:
            update(leaf_prefix + entry)
        return digest()

    def node(left: bytes, right: bytes) -> bytes:
        reset()
        update(node_prefix + left + right)
        return digest()

    _local.b3 = fns = (leaf, node)
    return fns


def _b3_leaf(entry: bytes) -> bytes:
    return _b3_fns()[0](entry)


def _b3_node(left: bytes, right: bytes) -> bytes:
    return _b3_fns()[1](left, right)


def _sha_leaf(entry: bytes) -> bytes:
    return hashlib.sha256(LEAF_PREFIX + entry).digest()


def _sha_node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"".join((NODE_PREFIX, left, right))).digest()


_HASHERS: dict[str, tuple[Callable[[bytes], bytes], Callable[[bytes, bytes], bytes], bytes]] = {
    "blake3": (_b3_leaf, _b3_node, blake3(b"").digest()),
    "sha256": (_sha_leaf, _sha_node, hashlib.sha256(b"").digest()),
}


def _node_fn(algo: str) -> Callable[[bytes, bytes], bytes]:
    """Return a node hasher for a loop of the calling thread (not to be handed to another)."""
    return _b3_fns()[1] if algo == "blake3" else _hasher(algo)[1]


def digest(data: bytes, key: bytes | None) -> bytes:
    """Return the BLAKE3 hash of ``data`` (bytes or bytearray), keyed with the 32-byte ``key`` unless it is None."""
    if not isinstance(data, (bytes, bytearray)) or not (key is None or isinstance(key, (bytes, bytearray))):
        raise TypeError("digest takes bytes or bytearray")  # as the native digest: one interface
    return (blake3(data) if key is None else blake3(data, key=key)).digest()


def digest_fn() -> Callable[[bytes, bytes | None], bytes]:
    """Return :func:`digest` (``compactstore.merkle.digest_fn`` returns the native one when it is built)."""
    return digest


def leaf_fn(algo: str = "blake3") -> Callable[[bytes], bytes]:
    """Return a leaf hasher for a loop of the calling thread (not to be handed to another)."""
    return _b3_fns()[0] if algo == "blake3" else _hasher(algo)[0]


def _hasher(algo: str) -> tuple[Callable[[bytes], bytes], Callable[[bytes, bytes], bytes], bytes]:
    try:
        return _HASHERS[algo]
    except KeyError:
        raise InvalidArgument("algo", f"unknown hash {shown(algo)}; use one of {ALGOS}") from None


def leaf_hash(entry: bytes, algo: str = "blake3") -> bytes:
    """Return ``H(0x00 || entry)``."""
    return _hasher(algo)[0](entry)


def leaf_hashes(entries: Iterable[bytes], algo: str = "blake3") -> list[bytes]:
    """Return ``H(0x00 || entry)`` of each entry, in order (cheaper than one call per entry)."""
    _hasher(algo)
    return _leaves(entries, algo)


def node_hash(left: bytes, right: bytes, algo: str = "blake3") -> bytes:
    """Return ``H(0x01 || left || right)``."""
    return _hasher(algo)[1](left, right)


def empty_root(algo: str = "blake3") -> bytes:
    """Return the root of the empty tree, ``H("")``."""
    return _hasher(algo)[2]


# --- coordinate arithmetic -------------------------------------------------------


def _split(n: int) -> int:
    """Return the largest power of two smaller than ``n`` (RFC 9162's k). Requires n > 1."""
    return 1 << ((n - 1).bit_length() - 1)


def cover(start: int, stop: int) -> list[Coord]:
    """Return the compact range of ``[start, stop)``: its fewest aligned complete subtrees.

    They are listed left to right; at most ``2 * log2(stop - start)`` of them.
    """
    out: list[Coord] = []
    append = out.append
    while start < stop:
        # The largest subtree aligned at ``start`` (its trailing zero bits) that fits.
        level = (stop - start).bit_length() - 1
        if start:
            low = (start & -start).bit_length() - 1
            if low < level:
                level = low
        append((level, start >> level))
        start += 1 << level
    return out


def inclusion_spans(index: int, size: int) -> list[Span]:
    """Return the spans whose roots form the inclusion proof of ``index`` in ``size``.

    Ordered as RFC 9162 orders the proof: from the leaf's sibling up to the root's
    child. Requires ``0 <= index < size``.
    """
    path: list[Span] = []
    lo, hi = 0, size
    while hi - lo > 1:
        k = _split(hi - lo)
        if index < lo + k:
            path.append((lo + k, hi))
            hi = lo + k
        else:
            path.append((lo, lo + k))
            lo += k
    path.reverse()
    return path


def consistency_spans(old_size: int, new_size: int) -> list[Span]:
    """Return the spans whose roots form the consistency proof from ``old_size`` to ``new_size``.

    RFC 9162 SUBPROOF, iteratively. Requires ``0 <= old_size <= new_size``; the proof is
    empty when ``old_size`` is 0 or equals ``new_size``.
    """
    if old_size == 0 or old_size == new_size:
        return []
    lo, hi, complete = 0, new_size, True
    tail: list[Span] = []
    while old_size != hi:
        k = _split(hi - lo)
        if old_size <= lo + k:
            tail.append((lo + k, hi))
            hi = lo + k
        else:
            tail.append((lo, lo + k))
            lo += k
            complete = False
    head: list[Span] = [] if complete else [(lo, hi)]
    return head + tail[::-1]


def fold(hashes: Sequence[bytes], algo: str = "blake3") -> bytes:
    """Return the root of a compact range's hashes (left to right), merged right to left.

    For the compact range of ``[0, n)`` this is the RFC 9162 tree root of size n; for
    an empty sequence it is the empty root.
    """
    if not hashes:
        return empty_root(algo)
    node = _node_fn(algo)
    acc = hashes[-1]
    for left in reversed(hashes[:-1]):
        acc = node(left, acc)
    return acc


def is_stored(level: int) -> bool:
    """Return whether subtree roots at ``level`` are kept by a store (level 0: the leaves)."""
    return level % TILE_HEIGHT == 0


def resolve(
    coords: Iterable[Coord],
    fetch: Callable[[list[Coord]], list[bytes]],
    algo: str = "blake3",
    *,
    hash_run: Callable[[list[bytes]], bytes] | None = None,
) -> dict[Coord, bytes]:
    """Return the roots at ``coords``, fetching only stored levels and hashing up the rest.

    ``fetch`` returns the roots of a list of distinct stored coordinates, in order; it
    is called once (not at all when ``coords`` is empty). ``hash_run`` returns the root over
    a power-of-two run of sibling roots (by default paired here with ``algo``'s node
    hash), so another implementation can hash each run in one call.
    """
    node = _node_fn(algo)
    if hash_run is None:
        def hash_run(row: list[bytes]) -> bytes:
            return _up(row, node)
    # Each coordinate is served by a run of 2**up stored roots: the stored level at or
    # below it (up = 0 when its own level is stored).
    runs: list[tuple[Coord, int, int, int]] = []  # (coordinate, stored level, first index, length)
    need: list[Coord] = []
    add, more = need.append, need.extend
    for c in dict.fromkeys(coords):
        level, idx = c
        up = level % TILE_HEIGHT
        if up:
            base, lo, n = level - up, idx << up, 1 << up
            more([(base, j) for j in range(lo, lo + n)])
        else:
            base, lo, n = level, idx, 1
            add(c)
        runs.append((c, base, lo, n))
    if not need:
        return {}
    out: dict[Coord, bytes] = {}
    distinct = dict.fromkeys(need)
    if len(distinct) == len(need):
        # No two runs share a stored root (always so for a proof's disjoint subtrees):
        # the roots come back run after run.
        got = _fetched(fetch, need)
        k = 0
        for c, _, _, n in runs:
            if n == 1:
                out[c] = got[k]
            else:
                out[c] = hash_run(got[k : k + n])
            k += n
        return out
    keys = list(distinct)
    by = dict(zip(keys, _fetched(fetch, keys)))
    for c, base, lo, n in runs:
        out[c] = by[(base, lo)] if n == 1 else hash_run([by[(base, j)] for j in range(lo, lo + n)])
    return out


def _fetched(fetch: Callable[[list[Coord]], list[bytes]], coords: list[Coord]) -> list[bytes]:
    """Return ``fetch(coords)``, refused unless it holds one root per coordinate.

    A run of too few roots would still hash to a root, just not this tree's.

    Raises:
        ValueError: naming how many roots came back for how many coordinates.
    """
    got = fetch(coords)
    if len(got) != len(coords):
        raise ValueError(f"fetch returned {len(got)} roots for {len(coords)} coordinates")
    return got


def _up(row: list[bytes], node: Callable[[bytes, bytes], bytes]) -> bytes:
    """Return the root over ``row``, a power-of-two run of sibling subtree roots."""
    while len(row) > 1:
        row = [node(row[k], row[k + 1]) for k in range(0, len(row), 2)]
    return row[0]


def spans_root(
    spans: Iterable[Span], lookup: Mapping[Coord, bytes], algo: str = "blake3"
) -> list[bytes]:
    """Return the root of each span from stored subtree roots (``lookup`` by coordinate)."""
    return [fold([lookup[c] for c in cover(a, b)], algo) for a, b in spans]


def serve(
    spans: Sequence[Span], fetch: Callable[[list[Coord]], list[bytes]], algo: str = "blake3"
) -> list[bytes]:
    """Return the root of each span from stored subtree roots, all fetched by one ``fetch`` call.

    The same as ``spans_root(spans, resolve(covers, fetch))`` with each span's compact
    range computed once: how a store serves proofs and span roots.
    """
    covers = [cover(a, b) for a, b in spans]
    lookup = resolve([c for cs in covers for c in cs], fetch, algo)
    return [fold([lookup[c] for c in cs], algo) for cs in covers]


def root_with(
    leaves: Mapping[int, bytes], size: int, fetch: Callable[[list[Coord]], list[bytes]], algo: str = "blake3"
) -> bytes:
    """Return the root of ``[0, size)`` from the leaf hashes given and stored subtree roots for the rest.

    ``leaves`` maps positions to leaf hashes. Each largest complete subtree that holds
    no given position is served as :func:`resolve` serves it: one ``fetch`` call for all
    of them, stored levels only, none when every leaf is given. That is O(log n) roots
    per run of given positions; the given leaves are hashed up to meet them. The root
    equals a tree's root only if each given leaf is the tree's leaf at its position,
    which is how leaves re-hashed from bodies are held against a tree head. What
    ``fetch`` raises (a store's error for a root it lacks) passes through.

    Requires ``size >= 0`` and ``0 <= pos < size`` for each given position.

    Raises:
        InvalidArgument: ``size`` is negative, a given position lies outside
            ``[0, size)``, or ``algo`` is unknown.
    """
    _hasher(algo)
    if size < 0:
        raise InvalidArgument("size", f"must be >= 0, got {shown(size)}")
    known = sorted(leaves)
    if known and not (0 <= known[0] and known[-1] < size):
        bad = known[0] if known[0] < 0 else known[-1]
        raise InvalidArgument("leaves", f"positions must be in [0, {size}), got {shown(bad)}")

    def holds_given(level: int, idx: int) -> bool:
        k = bisect_left(known, idx << level)
        return k < len(known) and known[k] < (idx + 1) << level

    # A subtree holding a given position splits in two; one holding none comes from the store.
    need: list[Coord] = []

    def plan(level: int, idx: int) -> None:
        if not holds_given(level, idx):
            need.append((level, idx))
        elif level:
            plan(level - 1, 2 * idx)
            plan(level - 1, 2 * idx + 1)

    tops = cover(0, size)
    for level, idx in tops:
        plan(level, idx)
    stored = resolve(need, fetch, algo)
    node = _node_fn(algo)

    def root(level: int, idx: int) -> bytes:
        if (level, idx) in stored:
            return stored[(level, idx)]
        if level == 0:
            return leaves[idx]
        return node(root(level - 1, 2 * idx), root(level - 1, 2 * idx + 1))

    return fold([root(level, idx) for level, idx in tops], algo)


# --- roots and proofs over in-memory entries ---------------------------------------


def subtree_levels(leaves: Sequence[bytes], algo: str = "blake3") -> list[list[bytes]]:
    """Return the roots of every complete aligned subtree over leaf hashes, level by level.

    ``levels[l][i]`` is the root of ``(l, i)``; a level ends at its last complete
    subtree, and the list ends at the level of the largest one.
    """
    _hasher(algo)
    level = list(leaves)
    levels = [level]
    while len(level) > 1:
        level = _pairs(level, algo)
        levels.append(level)
    return levels


def _levels(entries: Sequence[bytes], algo: str) -> list[list[bytes]]:
    return subtree_levels(_leaves(entries, algo), algo)


def check_size(name: str, value: int, lo: int, hi: int) -> None:
    """Raise InvalidArgument naming ``name`` unless ``lo <= value <= hi``."""
    if not lo <= value <= hi:
        raise InvalidArgument(name, f"must be in [{lo}, {hi}], got {shown(value)}")


def _lookup(levels: list[list[bytes]], coords: Iterable[Coord]) -> dict[Coord, bytes]:
    return {(lv, i): levels[lv][i] for lv, i in coords}


def _leaves(entries: Iterable[bytes], algo: str) -> list[bytes]:
    return list(map(leaf_fn(algo), entries))


def _pairs(level: Sequence[bytes], algo: str) -> list[bytes]:
    """Return the next level up: neighbours paired, an odd last node dropped."""
    pairs = iter(level)
    node = _node_fn(algo)
    return [node(a, b) for a, b in zip(pairs, pairs)]


def tree_root(entries: Sequence[bytes], algo: str = "blake3") -> bytes:
    """Return the RFC 9162 Merkle Tree Hash of ``entries``."""
    _hasher(algo)
    return root_of_leaves(_leaves(entries, algo), algo)


def root_of_leaves(leaves: Sequence[bytes], algo: str = "blake3") -> bytes:
    """Return the RFC 9162 root over leaf hashes (not entries)."""
    empty = _hasher(algo)[2]
    level = leaves
    if not level:
        return empty
    # Pairing bottom-up with the odd node carried gives the same tree as RFC 9162's
    # recursive split at the largest power of two.
    while len(level) > 1:
        paired = _pairs(level, algo)
        if len(level) & 1:
            paired.append(level[-1])
        level = paired
    return level[0]


def span_root(entries: Sequence[bytes], start: int, stop: int, algo: str = "blake3") -> bytes:
    """Return the root of positions ``[start, stop)`` of ``entries``.

    It is the fold of the span's compact range, which a store serves in O(log n) from
    stored subtree roots. It equals RFC 9162's Merkle Tree Hash of
    ``entries[start:stop]`` whenever ``start`` is a multiple of the smallest power of
    two >= ``stop - start`` (every prefix ``[0, n)`` among them).
    Requires ``0 <= start <= stop <= len(entries)``.
    """
    check_size("stop", stop, 0, len(entries))
    check_size("start", start, 0, stop)
    _hasher(algo)
    # Every leaf of the span in one call, then each piece of the compact range from them.
    return span_root_of_leaves(_leaves(entries[start:stop], algo), start, stop, algo, first=start)


def span_root_of_leaves(
    leaves: Sequence[bytes], start: int, stop: int, algo: str = "blake3", *, first: int = 0
) -> bytes:
    """Return :func:`span_root` of ``[start, stop)`` given leaf hashes (not entries).

    ``leaves[0]`` is the leaf of position ``first`` (default 0: every leaf from the
    start of the log), so a span's own leaves will do with ``first=start``.
    """
    check_size("stop", stop, first, first + len(leaves))
    check_size("start", start, first, stop)
    return fold(
        [root_of_leaves(leaves[(i << lv) - first : ((i + 1) << lv) - first], algo) for lv, i in cover(start, stop)], algo
    )


def inclusion_proof(entries: Sequence[bytes], index: int, algo: str = "blake3") -> list[bytes]:
    """Return the RFC 9162 inclusion proof of ``entries[index]`` in the tree of all entries.

    Requires ``0 <= index < len(entries)``.
    """
    check_size("index", index, 0, len(entries) - 1)
    spans = inclusion_spans(index, len(entries))
    levels = _levels(entries, algo)
    need = {c for a, b in spans for c in cover(a, b)}
    return spans_root(spans, _lookup(levels, need), algo)


def consistency_proof(entries: Sequence[bytes], old_size: int, algo: str = "blake3") -> list[bytes]:
    """Return the RFC 9162 consistency proof from the first ``old_size`` entries to all.

    Requires ``0 <= old_size <= len(entries)``.
    """
    check_size("old_size", old_size, 0, len(entries))
    spans = consistency_spans(old_size, len(entries))
    levels = _levels(entries, algo)
    need = {c for a, b in spans for c in cover(a, b)}
    return spans_root(spans, _lookup(levels, need), algo)


# --- verification: needs no store -----------------------------------------------


def _well_formed(hashes: Iterable[object]) -> bool:
    return all(isinstance(h, bytes) and len(h) == HASH_SIZE for h in hashes)


def root_from_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], algo: str = "blake3"
) -> bytes | None:
    """Return the root that ``proof`` implies for leaf hash ``leaf`` at ``index``.

    RFC 9162 section 2.1.3.2. Returns None when the proof cannot be valid for that
    index and size (wrong length, malformed hash).
    """
    node = _hasher(algo)[1]
    proof = list(proof)  # read once: it is checked, then walked
    if not (0 <= index < size) or not _well_formed([leaf, *proof]):
        return None
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return None
        if fn & 1 or fn == sn:
            r = node(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node(r, p)
        fn >>= 1
        sn >>= 1
    return r if sn == 0 else None


def verify_inclusion(
    entry: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes, algo: str = "blake3"
) -> bool:
    """Return whether ``proof`` shows ``entry`` at ``index`` in the tree of ``size`` with ``root``."""
    got = root_from_inclusion(_hasher(algo)[0](entry), index, size, proof, algo)
    return got is not None and got == root


def verify_inclusion_hash(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes, algo: str = "blake3"
) -> bool:
    """Return whether ``proof`` shows leaf hash ``leaf`` at ``index`` in the tree with ``root``."""
    got = root_from_inclusion(leaf, index, size, proof, algo)
    return got is not None and got == root


def verify_consistency(
    old_size: int,
    new_size: int,
    old_root: bytes,
    new_root: bytes,
    proof: Sequence[bytes],
    algo: str = "blake3",
) -> bool:
    """Return whether ``proof`` shows the tree ``(old_size, old_root)`` is a prefix of ``(new_size, new_root)``.

    RFC 9162 section 2.1.4.2, plus the trivial cases: equal sizes need an empty proof
    and equal roots; the empty tree (root ``H("")``) is a prefix of every tree, with an
    empty proof. Roots and proof hashes must be 32 bytes.
    """
    _, node, empty = _hasher(algo)
    proof = list(proof)  # read once: it is checked, then walked
    if not (0 <= old_size <= new_size) or not _well_formed([old_root, new_root, *proof]):
        return False
    if old_size == 0:
        return not proof and old_root == empty and (new_size > 0 or new_root == empty)
    if old_size == new_size:
        return not proof and old_root == new_root
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is the first node
        path.insert(0, old_root)
    if not path:
        return False
    fn, sn = old_size - 1, new_size - 1
    while fn & 1:
        fn >>= 1
        sn >>= 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr = node(c, fr)
            sr = node(c, sr)
            if not fn & 1:
                while fn and not fn & 1:
                    fn >>= 1
                    sn >>= 1
        else:
            sr = node(sr, c)
        fn >>= 1
        sn >>= 1
    return sn == 0 and fr == old_root and sr == new_root


# --- incremental appends ------------------------------------------------------------


class Frontier:
    """The compact range ``[0, size)`` of a growing tree: O(log n) hashes, O(log n) per append.

    ``append`` returns the interior subtrees it completes, so a store can persist them
    and later serve span roots and proofs without rehashing.
    """

    __slots__ = ("size", "hashes", "_node", "_algo")

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = (), algo: str = "blake3") -> None:
        """Start from ``hashes``, the roots of ``cover(0, size)`` left to right."""
        if len(hashes) != len(cover(0, size)):
            raise InvalidArgument("hashes", f"size {size} needs {len(cover(0, size))} roots, got {len(hashes)}")
        self.size = size
        self.hashes = list(hashes)
        self._node = _hasher(algo)[1]
        self._algo = algo

    def append(self, leaf: bytes) -> list[tuple[int, int, bytes]]:
        """Add leaf hash ``leaf``; return the completed subtrees as ``(level, index, root)``, lowest first."""
        made: list[tuple[int, int, bytes]] = []
        hashes, node = self.hashes, self._node
        hashes.append(leaf)
        self.size = n = self.size + 1
        level = 0
        # Each trailing 1-bit of the old size is a pair of equal subtrees to merge.
        while not (n >> level) & 1:
            right = hashes.pop()
            merged = node(hashes.pop(), right)
            hashes.append(merged)
            level += 1
            made.append((level, (n >> level) - 1, merged))
        return made

    def extend(self, leaves: Iterable[bytes], *, every: int = 1) -> list[tuple[int, int, bytes]]:
        """Add leaf hashes ``leaves`` in order; return the completed subtrees as ``(level, index, root)``.

        The subtrees come level by level from the lowest, each level left to right;
        with ``every``, only those at levels that are multiples of it.
        """
        cur = list(leaves)
        if len(cur) == 1:  # no hasher of its own to set up
            return [m for m in self.append(cur[0]) if m[0] % every == 0]
        made: list[tuple[int, int, bytes]] = []
        hashes, old = self.hashes, self.size
        self.size = old + len(cur)
        node = _node_fn(self._algo)
        # One level at a time: the roots completed at this level, paired with each other
        # (and first with the frontier's root of this level, if it holds one).
        kept: list[bytes] = []  # an unpaired last root per level, lowest level first
        level = 0
        while cur:
            first = old >> level
            if first & 1:  # the frontier's root at this level is the left sibling of cur[0]
                cur.insert(0, hashes.pop())
                first -= 1
            if len(cur) & 1:
                kept.append(cur.pop())
            cur = [node(cur[i], cur[i + 1]) for i in range(0, len(cur), 2)]
            level += 1
            first >>= 1
            if level % every == 0:
                made += [(level, first + j, h) for j, h in enumerate(cur)]
        hashes += reversed(kept)
        return made

    def root(self) -> bytes:
        """Return the RFC 9162 root of the tree so far."""
        return fold(self.hashes, self._algo)

    def extend_root(self, leaves: Iterable[bytes], *, every: int = 1) -> tuple[list[tuple[int, int, bytes]], bytes]:
        """Add leaf hashes ``leaves`` as :meth:`extend` does; return what it returns and then the new :meth:`root`."""
        made = self.extend(leaves, every=every)
        return made, self.root()

    def copy(self) -> Self:
        """Return an independent copy."""
        # Not through __init__: this frontier's hashes are already known to fit its size.
        other = type(self).__new__(type(self))
        other.size, other.hashes, other._node, other._algo = self.size, list(self.hashes), self._node, self._algo
        return other

    def append_subtree(self, level: int, root: bytes) -> list[tuple[int, int, bytes]]:
        """Add ``root``, the root of the ``2**level`` leaves from ``size`` on, all at once.

        The same as appending those leaves one by one, in O(log n): returns the
        completed subtrees above ``level`` as ``(level, index, root)``. Requires
        ``size`` to be a multiple of ``2**level``.
        """
        if self.size & ((1 << level) - 1):
            raise InvalidArgument("level", f"size {self.size} is not a multiple of 2**{level}")
        made: list[tuple[int, int, bytes]] = []
        hashes = self.hashes
        hashes.append(root)
        self.size += 1 << level
        n = self.size >> level
        # As in append, from this level up: each trailing 1-bit of the old count is a merge.
        while n & 1 == 0:
            right = hashes.pop()
            merged = self._node(hashes.pop(), right)
            hashes.append(merged)
            n >>= 1
            level += 1
            made.append((level, n - 1, merged))
        return made
