"""Types of ``compactstore.native``, the Rust extension behind :mod:`compactstore.merkle`
(and the canonical encoder of :mod:`compactstore.events`).

Each function gives the bytes of its namesake in ``compactstore.merkle_pure`` for BLAKE3.
Hashes are 32-byte ``bytes``; where a list of hashes holds anything else, ValueError.
Sizes, positions and indices are unsigned 64-bit integers.
"""

from collections.abc import Callable, Iterable, Sequence
from typing import Any

def leaf_hash(entry: bytes, /) -> bytes:
    """Return ``H(0x00 || entry)``."""

def leaf_hashes(entries: Sequence[bytes], /) -> list[bytes]:
    """Return ``H(0x00 || entry)`` of each entry, in order: on every core when the batch is large."""

def node_hash(left: bytes, right: bytes, /) -> bytes:
    """Return ``H(0x01 || left || right)``."""

def tree_root(entries: Sequence[bytes], /) -> bytes:
    """Return the RFC 9162 Merkle Tree Hash of ``entries``."""

def root_of_leaves(leaves: Iterable[bytes], /) -> bytes:
    """Return the RFC 9162 root over leaf hashes."""

def subtree_levels(leaves: Iterable[bytes], /) -> list[list[bytes]]:
    """Return the roots of every complete aligned subtree over leaf hashes, level by level."""

def span_root(entries: Sequence[bytes], start: int, stop: int, /) -> bytes:
    """Return the root of ``[start, stop)`` given the entries of exactly those positions."""

def span_root_of_leaves(leaves: Iterable[bytes], start: int, stop: int, /) -> bytes:
    """Return the root of ``[start, stop)`` given the leaf hashes of exactly those positions."""

def fold(hashes: Iterable[bytes], /) -> bytes:
    """Return the root of a compact range's hashes, merged right to left (the empty root for none)."""

def inclusion_proof(entries: Sequence[bytes], index: int, /) -> list[bytes]:
    """Return the RFC 9162 inclusion proof of ``entries[index]``. Requires ``index < len(entries)``."""

def consistency_proof(entries: Sequence[bytes], old_size: int, /) -> list[bytes]:
    """Return the RFC 9162 consistency proof from the first ``old_size`` entries to all."""

def root_from_inclusion(leaf: bytes, index: int, size: int, proof: Iterable[bytes], /) -> bytes | None:
    """Return the root that ``proof`` implies for ``leaf`` at ``index``, or None when it cannot be valid."""

def verify_consistency(
    old_size: int, new_size: int, old_root: bytes, new_root: bytes, proof: Iterable[bytes], /
) -> bool:
    """Return whether ``proof`` shows ``(old_size, old_root)`` is a prefix of ``(new_size, new_root)``."""

def frontier_extend(
    size: int, hashes: Iterable[bytes], leaves: Iterable[bytes], every: int, /
) -> tuple[list[bytes], list[tuple[int, int, bytes]]]:
    """Add leaf hashes to the frontier of a tree of ``size`` leaves.

    Returns the new frontier and the completed subtrees ``(level, index, root)`` at
    levels that are multiples of ``every`` (at least 1).
    """

def frontier_push(
    size: int, hashes: list[bytes], leaves: Iterable[bytes], every: int, /
) -> tuple[list[tuple[int, int, bytes]], bytes]:
    """Add leaf hashes to the frontier ``hashes`` of a tree of ``size`` leaves, in place.

    Returns the completed subtrees ``(level, index, root)`` at levels that are multiples
    of ``every`` (at least 1) and the new tree's root; ``hashes`` is unchanged when an
    argument is refused.
    """

def digest(data: bytes, key: bytes | None) -> bytes:
    """Return the BLAKE3 hash of ``data``, keyed with the 32-byte ``key`` unless it is None."""

class ContentDigest:
    """The content digest of :mod:`compactstore.content` under a tag, fed batch by batch.

    Gives the bytes of ``compactstore.content.ContentDigest``; each batch is hashed as it
    is given, the GIL released for a large one.
    """

    def __init__(self, tag: bytes, /) -> None: ...
    def update(self, bodies: Iterable[bytes], /) -> None:
        """Add the next bodies, in order; TypeError for one that is not bytes or bytearray (None)."""

    def digest(self) -> bytes:
        """Return the 32-byte digest of every body added (the same on every later call)."""

class Encoder:
    """The canonical JSON of plain events, byte for byte what ``compactstore.events`` encodes with msgspec.

    Built by :mod:`compactstore.events` from its plans: per event type, the kind tag's bytes
    and each field's ``(name, key bytes, check, nullable, literal values, omit, default,
    nonempty, nonneg, stamped, absent)``, in the order msgspec writes them.
    """

    def __init__(self, plans: list[tuple[type, list[bytes | tuple[object, ...]]]], limit: int, depth: int, /) -> None: ...
    def encode(
        self, events: list[Any], start: int, clock: Callable[[], Any], scale: Any, /
    ) -> tuple[list[bytes], list[int], list[Any], int]:
        """Stamp (``clock() // scale``, ``scale`` >= 1) and encode ``events[start:]`` up to the first it does not take.

        Returns the bytes of those taken, the stamps read and the events read (the last of
        each the one not taken's, when there is one), and the index of the one not taken
        (``len(events)`` when none). The clock is read before each event is taken from
        the list. An event with a ``ts`` or an idempotency key of its own is not taken.
        """
