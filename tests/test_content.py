"""The content digest fed batch by batch: the native digest gives the pure reference's bytes."""

from __future__ import annotations

import os
import random
import struct
import subprocess
import sys

import pytest
from blake3 import blake3

from compactstore import content, merkle
from compactstore.content import CONTENT_TAG, ContentDigest


def _whole(bodies: list[bytes]) -> bytes:
    """The digest by its definition: one BLAKE3 over the tag, the bodies, their lengths and number."""
    n = len(bodies)
    return blake3(CONTENT_TAG + b"".join(bodies) + struct.pack(f">{n}QQ", *map(len, bodies), n)).digest()


def _spans() -> list[list[bytes]]:
    """Spans of every size class: empty bodies, one-chunk turns, long turns, bodies past the native buffer."""
    rng = random.Random(7)
    sizes = [
        [], [0], [0, 0, 5], [1400] * 1000, [32 * 1024] * 40, [65535, 1, 65536, 65537, 3], [300_000, 7, 1 << 20],
        [rng.randrange(6000) for _ in range(700)],
    ]
    return [[rng.randbytes(n) for n in span] for span in sizes]


def _native() -> content.Digester:
    got = merkle.content_digest(CONTENT_TAG)
    if got is None:
        pytest.skip("compactstore.native is not in use: not built, or COMPACTSTORE_PURE=1")
    return got


@pytest.mark.parametrize("batch", [1, 64, 10_000])
def test_native_and_pure_digests_are_the_definition_in_any_batches(batch: int) -> None:
    """Fed in batches of any size, small and large (the native digest releases the GIL on large ones), both give the same bytes."""
    for bodies in _spans():
        want = _whole(bodies)
        pure, native = ContentDigest(), _native()
        for i in range(0, len(bodies), batch):
            pure.update(bodies[i : i + batch])
            native.update(bodies[i : i + batch])
        assert pure.digest() == native.digest() == want == content.content_digest(bodies)
        assert native.digest() == want  # the same on a second call


def test_both_refuse_a_missing_body_and_an_update_after_the_digest() -> None:
    """None (a redacted body) is a TypeError in a batch; once the digest is taken, no more bodies go in."""
    bodies = [b"x" * 200_000, b"y" * 200_000]
    for d in (ContentDigest(), _native()):
        d.update(bodies[:1])
        with pytest.raises(TypeError):
            d.update([bodies[1], None])  # type: ignore[list-item]
        d.digest()
        with pytest.raises(ValueError):
            d.update(bodies)


def test_the_pure_path_digest_is_the_reference() -> None:
    """With COMPACTSTORE_PURE=1 the digest in use is the pure one, and gives the same bytes."""
    code = (
        "from compactstore import content, merkle\n"
        "assert merkle.IMPLEMENTATION == 'pure' and type(content.digester()) is content.ContentDigest\n"
        "print(content.content_digest([b'a' * 300_000, b'', b'b']).hex())\n"
    )
    got = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True, timeout=60,
                         env={**os.environ, "COMPACTSTORE_PURE": "1"})
    assert got.stdout.strip() == _whole([b"a" * 300_000, b"", b"b"]).hex()
