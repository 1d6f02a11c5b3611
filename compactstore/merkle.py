"""Merkle trees in the RFC 9162 shape: roots, span roots, proofs and their verification.

A leaf is ``H(0x00 || entry)`` and an interior node ``H(0x01 || left || right)``; the
two prefixes keep a leaf from ever being passed off as a node (the second-preimage
attack on plain Merkle trees). The hash is BLAKE3 by default; ``algo="sha256"``
gives exactly RFC 6962 / RFC 9162, which is how the published test vectors are checked.

Everything here is pure: functions over in-memory entries (leaf data, not hashes),
plus the coordinate arithmetic a store uses to serve the same answers from stored
subtree roots in O(log n). A subtree is named by ``(level, index)``: it covers
positions ``[index << level, (index + 1) << level)``; level 0 is a leaf.

Two implementations give the same bytes: ``compactstore.merkle_pure``, the pure-Python
reference, and ``compactstore.native``, a Rust extension that hashes BLAKE3 leaves and
nodes through the blake3 crate's stable API (every core for large batches) with the GIL
released. BLAKE3 runs natively when the extension is built, unless
the environment sets ``COMPACTSTORE_PURE=1``; :data:`IMPLEMENTATION` says which. SHA-256,
and hashes that are not 32 bytes where hashes are expected, always take the reference.

What keeps the two alike for any argument: the native module reads only what it sees
exactly as Python would (an exact list or tuple, exact ``bytes`` for a hash, ``bytes`` or
``bytearray`` for an entry, sizes within u64), never trusts a reported length, and
refuses anything else with TypeError, ValueError or OverflowError; each function here
then hands the same argument to the reference, which reads it by Python's protocols. An
iterable argument is read once, before either path sees it.
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Callable, Iterable, Mapping, Sequence

from . import merkle_pure
from .merkle_pure import ALGOS as ALGOS
from .merkle_pure import HASH_SIZE as HASH_SIZE
from .merkle_pure import LEAF_PREFIX as LEAF_PREFIX
from .merkle_pure import NODE_PREFIX as NODE_PREFIX
from .merkle_pure import TILE_HEIGHT as TILE_HEIGHT
from .merkle_pure import Coord as Coord
from .merkle_pure import Span as Span
from .merkle_pure import check_size
from .merkle_pure import consistency_spans as consistency_spans
from .merkle_pure import cover as cover
from .merkle_pure import empty_root as empty_root
from .merkle_pure import inclusion_spans as inclusion_spans
from .merkle_pure import is_stored as is_stored

if os.environ.get("COMPACTSTORE_PURE", "") in ("", "0"):
    try:
        from . import native
    except ImportError:  # a source tree whose extension is not built
        native = None  # type: ignore[assignment]
else:
    native = None  # type: ignore[assignment]

IMPLEMENTATION = "pure" if native is None else "native"
"""Which implementation hashes BLAKE3 trees in this process: ``"native"`` or ``"pure"``."""

# Sizes and positions the native module takes: unsigned 64-bit. Beyond them (no real
# tree is that large) the reference answers.
_U64 = 1 << 64


#: What the native module raises for an argument it does not read as Python would (a
#: container that is not an exact list or tuple, an item that is not exact bytes, a size
#: past u64): the reference then answers, so both paths answer alike.
_DECLINED = (TypeError, ValueError, OverflowError)


def _listed(items: Iterable[bytes]) -> Sequence[bytes]:
    """Return ``items`` read once: an exact list or tuple as it is, anything else through its iterator."""
    return items if type(items) is list or type(items) is tuple else list(items)


def digest_fn() -> Callable[[bytes, bytes | None], bytes]:
    """Return ``digest(data, key)``: the BLAKE3 hash of ``data``, keyed with the 32-byte ``key`` unless it is None.

    One call, where the ``blake3`` package makes a hasher object per hash (a head's seal
    is one such hash on every commit).
    """
    if native is not None:
        return native.digest
    return merkle_pure.digest


def content_digest(tag: bytes) -> native.ContentDigest | None:
    """Return the native content digest of :mod:`compactstore.content` under ``tag``, None on the pure path."""
    return None if native is None else native.ContentDigest(tag)


def leaf_fn(algo: str = "blake3") -> Callable[[bytes], bytes]:
    """Return a leaf hasher for a loop of the calling thread (not to be handed to another)."""
    if algo == "blake3" and native is not None:
        return native.leaf_hash
    return merkle_pure.leaf_fn(algo)


def leaf_hash(entry: bytes, algo: str = "blake3") -> bytes:
    """Return ``H(0x00 || entry)``."""
    if algo == "blake3" and native is not None:
        try:
            return native.leaf_hash(entry)
        except _DECLINED:
            pass
    return merkle_pure.leaf_hash(entry, algo)


def leaf_hashes(entries: Iterable[bytes], algo: str = "blake3") -> list[bytes]:
    """Return ``H(0x00 || entry)`` of each entry, in order (cheaper than one call per entry)."""
    listed = _listed(entries)
    if algo == "blake3" and native is not None:
        try:
            if len(listed) == 1:  # one append's leaf: hashed in place, the GIL kept for a short one
                return [native.leaf_hash(listed[0])]
            return native.leaf_hashes(listed)
        except _DECLINED:
            pass
    return merkle_pure.leaf_hashes(listed, algo)


def node_hash(left: bytes, right: bytes, algo: str = "blake3") -> bytes:
    """Return ``H(0x01 || left || right)``."""
    if algo == "blake3" and native is not None:
        try:
            return native.node_hash(left, right)
        except _DECLINED:
            pass
    return merkle_pure.node_hash(left, right, algo)


def fold(hashes: Sequence[bytes], algo: str = "blake3") -> bytes:
    """Return the root of a compact range's hashes (left to right), merged right to left.

    For the compact range of ``[0, n)`` this is the RFC 9162 tree root of size n; for
    an empty sequence it is the empty root.
    """
    if algo == "blake3" and native is not None:
        try:
            return native.fold(hashes)
        except _DECLINED:
            pass
    return merkle_pure.fold(hashes, algo)


def subtree_levels(leaves: Sequence[bytes], algo: str = "blake3") -> list[list[bytes]]:
    """Return the roots of every complete aligned subtree over leaf hashes, level by level.

    ``levels[l][i]`` is the root of ``(l, i)``; a level ends at its last complete
    subtree, and the list ends at the level of the largest one.
    """
    if algo == "blake3" and native is not None:
        try:
            return native.subtree_levels(leaves)
        except _DECLINED:
            pass
    return merkle_pure.subtree_levels(leaves, algo)


def resolve(
    coords: Iterable[Coord], fetch: Callable[[list[Coord]], list[bytes]], algo: str = "blake3"
) -> dict[Coord, bytes]:
    """Return the roots at ``coords``, fetching only stored levels and hashing up the rest.

    ``fetch`` returns the roots of a list of distinct stored coordinates, in order; it
    is called once (not at all when ``coords`` is empty). As the reference
    :func:`compactstore.merkle_pure.resolve`, each run of stored roots below a level
    that is not stored hashed up in one call (natively for BLAKE3).
    """
    if algo == "blake3" and native is not None:
        return merkle_pure.resolve(coords, fetch, algo, hash_run=root_of_leaves)
    return merkle_pure.resolve(coords, fetch, algo)


def spans_root(spans: Iterable[Span], lookup: Mapping[Coord, bytes], algo: str = "blake3") -> list[bytes]:
    """Return the root of each span from stored subtree roots (``lookup`` by coordinate)."""
    return [fold([lookup[c] for c in cover(a, b)], algo) for a, b in spans]


def serve(spans: Sequence[Span], fetch: Callable[[list[Coord]], list[bytes]], algo: str = "blake3") -> list[bytes]:
    """Return the root of each span from stored subtree roots, all fetched by one ``fetch`` call.

    The same as ``spans_root(spans, resolve(covers, fetch))`` with each span's compact
    range computed once: how a store serves proofs and span roots.
    """
    covers = [cover(a, b) for a, b in spans]
    lookup = resolve([c for cs in covers for c in cs], fetch, algo)
    return [fold([lookup[c] for c in cs], algo) for cs in covers]


def tree_root(entries: Sequence[bytes], algo: str = "blake3") -> bytes:
    """Return the RFC 9162 Merkle Tree Hash of ``entries``."""
    if algo == "blake3" and native is not None:
        try:
            return native.tree_root(entries)
        except _DECLINED:
            pass
    return merkle_pure.tree_root(entries, algo)


def root_of_leaves(leaves: Sequence[bytes], algo: str = "blake3") -> bytes:
    """Return the RFC 9162 root over leaf hashes (not entries)."""
    if algo == "blake3" and native is not None:
        try:
            return native.root_of_leaves(leaves)
        except _DECLINED:
            pass
    return merkle_pure.root_of_leaves(leaves, algo)


def span_root(entries: Sequence[bytes], start: int, stop: int, algo: str = "blake3") -> bytes:
    """Return the root of positions ``[start, stop)`` of ``entries``.

    It is the fold of the span's compact range, which a store serves in O(log n) from
    stored subtree roots. It equals RFC 9162's Merkle Tree Hash of
    ``entries[start:stop]`` whenever ``start`` is a multiple of the smallest power of
    two >= ``stop - start`` (every prefix ``[0, n)`` among them).
    Requires ``0 <= start <= stop <= len(entries)``.
    """
    if algo == "blake3" and native is not None:
        check_size("stop", stop, 0, len(entries))
        check_size("start", start, 0, stop)
        try:
            return native.span_root(entries[start:stop], start, stop)
        except _DECLINED:
            pass
    return merkle_pure.span_root(entries, start, stop, algo)


def span_root_of_leaves(
    leaves: Sequence[bytes], start: int, stop: int, algo: str = "blake3", *, first: int = 0
) -> bytes:
    """Return :func:`span_root` of ``[start, stop)`` given leaf hashes (not entries).

    ``leaves[0]`` is the leaf of position ``first`` (default 0: every leaf from the
    start of the log), so a span's own leaves will do with ``first=start``.
    """
    if algo == "blake3" and native is not None and 0 <= first and stop < _U64:
        check_size("stop", stop, first, first + len(leaves))
        check_size("start", start, first, stop)
        try:
            return native.span_root_of_leaves(leaves[start - first : stop - first], start, stop)
        except _DECLINED:
            pass
    return merkle_pure.span_root_of_leaves(leaves, start, stop, algo, first=first)


def inclusion_proof(entries: Sequence[bytes], index: int, algo: str = "blake3") -> list[bytes]:
    """Return the RFC 9162 inclusion proof of ``entries[index]`` in the tree of all entries.

    Requires ``0 <= index < len(entries)``.
    """
    if algo == "blake3" and native is not None:
        check_size("index", index, 0, len(entries) - 1)
        try:
            return native.inclusion_proof(entries, index)
        except _DECLINED:
            pass
    return merkle_pure.inclusion_proof(entries, index, algo)


def consistency_proof(entries: Sequence[bytes], old_size: int, algo: str = "blake3") -> list[bytes]:
    """Return the RFC 9162 consistency proof from the first ``old_size`` entries to all.

    Requires ``0 <= old_size <= len(entries)``.
    """
    if algo == "blake3" and native is not None:
        check_size("old_size", old_size, 0, len(entries))
        try:
            return native.consistency_proof(entries, old_size)
        except _DECLINED:
            pass
    return merkle_pure.consistency_proof(entries, old_size, algo)


def run_root_with(
    start: int,
    leaves: Sequence[bytes],
    size: int,
    fetch: Callable[[list[Coord]], list[bytes]],
    algo: str = "blake3",
) -> bytes:
    """Return the root of ``[0, size)`` from the leaf hashes of the run ``[start, start + len(leaves))`` and stored roots for the rest.

    The same as :func:`root_with` over those leaves, for a contiguous run: each aligned
    subtree inside the run is hashed from its leaves in one call (natively for BLAKE3),
    so the Python work is O(log n) nodes however long the run; each subtree outside it
    comes from one ``fetch`` call, as :func:`resolve` serves it. The root equals a
    tree's root only if every leaf of the run is the tree's leaf at its position.

    Requires ``0 <= start`` and ``start + len(leaves) <= size``.

    Raises:
        InvalidArgument: the run does not lie in ``[0, size)``.
    """
    stop = start + len(leaves)
    check_size("start", start, 0, size)
    check_size("size", size, stop, size)
    need: list[Coord] = []

    def plan(level: int, idx: int) -> None:
        lo, hi = idx << level, (idx + 1) << level
        if hi <= start or lo >= stop:
            need.append((level, idx))
        elif not (start <= lo and hi <= stop):
            plan(level - 1, 2 * idx)
            plan(level - 1, 2 * idx + 1)

    tops = cover(0, size)
    for level, idx in tops:
        plan(level, idx)
    stored = resolve(need, fetch, algo) if need else {}

    def root(level: int, idx: int) -> bytes:
        lo, hi = idx << level, (idx + 1) << level
        if hi <= start or lo >= stop:
            return stored[(level, idx)]
        if start <= lo and hi <= stop:
            # A complete power-of-two subtree: its root is the tree root of its leaves.
            return root_of_leaves(leaves[lo - start : hi - start], algo)
        return node_hash(root(level - 1, 2 * idx), root(level - 1, 2 * idx + 1), algo)

    return fold([root(level, idx) for level, idx in tops], algo)


def root_with(
    leaves: Mapping[int, bytes], size: int, fetch: Callable[[list[Coord]], list[bytes]], algo: str = "blake3"
) -> bytes:
    """Return the root of ``[0, size)`` from the leaf hashes given and stored subtree roots for the rest.

    The same answer, contract and single ``fetch`` call as the reference
    :func:`compactstore.merkle_pure.root_with`. Levels between stored ones are not
    stored, so a stored tile (a subtree of ``TILE_HEIGHT`` levels) that holds a given
    position needs all its leaves anyway: here each such tile is hashed from its
    leaves in one native call, and only the levels above the tiles are walked in Python.

    Requires ``size >= 0`` and ``0 <= pos < size`` for each given position.

    Raises:
        InvalidArgument: ``size`` is negative, a given position lies outside
            ``[0, size)``, or ``algo`` is unknown.
    """
    if algo != "blake3" or native is None or size < 0 or not leaves:
        return merkle_pure.root_with(leaves, size, fetch, algo)
    known = sorted(leaves)
    if not (0 <= known[0] and known[-1] < size):
        return merkle_pure.root_with(leaves, size, fetch, algo)  # raises, naming the position

    def holds_given(level: int, idx: int) -> bool:
        k = bisect_left(known, idx << level)
        return k < len(known) and known[k] < (idx + 1) << level

    # As the reference plans, except that a tile holding a given position is not split:
    # its leaves that are not given come from the store, all in the same fetch.
    need: list[Coord] = []
    tiles: list[int] = []

    def plan(level: int, idx: int) -> None:
        if not holds_given(level, idx):
            need.append((level, idx))
        elif level == TILE_HEIGHT:
            tiles.append(idx)
            need.extend((0, j) for j in range(idx << level, (idx + 1) << level) if j not in leaves)
        elif level:
            plan(level - 1, 2 * idx)
            plan(level - 1, 2 * idx + 1)

    tops = cover(0, size)
    for level, idx in tops:
        plan(level, idx)
    stored = resolve(need, fetch, algo)
    for t in tiles:
        row = [leaves[j] if j in leaves else stored[(0, j)] for j in range(t << TILE_HEIGHT, (t + 1) << TILE_HEIGHT)]
        stored[(TILE_HEIGHT, t)] = root_of_leaves(row, algo)

    def root(level: int, idx: int) -> bytes:
        got = stored.get((level, idx))
        if got is not None:
            return got
        if level == 0:
            return leaves[idx]
        return node_hash(root(level - 1, 2 * idx), root(level - 1, 2 * idx + 1), algo)

    return fold([root(level, idx) for level, idx in tops], algo)


# --- verification: needs no store -----------------------------------------------


def root_from_inclusion(
    leaf: bytes, index: int, size: int, proof: Sequence[bytes], algo: str = "blake3"
) -> bytes | None:
    """Return the root that ``proof`` implies for leaf hash ``leaf`` at ``index``.

    RFC 9162 section 2.1.3.2. Returns None when the proof cannot be valid for that
    index and size (wrong length, malformed hash).
    """
    if algo == "blake3" and native is not None and 0 <= index < size < _U64:
        try:
            return native.root_from_inclusion(leaf, index, size, proof)
        except _DECLINED:
            pass
    return merkle_pure.root_from_inclusion(leaf, index, size, proof, algo)


def verify_inclusion(
    entry: bytes, index: int, size: int, proof: Sequence[bytes], root: bytes, algo: str = "blake3"
) -> bool:
    """Return whether ``proof`` shows ``entry`` at ``index`` in the tree of ``size`` with ``root``."""
    got = root_from_inclusion(leaf_hash(entry, algo), index, size, proof, algo)
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
    if algo == "blake3" and native is not None and 0 <= old_size <= new_size < _U64:
        try:
            return native.verify_consistency(old_size, new_size, old_root, new_root, proof)
        except _DECLINED:
            pass
    return merkle_pure.verify_consistency(old_size, new_size, old_root, new_root, proof, algo)


# --- incremental appends ------------------------------------------------------------


class Frontier(merkle_pure.Frontier):
    """The compact range ``[0, size)`` of a growing tree: O(log n) hashes, O(log n) per append.

    ``append`` returns the interior subtrees it completes, so a store can persist them
    and later serve span roots and proofs without rehashing.
    """

    __slots__ = ()

    def __init__(self, size: int = 0, hashes: Sequence[bytes] = (), algo: str = "blake3") -> None:
        """Start from ``hashes``, the roots of ``cover(0, size)`` left to right."""
        super().__init__(size, hashes, algo)
        if algo == "blake3" and native is not None:
            self._node = native.node_hash

    def extend(self, leaves: Iterable[bytes], *, every: int = 1) -> list[tuple[int, int, bytes]]:
        """Add leaf hashes ``leaves`` in order; return the completed subtrees as ``(level, index, root)``.

        The subtrees come level by level from the lowest, each level left to right;
        with ``every``, only those at levels that are multiples of it.
        """
        cur = _listed(leaves)
        if self._algo == "blake3" and native is not None and self.size + len(cur) < _U64:
            try:
                hashes, made = native.frontier_extend(self.size, self.hashes, cur, every)
            except _DECLINED:  # not all 32-byte hashes, every not an int >= 1, ...
                pass
            else:
                self.hashes[:] = hashes
                self.size += len(cur)
                return made
        return super().extend(cur, every=every)

    def root(self) -> bytes:
        """Return the RFC 9162 root of the tree so far."""
        return fold(self.hashes, self._algo)

    def extend_root(self, leaves: Iterable[bytes], *, every: int = 1) -> tuple[list[tuple[int, int, bytes]], bytes]:
        """Add leaf hashes ``leaves`` as :meth:`extend` does; return what it returns and then the new :meth:`root`.

        One native call for both, every commit's step: the roots the leaves leave alone are kept as they are.
        """
        cur = _listed(leaves)
        if self._algo == "blake3" and native is not None and self.size + len(cur) < _U64:
            try:
                made, root = native.frontier_push(self.size, self.hashes, cur, every)
            except _DECLINED:  # not all 32-byte hashes, every not an int >= 1, not a list, ...
                pass
            else:
                self.size += len(cur)
                return made, root
        return super().extend_root(cur, every=every)
