"""The content digest of a span: one BLAKE3 over its bodies, in order.

A compaction records it so that a restoration can certify the exact bodies a node
replaced with one hash, instead of rebuilding the span's Merkle root.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Sequence

from blake3 import blake3

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
    h = blake3(CONTENT_TAG)
    lengths: list[int] = []
    for chunk in chunks:
        h.update(b"".join(chunk))
        lengths.extend(map(len, chunk))
    n = len(lengths)
    h.update(struct.pack(f">{n}QQ", *lengths, n))
    return h.digest()


def unhex(text: str | None) -> bytes | None:
    """Return the bytes of a hex digest, or None for an absent or malformed one (it certifies nothing)."""
    if text is None:
        return None
    try:
        return bytes.fromhex(text)
    except ValueError:
        return None
