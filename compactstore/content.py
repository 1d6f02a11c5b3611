"""The content digest of a span: one BLAKE3 over its bodies, in order.

A compaction records it so that a restoration can certify the exact bodies a node
replaced with one hash, instead of rebuilding the span's Merkle root.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Iterable, Sequence
from typing import Protocol

from blake3 import blake3

from . import merkle

#: The types a body may be, tested in C before the slower isinstance (subclasses).
_BODIES = frozenset({bytes, bytearray})
#: Separates a span's content digest from every other BLAKE3 input in the store.
CONTENT_TAG = b"compactstore/span-content/v1\x00"


def content_digest(bodies: Sequence[bytes]) -> bytes:
    """Return the content digest of a span: one BLAKE3 over its bodies, in order.

    The input is ``CONTENT_TAG``, the bodies back to back, then each body's length and
    their number (8-byte big-endian integers). The lengths make the encoding injective,
    so a missing, extra, reordered or altered body changes the digest; the bodies go
    in as one buffer, which BLAKE3 hashes several chunks at a time (a body at a time
    it could not), and the lengths after them, so a long span can be streamed.
    """
    return content_digest_of([bodies])


def content_digest_of(chunks: Iterable[Sequence[bytes]]) -> bytes:
    """Return :func:`content_digest` of the bodies of ``chunks`` taken in order, streaming."""
    d = digester()
    for chunk in chunks:
        d.update(chunk)
    return d.digest()


class Digester(Protocol):
    """A content digest fed batch by batch: :class:`ContentDigest` or its native namesake."""

    def update(self, bodies: Iterable[bytes], /) -> None:
        """Add the next bodies, in order (TypeError for one that is not bytes or bytearray, such as None)."""
        ...

    def digest(self) -> bytes:
        """Return the content digest of every body added."""
        ...


class ContentDigest:
    """The content digest fed batch by batch: the reference the native digest matches byte for byte.

    As the native digest, it may be shared between threads: each update adds its batch whole.
    """

    def __init__(self) -> None:
        """Start a digest of no bodies."""
        self._hash = blake3(CONTENT_TAG)
        self._lengths: list[int] = []
        self._done: bytes | None = None
        self._lock = threading.Lock()

    def update(self, bodies: Iterable[bytes], /) -> None:
        """Add the next bodies, in order (TypeError for one that is not bytes or bytearray, such as None).

        A list or tuple is read as it is; any other iterable once, as ``list(bodies)`` reads it.
        """
        listed = bodies if type(bodies) is list or type(bodies) is tuple else list(bodies)
        if not _BODIES.issuperset(map(type, listed)) and not all(isinstance(b, (bytes, bytearray)) for b in listed):
            raise TypeError("a body is not bytes")
        with self._lock:
            if self._done is not None:
                raise ValueError("the digest was taken: start another")
            self._hash.update(b"".join(listed))
            self._lengths.extend(map(len, listed))

    def digest(self) -> bytes:
        """Return the content digest of every body added (the same on every later call)."""
        with self._lock:
            if self._done is None:
                n = len(self._lengths)
                self._hash.update(struct.pack(f">{n}QQ", *self._lengths, n))
                self._done = self._hash.digest()
            return self._done


def digester() -> Digester:
    """Return an empty content digest to feed, batch by batch.

    Natively (see :data:`compactstore.merkle.IMPLEMENTATION`) it hashes each batch as it
    is given, short bodies copied into one buffer so that BLAKE3 hashes their chunks side
    by side, with the GIL released for a large batch; otherwise :class:`ContentDigest`.
    """
    native = merkle.content_digest(CONTENT_TAG)
    return ContentDigest() if native is None else native


def unhex(text: str | None) -> bytes | None:
    """Return the bytes of a hex digest, or None for an absent or malformed one (it certifies nothing)."""
    if text is None:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None
