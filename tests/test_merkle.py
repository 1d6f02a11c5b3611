"""Tests of compactstore.merkle against a naive RFC 9162 oracle and published vectors."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import multiprocessing
import os
import subprocess
import sys
from collections.abc import Callable
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any, cast

import naive_merkle as naive
import pytest
import strategies as sts
from blake3 import blake3
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from compactstore import InvalidArgument, merkle_pure
from compactstore import merkle as public_merkle

VECTORS = Path(__file__).parent / "vectors"
ALGOS = public_merkle.ALGOS

# Distinct entries of varying length, the empty one first.
ENTRIES = [b"e" * (i % 5) + i.to_bytes(2, "big") if i else b"" for i in range(256)]

FAST = settings(max_examples=40, deadline=None)
FEW = settings(max_examples=15, deadline=None)

# Tampering tests draw trees of distinct entries: where entries repeat, a proof for one
# position can honestly be a proof for another (entries [a, b, a, b], index 0 and 2).
DISTINCT = sts.any_entry_lists(300, unique=True)

IMPLEMENTATIONS = {"native": public_merkle, "pure": merkle_pure}
"""compactstore.merkle (native for BLAKE3 when built) and the pure reference it is held to."""


@pytest.fixture(scope="module", params=sorted(IMPLEMENTATIONS))
def merkle(request: pytest.FixtureRequest) -> ModuleType:
    """Each implementation in turn, so that every test here runs on both."""
    if request.param == "native" and public_merkle.IMPLEMENTATION != "native":
        pytest.skip("compactstore.native is not in use: not built, or COMPACTSTORE_PURE=1")
    return IMPLEMENTATIONS[request.param]


@cache
def rfc6962() -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((VECTORS / "rfc6962_vectors.json").read_text(encoding="utf-8")))


@cache
def golden() -> dict[str, Any]:
    return cast(dict[str, Any], json.loads((VECTORS / "blake3_vectors.json").read_text(encoding="utf-8")))


@cache
def roots(algo: str, n: int = 130) -> list[bytes]:
    return [naive.mth(ENTRIES[:i], algo) for i in range(n + 1)]


def hexes(hs: list[str] | None) -> list[bytes]:
    return [bytes.fromhex(h) for h in hs or []]


def flip(h: bytes, bit: int) -> bytes:
    b = bytearray(h)
    b[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(b)


def bit_ceil(n: int) -> int:
    return 1 if n <= 1 else 1 << (n - 1).bit_length()


def extended(entries: list[bytes], extra: int) -> list[bytes]:
    """``entries`` followed by ``extra`` entries that differ from all of them."""
    seen, out, i = set(entries), list(entries), 0
    while len(out) < len(entries) + extra:
        e = b"\xffextra" + i.to_bytes(4, "big")
        if e not in seen:
            out.append(e)
        i += 1
    return out


# --- the two implementations ------------------------------------------------------


def test_native_runs_unless_the_pure_implementation_is_asked_for() -> None:
    """merkle.IMPLEMENTATION is "native" where the extension is built, and "pure" in a process with COMPACTSTORE_PURE=1."""
    asked_pure = os.environ.get("COMPACTSTORE_PURE", "") not in ("", "0")
    assert public_merkle.IMPLEMENTATION == ("pure" if asked_pure else "native")
    code = "import compactstore.merkle as m; print(m.IMPLEMENTATION)"
    env = {**os.environ, "COMPACTSTORE_PURE": "1"}
    got = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert got.stdout.strip() == "pure"


def test_the_native_core_is_the_extension_module_compactstore_native() -> None:
    """Where it is in use, the native core is ``compactstore.native``, an extension module (also importable as
    ``compactstore._native``, the same object), and merkle hashes with it."""
    if public_merkle.IMPLEMENTATION != "native":
        pytest.skip("compactstore.native is not in use: not built, or COMPACTSTORE_PURE=1")
    import importlib.machinery

    import compactstore.native as core

    assert core.__name__ == "compactstore.native"
    assert isinstance(core.__spec__.loader, importlib.machinery.ExtensionFileLoader)
    assert public_merkle.native is core
    assert core.leaf_hash(b"x") == merkle_pure.leaf_hash(b"x")
    import compactstore._native as other_name

    assert other_name is core


def _native_and_pure() -> tuple[ModuleType, ModuleType]:
    if public_merkle.IMPLEMENTATION != "native":
        pytest.skip("compactstore.native is not in use: not built, or COMPACTSTORE_PURE=1")
    return public_merkle, merkle_pure


def _frontier_steps(m: ModuleType, leaves: list[bytes], cuts: list[int]) -> list[object]:
    """Extend a Frontier chunk by chunk (every=TILE_HEIGHT); return each step's subtrees, hashes and root."""
    f, out = m.Frontier(), []
    bounds = sorted({0, len(leaves), *(c for c in cuts if c <= len(leaves))})
    for a, b in zip(bounds, bounds[1:]):
        out.append((f.extend(leaves[a:b], every=m.TILE_HEIGHT), list(f.hashes), f.size, f.root()))
    return out


@FEW
@given(entries=sts.edge_entry_lists(), cuts=st.lists(st.integers(0, 40), max_size=4), data=st.data())
def test_native_and_pure_give_the_same_bytes_at_block_and_chunk_edges(
    entries: list[bytes], cuts: list[int], data: st.DataObject
) -> None:
    """Leaves, roots, levels, span roots, proofs and frontier steps are byte-identical in both, at every hashing path."""
    native, pure = _native_and_pure()
    leaves = pure.leaf_hashes(entries)
    assert native.leaf_hashes(entries) == leaves == [naive.leaf(e) for e in entries]
    assert [native.leaf_hash(e) for e in entries] == leaves
    assert native.tree_root(entries) == pure.tree_root(entries) == naive.mth(entries)
    assert native.root_of_leaves(leaves) == pure.root_of_leaves(leaves)
    assert native.subtree_levels(leaves) == pure.subtree_levels(leaves)
    stop = data.draw(st.integers(0, len(entries)))
    start = data.draw(st.integers(0, stop))
    assert native.span_root(entries, start, stop) == pure.span_root(entries, start, stop)
    assert native.span_root_of_leaves(leaves, start, stop) == pure.span_root_of_leaves(leaves, start, stop)
    assert native.fold(leaves[start:stop]) == pure.fold(leaves[start:stop])
    assert native.consistency_proof(entries, stop) == pure.consistency_proof(entries, stop)
    if entries:
        i = data.draw(st.integers(0, len(entries) - 1))
        proof = native.inclusion_proof(entries, i)
        assert proof == pure.inclusion_proof(entries, i)
        root = pure.tree_root(entries)
        assert native.root_from_inclusion(leaves[i], i, len(entries), proof) == root
    assert _frontier_steps(native, leaves, cuts) == _frontier_steps(pure, leaves, cuts)


@FEW
@given(entries=sts.block_count_runs())
def test_native_and_pure_give_the_same_bytes_for_runs_of_a_block_count(entries: list[bytes]) -> None:
    """Runs of entries of one block count, and entries of other counts among them: the reference's bytes."""
    native, pure = _native_and_pure()
    leaves = pure.leaf_hashes(entries)
    assert native.leaf_hashes(entries) == leaves == [naive.leaf(e) for e in entries]
    assert native.tree_root(entries) == pure.tree_root(entries)
    assert native.subtree_levels(leaves) == pure.subtree_levels(leaves)
    assert native.span_root(entries, 1, len(entries)) == pure.span_root(entries, 1, len(entries))


@pytest.mark.parametrize(("count", "length"), [(5000, 1024), (300, 16 * 1024), (3000, 100), (3, 300_000)])
def test_native_and_pure_give_the_same_bytes_for_batches_split_over_threads(count: int, length: int) -> None:
    """Batches large enough to be hashed on every core give the reference's leaves, roots, levels and frontier."""
    native, pure = _native_and_pure()
    entries = [i.to_bytes(4, "big") * (length // 4) for i in range(count)]
    leaves = pure.leaf_hashes(entries)
    assert native.leaf_hashes(entries) == leaves
    assert native.tree_root(entries) == pure.root_of_leaves(leaves)
    assert native.root_of_leaves(leaves) == pure.root_of_leaves(leaves)
    assert native.subtree_levels(leaves) == pure.subtree_levels(leaves)
    assert native.span_root(entries, 1, count - 1) == pure.span_root_of_leaves(leaves, 1, count - 1)
    cuts = [1, count // 3, count - 2]
    assert _frontier_steps(native, leaves, cuts) == _frontier_steps(pure, leaves, cuts)


def _big_root(_: object = None) -> bytes:
    return public_merkle.tree_root([i.to_bytes(4, "big") * 256 for i in range(2000)])


# Python 3.12 on warns that fork() in a process with threads may deadlock: what this checks it does not.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_hashes_on_threads_of_its_own() -> None:
    """After the parent hashed a batch on its threads, a forked child (as verify's workers are) does too."""
    native, _ = _native_and_pure()
    want = _big_root()
    ctx = multiprocessing.get_context("fork")
    with ctx.Pool(1) as pool:
        assert pool.map(_big_root, [None], chunksize=1) == [want]
    assert native.tree_root([i.to_bytes(4, "big") * 256 for i in range(2000)]) == want


def test_hashes_that_are_not_32_bytes_get_the_reference_answer() -> None:
    """Where hashes are expected, anything else is hashed as the reference hashes it, not refused."""
    native, pure = _native_and_pure()
    odd = [b"x", b"y" * 33, bytes(32)]
    assert native.root_of_leaves(odd) == pure.root_of_leaves(odd)
    assert native.subtree_levels(odd) == pure.subtree_levels(odd)
    assert native.fold(odd) == pure.fold(odd)
    assert native.span_root_of_leaves(odd, 0, 3) == pure.span_root_of_leaves(odd, 0, 3)
    assert native.node_hash(b"a", b"bc") == pure.node_hash(b"a", b"bc")
    assert _frontier_steps(native, odd, [1]) == _frontier_steps(pure, odd, [1])
    assert native.root_from_inclusion(b"x", 0, 2, [bytes(32)]) is None
    assert native.verify_consistency(1, 2, b"x", bytes(32), [bytes(32)]) is False


# --- hashing primitives -----------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_leaf_node_and_empty_hashes_use_rfc_prefixes(merkle: ModuleType, algo: str) -> None:
    """Leaf, node and empty-tree hashes are H(0x00||d), H(0x01||l||r) and H("")."""
    hashes: dict[str, Callable[[bytes], bytes]] = {
        "blake3": lambda b: blake3(b).digest(),
        "sha256": lambda b: hashlib.sha256(b).digest(),
    }
    h = hashes[algo]
    assert merkle.leaf_hash(b"abc", algo) == h(b"\x00abc")
    assert merkle.node_hash(b"L" * 32, b"R" * 32, algo) == h(b"\x01" + b"L" * 32 + b"R" * 32)
    assert merkle.empty_root(algo) == h(b"")
    assert merkle.tree_root([], algo) == h(b"")
    assert len(merkle.leaf_hash(b"", algo)) == merkle.HASH_SIZE


def test_blake3_is_the_default_hash(merkle: ModuleType) -> None:
    """Without an algo argument leaf hashes, tree roots and a Frontier use BLAKE3."""
    assert merkle.leaf_hash(b"x") == merkle.leaf_hash(b"x", "blake3")
    assert merkle.tree_root(ENTRIES[:5]) == naive.mth(ENTRIES[:5], "blake3")
    assert merkle.Frontier().root() == merkle.empty_root("blake3")


def test_naive_oracle_reproduces_published_rfc6962_roots() -> None:
    """The naive oracle itself gives the published RFC 6962 roots, so it can be trusted as a reference."""
    tree = rfc6962()["rfc6962_8_leaf_tree"]
    inputs = hexes(tree["leaf_inputs_hex"])
    for size, root in tree["root_hex_by_tree_size"].items():
        assert naive.mth(inputs[: int(size)], "sha256").hex() == root


# --- tree_root ----------------------------------------------------------------------


@FAST
@given(entries=sts.entry_lists(0, 40), algo=sts.algos)
def test_tree_root_equals_naive_oracle(merkle: ModuleType, entries: list[bytes], algo: str) -> None:
    """tree_root equals the naive recursive Merkle Tree Hash for arbitrary small entry lists."""
    assert merkle.tree_root(entries, algo) == naive.mth(entries, algo)


@FEW
@given(entries=sts.large_entry_lists(41, 600), algo=sts.algos)
def test_tree_root_equals_naive_oracle_for_larger_trees(merkle: ModuleType, entries: list[bytes], algo: str) -> None:
    """tree_root equals the naive Merkle Tree Hash for trees of up to 600 entries."""
    assert merkle.tree_root(entries, algo) == naive.mth(entries, algo)


@pytest.mark.parametrize("algo", ALGOS)
def test_tree_root_equals_naive_oracle_for_every_size_up_to_130(merkle: ModuleType, algo: str) -> None:
    """tree_root equals the naive Merkle Tree Hash at every size from 0 to 130."""
    for n in range(131):
        assert merkle.tree_root(ENTRIES[:n], algo) == roots(algo)[n], n


# --- inclusion proofs -------------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_every_inclusion_proof_verifies_for_sizes_1_to_64(merkle: ModuleType, algo: str) -> None:
    """For every size 1..64 and every index, the inclusion proof verifies against the tree root."""
    for n in range(1, 65):
        entries, root = ENTRIES[:n], roots(algo)[n]
        for i in range(n):
            proof = merkle.inclusion_proof(entries, i, algo)
            assert merkle.verify_inclusion(entries[i], i, n, proof, root, algo), (i, n)
            leaf = merkle.leaf_hash(entries[i], algo)
            assert merkle.verify_inclusion_hash(leaf, i, n, proof, root, algo), (i, n)
            assert merkle.root_from_inclusion(leaf, i, n, proof, algo) == root, (i, n)


@pytest.mark.parametrize("algo", ALGOS)
def test_inclusion_proofs_equal_naive_path_for_sizes_1_to_64(merkle: ModuleType, algo: str) -> None:
    """For every size 1..64 and index, inclusion_proof equals the RFC's PATH(m, D[n])."""
    for n in range(1, 65):
        for i in range(n):
            assert merkle.inclusion_proof(ENTRIES[:n], i, algo) == naive.path(i, ENTRIES[:n], algo), (i, n)


@FEW
@given(case=sts.with_index(sts.large_entry_lists(65, 600)), algo=sts.algos)
def test_inclusion_proofs_verify_and_equal_naive_path_for_larger_trees(
    merkle: ModuleType, case: tuple[list[bytes], int], algo: str
) -> None:
    """In trees of 65..600 entries an inclusion proof equals PATH and verifies against the root."""
    entries, i = case
    proof = merkle.inclusion_proof(entries, i, algo)
    assert proof == naive.path(i, entries, algo)
    assert merkle.verify_inclusion(entries[i], i, len(entries), proof, naive.mth(entries, algo), algo)


@FAST
@given(case=sts.with_index(DISTINCT), other=sts.entry, algo=sts.algos)
def test_inclusion_proof_rejects_wrong_entry(merkle: ModuleType, case: tuple[list[bytes], int], other: bytes, algo: str) -> None:
    """An inclusion proof does not verify for an entry other than the one at its index."""
    entries, i = case
    assume(other != entries[i])
    proof = merkle.inclusion_proof(entries, i, algo)
    root = merkle.tree_root(entries, algo)
    assert not merkle.verify_inclusion(other, i, len(entries), proof, root, algo)


@FAST
@given(case=sts.with_index(DISTINCT), delta=st.integers(1, 40), algo=sts.algos)
def test_inclusion_proof_rejects_wrong_index(merkle: ModuleType, case: tuple[list[bytes], int], delta: int, algo: str) -> None:
    """An inclusion proof does not verify at any index other than its own, inside or outside the tree."""
    entries, i = case
    n = len(entries)
    proof = merkle.inclusion_proof(entries, i, algo)
    root = merkle.tree_root(entries, algo)
    for j in {i + delta, i - delta, i ^ delta, n, -1}:
        assert not merkle.verify_inclusion(entries[i], j, n, proof, root, algo), j


@FAST
@given(case=sts.with_index(DISTINCT), claimed=st.integers(0, 340), algo=sts.algos)
def test_inclusion_proof_rejects_wrong_size(merkle: ModuleType, case: tuple[list[bytes], int], claimed: int, algo: str) -> None:
    """An inclusion proof does not verify as a proof in the tree of another size."""
    entries, i = case
    n = len(entries)
    assume(claimed != n)
    proof = merkle.inclusion_proof(entries, i, algo)
    # The claimed size is checked together with that size's real root. Against the
    # original root it can legitimately pass: RFC 9162 verification binds the size only
    # through the shape of the path, and index 0 has the same path shape in sizes 3 and 4.
    # A signed tree head binds size and root together, so that is the check that matters.
    claimed_root = merkle.tree_root(extended(entries, max(0, claimed - n))[:claimed], algo)
    assert not merkle.verify_inclusion(entries[i], i, claimed, proof, claimed_root, algo)


@FAST
@given(case=sts.with_index(DISTINCT), bad=st.binary(min_size=32, max_size=32), algo=sts.algos)
def test_inclusion_proof_rejects_wrong_root(merkle: ModuleType, case: tuple[list[bytes], int], bad: bytes, algo: str) -> None:
    """An inclusion proof does not verify against any root but the tree's own."""
    entries, i = case
    n = len(entries)
    root = merkle.tree_root(entries, algo)
    assume(bad != root)
    proof = merkle.inclusion_proof(entries, i, algo)
    for wrong in (bad, merkle.tree_root(extended(entries, 1), algo), merkle.empty_root(algo), root[:31]):
        assert not merkle.verify_inclusion(entries[i], i, n, proof, wrong, algo)


@FAST
@given(case=sts.with_index(DISTINCT.filter(lambda e: len(e) > 1)), data=st.data(), algo=sts.algos)
def test_inclusion_proof_rejects_any_flipped_bit(
    merkle: ModuleType, case: tuple[list[bytes], int], data: st.DataObject, algo: str
) -> None:
    """Flipping any single bit of any hash in an inclusion proof makes it fail."""
    entries, i = case
    proof = merkle.inclusion_proof(entries, i, algo)
    k = data.draw(st.integers(0, len(proof) - 1), label="hash")
    bit = data.draw(st.integers(0, 8 * merkle.HASH_SIZE - 1), label="bit")
    proof[k] = flip(proof[k], bit)
    assert not merkle.verify_inclusion(entries[i], i, len(entries), proof, merkle.tree_root(entries, algo), algo)


def test_inclusion_proof_rejects_every_flipped_bit_in_a_13_leaf_tree(merkle: ModuleType) -> None:
    """In a 13-leaf tree, every index's proof fails with any one of its bits flipped."""
    entries, n = ENTRIES[:13], 13
    root = roots("blake3")[n]
    for i in range(n):
        proof = merkle.inclusion_proof(entries, i)
        for k in range(len(proof)):
            for bit in range(8 * merkle.HASH_SIZE):
                bad = proof[:k] + [flip(proof[k], bit)] + proof[k + 1 :]
                assert not merkle.verify_inclusion(entries[i], i, n, bad, root), (i, k, bit)


@FAST
@given(case=sts.with_index(DISTINCT), algo=sts.algos)
def test_inclusion_proof_rejects_truncated_or_extended_proofs(merkle: ModuleType, case: tuple[list[bytes], int], algo: str) -> None:
    """An inclusion proof with a hash removed, appended or prepended fails."""
    entries, i = case
    n = len(entries)
    proof = merkle.inclusion_proof(entries, i, algo)
    root = merkle.tree_root(entries, algo)
    bad = [proof + [root], [root] + proof, proof + [proof[-1]] if proof else [root]]
    if proof:
        bad += [proof[:-1], proof[1:]]
    for p in bad:
        assert not merkle.verify_inclusion(entries[i], i, n, p, root, algo)
        assert merkle.root_from_inclusion(merkle.leaf_hash(entries[i], algo), i, n, p, algo) != root


def test_inclusion_in_an_empty_tree_never_verifies(merkle: ModuleType) -> None:
    """No proof shows an entry in the empty tree."""
    empty = merkle.empty_root()
    assert not merkle.verify_inclusion(b"", 0, 0, [], empty)
    assert merkle.root_from_inclusion(merkle.leaf_hash(b""), 0, 0, []) is None


def test_inclusion_verifiers_reject_malformed_hashes(merkle: ModuleType) -> None:
    """A leaf hash, proof hash or root that is not 32 bytes is rejected, not raised on."""
    entries = ENTRIES[:5]
    proof, root = merkle.inclusion_proof(entries, 2), merkle.tree_root(entries)
    leaf = merkle.leaf_hash(entries[2])
    assert merkle.verify_inclusion_hash(leaf, 2, 5, proof, root)
    assert not merkle.verify_inclusion_hash(leaf[:31], 2, 5, proof, root)
    assert not merkle.verify_inclusion_hash(leaf + b"\x00", 2, 5, proof, root)
    assert not merkle.verify_inclusion_hash(leaf, 2, 5, [proof[0][:16], *proof[1:]], root)
    assert not merkle.verify_inclusion_hash(leaf, 2, 5, proof, root + b"\x00")


# --- consistency proofs -----------------------------------------------------------


@pytest.mark.parametrize("algo", ALGOS)
def test_every_consistency_proof_verifies_for_sizes_1_to_64(merkle: ModuleType, algo: str) -> None:
    """For every new size 1..64 and every old size 0..new, the consistency proof verifies."""
    rs = roots(algo)
    for n in range(1, 65):
        for m in range(n + 1):
            proof = merkle.consistency_proof(ENTRIES[:n], m, algo)
            assert merkle.verify_consistency(m, n, rs[m], rs[n], proof, algo), (m, n)


@pytest.mark.parametrize("algo", ALGOS)
def test_consistency_proofs_equal_naive_proof_for_sizes_1_to_64(merkle: ModuleType, algo: str) -> None:
    """For 0 < m <= n <= 64 consistency_proof equals the RFC's PROOF(m, D[n]); from 0 it is empty."""
    for n in range(1, 65):
        assert merkle.consistency_proof(ENTRIES[:n], 0, algo) == []
        for m in range(1, n + 1):
            assert merkle.consistency_proof(ENTRIES[:n], m, algo) == naive.proof(m, ENTRIES[:n], algo), (m, n)


@FEW
@given(case=sts.with_old_size(sts.large_entry_lists(65, 600), min_old=1), algo=sts.algos)
def test_consistency_proofs_verify_and_equal_naive_proof_for_larger_trees(
    merkle: ModuleType, case: tuple[list[bytes], int], algo: str
) -> None:
    """In trees of 65..600 entries a consistency proof equals PROOF and verifies."""
    entries, m = case
    proof = merkle.consistency_proof(entries, m, algo)
    assert proof == naive.proof(m, entries, algo)
    old, new = naive.mth(entries[:m], algo), naive.mth(entries, algo)
    assert merkle.verify_consistency(m, len(entries), old, new, proof, algo)


def nontrivial(lists: st.SearchStrategy[list[bytes]]) -> st.SearchStrategy[tuple[list[bytes], int]]:
    """An entry list of size n >= 2 and an old size 0 < m < n: the proof is not empty."""
    return sts.with_old_size(lists.filter(lambda e: len(e) >= 2), min_old=1).filter(lambda c: c[1] < len(c[0]))


@FAST
@given(case=nontrivial(DISTINCT), claimed=st.integers(0, 320), algo=sts.algos)
def test_consistency_proof_rejects_wrong_old_size(merkle: ModuleType, case: tuple[list[bytes], int], claimed: int, algo: str) -> None:
    """A consistency proof does not verify for another old size (with that size's real root)."""
    entries, m = case
    n = len(entries)
    assume(claimed != m)
    proof = merkle.consistency_proof(entries, m, algo)
    # As with inclusion, the old size is only meaningful together with its root: against
    # the original roots, the proof from size 1 to 2 also "shows" that a size-2 tree whose
    # root is leaf 0's hash is a prefix of a size-3 tree whose root is the real size-2
    # root, because nothing but a tree head binds a size to a root.
    ext = extended(entries, max(0, claimed - n))
    old = merkle.tree_root(ext[:claimed], algo)
    assert not merkle.verify_consistency(claimed, n, old, merkle.tree_root(entries, algo), proof, algo)


@FAST
@given(case=nontrivial(DISTINCT), claimed=st.integers(0, 320), algo=sts.algos)
def test_consistency_proof_rejects_wrong_new_size(merkle: ModuleType, case: tuple[list[bytes], int], claimed: int, algo: str) -> None:
    """A consistency proof does not verify for another new size (with that size's real root)."""
    entries, m = case
    n = len(entries)
    assume(claimed != n)
    proof = merkle.consistency_proof(entries, m, algo)
    new = merkle.tree_root(extended(entries, max(0, claimed - n))[:claimed], algo)
    assert not merkle.verify_consistency(m, claimed, merkle.tree_root(entries[:m], algo), new, proof, algo)


@FAST
@given(case=nontrivial(DISTINCT), bad=st.binary(min_size=32, max_size=32), algo=sts.algos)
def test_consistency_proof_rejects_wrong_roots(merkle: ModuleType, case: tuple[list[bytes], int], bad: bytes, algo: str) -> None:
    """A consistency proof does not verify with a wrong, swapped or malformed old or new root."""
    entries, m = case
    n = len(entries)
    old, new = merkle.tree_root(entries[:m], algo), merkle.tree_root(entries, algo)
    assume(bad not in (old, new))
    proof = merkle.consistency_proof(entries, m, algo)
    for o, w in [(bad, new), (old, bad), (new, old), (old, old), (new, new), (old[:31], new), (old, new + b"\0")]:
        assert not merkle.verify_consistency(m, n, o, w, proof, algo)


@FAST
@given(case=nontrivial(DISTINCT), data=st.data(), algo=sts.algos)
def test_consistency_proof_rejects_any_flipped_bit(
    merkle: ModuleType, case: tuple[list[bytes], int], data: st.DataObject, algo: str
) -> None:
    """Flipping any single bit of any hash in a consistency proof makes it fail."""
    entries, m = case
    proof = merkle.consistency_proof(entries, m, algo)
    k = data.draw(st.integers(0, len(proof) - 1), label="hash")
    bit = data.draw(st.integers(0, 8 * merkle.HASH_SIZE - 1), label="bit")
    proof[k] = flip(proof[k], bit)
    old, new = merkle.tree_root(entries[:m], algo), merkle.tree_root(entries, algo)
    assert not merkle.verify_consistency(m, len(entries), old, new, proof, algo)


def test_consistency_proof_rejects_every_flipped_bit_in_a_13_leaf_tree(merkle: ModuleType) -> None:
    """In a 13-leaf tree, every old size's proof fails with any one of its bits flipped."""
    n, rs = 13, roots("blake3")
    for m in range(1, n):
        proof = merkle.consistency_proof(ENTRIES[:n], m)
        for k in range(len(proof)):
            for bit in range(8 * merkle.HASH_SIZE):
                bad = proof[:k] + [flip(proof[k], bit)] + proof[k + 1 :]
                assert not merkle.verify_consistency(m, n, rs[m], rs[n], bad), (m, k, bit)


@FAST
@given(case=nontrivial(DISTINCT), algo=sts.algos)
def test_consistency_proof_rejects_truncated_or_extended_proofs(merkle: ModuleType, case: tuple[list[bytes], int], algo: str) -> None:
    """A consistency proof with a hash removed, appended or prepended, or emptied, fails."""
    entries, m = case
    n = len(entries)
    proof = merkle.consistency_proof(entries, m, algo)
    old, new = merkle.tree_root(entries[:m], algo), merkle.tree_root(entries, algo)
    for p in ([], proof[:-1], proof[1:], proof + [new], [old] + proof, proof + [proof[-1]], proof[::-1]):
        if p != proof:
            assert not merkle.verify_consistency(m, n, old, new, p, algo)


@pytest.mark.parametrize("algo", ALGOS)
def test_empty_tree_is_consistent_with_every_tree_by_an_empty_proof(merkle: ModuleType, algo: str) -> None:
    """From size 0 the proof is empty and verifies only with the empty root and no proof hashes."""
    empty, rs = merkle.empty_root(algo), roots(algo)
    for n in range(0, 10):
        assert merkle.verify_consistency(0, n, empty, rs[n], [], algo)
        assert not merkle.verify_consistency(0, n, rs[1], rs[n], [], algo)
        assert not merkle.verify_consistency(0, n, empty, rs[n], [rs[n]], algo)
    assert not merkle.verify_consistency(0, 0, empty, rs[1], [], algo)


def test_consistency_verifier_rejects_impossible_sizes(merkle: ModuleType) -> None:
    """An old size above the new one, a negative size, or equal sizes with different roots never verify."""
    rs = roots("blake3")
    assert not merkle.verify_consistency(3, 2, rs[3], rs[2], [])
    assert not merkle.verify_consistency(-1, 2, rs[0], rs[2], [])
    assert not merkle.verify_consistency(2, 2, rs[2], rs[3], [])


# --- Frontier -----------------------------------------------------------------------


@FAST
@given(entries=sts.entry_lists(0, 40), algo=sts.algos)
def test_frontier_root_equals_tree_root_at_every_size(merkle: ModuleType, entries: list[bytes], algo: str) -> None:
    """After each append the Frontier's root equals tree_root of the entries so far."""
    f = merkle.Frontier(algo=algo)
    assert f.root() == merkle.tree_root([], algo)
    for n, e in enumerate(entries, 1):
        f.append(merkle.leaf_hash(e, algo))
        assert f.size == n
        assert f.root() == merkle.tree_root(entries[:n], algo)


@pytest.mark.parametrize("algo", ALGOS)
def test_frontier_reports_exactly_the_completed_subtrees(merkle: ModuleType, algo: str) -> None:
    """Up to 130 appends, each append reports exactly the subtrees it completes, and its hashes are cover(0, n)."""
    subtrees = naive.complete_subtrees(ENTRIES[:130], algo)
    f = merkle.Frontier(algo=algo)
    reported: dict[tuple[int, int], bytes] = {}
    for n in range(1, 131):
        leaf = merkle.leaf_hash(ENTRIES[n - 1], algo)
        made = f.append(leaf)
        # An append at size n completes one subtree per trailing zero bit of n.
        trailing = (n & -n).bit_length() - 1
        assert [(lv, i) for lv, i, _ in made] == [(lv, (n >> lv) - 1) for lv in range(1, trailing + 1)]
        for lv, i, h in made:
            assert h == subtrees[(lv, i)], (lv, i)
            assert (lv, i) not in reported
            reported[(lv, i)] = h
        reported[(0, n - 1)] = leaf
        assert f.hashes == [subtrees[c] for c in merkle.cover(0, n)], n
        assert f.root() == roots(algo)[n]
    assert reported == subtrees


def test_frontier_resumes_from_a_compact_range_and_copies_independently(merkle: ModuleType) -> None:
    """A Frontier rebuilt from cover(0, n) roots continues like the original; a copy does not share state."""
    subtrees = naive.complete_subtrees(ENTRIES[:40])
    for n in range(0, 30):
        f = merkle.Frontier(n, [subtrees[c] for c in merkle.cover(0, n)])
        g = f.copy()
        for e in ENTRIES[n:40]:
            f.append(merkle.leaf_hash(e))
        assert f.root() == roots("blake3")[40]
        assert g.size == n and g.root() == roots("blake3")[n]


@FAST
@given(entries=sts.any_entry_lists(300), cuts=st.lists(st.integers(0, 300), max_size=6), algo=sts.algos)
def test_frontier_extend_equals_appends_one_by_one(merkle: ModuleType, entries: list[bytes], cuts: list[int], algo: str) -> None:
    """Extending by chunks reports the same subtrees, level by level in each chunk, and reaches the same hashes.

    With ``every``, only the subtrees at levels that are multiples of it: what a store keeps.
    """
    leaves = merkle.leaf_hashes(entries, algo)
    assert leaves == [merkle.leaf_hash(e, algo) for e in entries]
    one, chunked, tiled = merkle.Frontier(algo=algo), merkle.Frontier(algo=algo), merkle.Frontier(algo=algo)
    made_one = [m for leaf in leaves for m in one.append(leaf)]
    bounds = sorted({0, len(leaves), *(c for c in cuts if c <= len(leaves))})
    made_chunked, made_tiled = [], []
    for a, b in zip(bounds, bounds[1:]):
        made = chunked.extend(leaves[a:b])
        assert made == sorted(made, key=lambda m: (m[0], m[1]))
        made_chunked += made
        made_tiled += tiled.extend(leaves[a:b], every=merkle.TILE_HEIGHT)
    assert sorted(made_chunked) == sorted(made_one)
    assert sorted(made_tiled) == sorted(m for m in made_one if merkle.is_stored(m[0]))
    assert (chunked.size, chunked.hashes, chunked.root()) == (one.size, one.hashes, one.root())
    assert (tiled.size, tiled.hashes) == (one.size, one.hashes)


@FAST
@given(entries=sts.any_entry_lists(300), cuts=st.lists(st.integers(0, 300), max_size=6), algo=sts.algos)
def test_frontier_extend_root_equals_extend_then_root(merkle: ModuleType, entries: list[bytes], cuts: list[int],
                                                      algo: str) -> None:
    """extend_root reports what extend reports and the root after it, chunk by chunk, and keeps the same hashes."""
    leaves = merkle.leaf_hashes(entries, algo)
    both, apart = merkle.Frontier(algo=algo), merkle.Frontier(algo=algo)
    bounds = sorted({0, len(leaves), *(c for c in cuts if c <= len(leaves))})
    for a, b in zip(bounds, bounds[1:]):
        made, root = both.extend_root(leaves[a:b], every=merkle.TILE_HEIGHT)
        assert (made, root) == (apart.extend(leaves[a:b], every=merkle.TILE_HEIGHT), apart.root())
        assert (both.size, both.hashes) == (apart.size, apart.hashes)
    assert both.root() == naive.mth(entries, algo)


def test_digest_is_blake3_keyed_or_not(merkle: ModuleType) -> None:
    """digest_fn() hashes as the blake3 package does, with a 32-byte key or none: what head seals are made with."""
    from blake3 import blake3

    digest, key = merkle.digest_fn(), bytes(range(32))
    for data in (b"", b"x", bytes(range(256)) * 5, bytes(70_000)):
        assert digest(data, None) == blake3(data).digest()
        assert digest(data, key) == blake3(data, key=key).digest()


@pytest.mark.parametrize("algo", ALGOS)
def test_append_subtree_equals_appending_its_leaves(merkle: ModuleType, algo: str) -> None:
    """Appending whole subtrees of 1, 2, 4 or 8 leaves gives the hashes and completed subtrees of leaf appends."""
    subtrees = naive.complete_subtrees(ENTRIES[:130], algo)
    for level in range(4):
        leafwise, whole = merkle.Frontier(algo=algo), merkle.Frontier(algo=algo)
        for i in range(130 >> level):
            made = [m for j in range(i << level, (i + 1) << level)
                    for m in leafwise.append(merkle.leaf_hash(ENTRIES[j], algo))]
            got = whole.append_subtree(level, subtrees[(level, i)])
            assert got == [m for m in made if m[0] > level], (level, i)
            assert whole.size == leafwise.size and whole.hashes == leafwise.hashes
    with pytest.raises(InvalidArgument):
        merkle.Frontier(1, [subtrees[(0, 0)]], algo).append_subtree(1, subtrees[(1, 0)])


@pytest.mark.parametrize("algo", ALGOS)
def test_subtree_levels_are_the_complete_subtrees(merkle: ModuleType, algo: str) -> None:
    """subtree_levels lists every complete aligned subtree root of the leaves, level by level."""
    for n in (0, 1, 2, 5, 16, 37, 130):
        subtrees = naive.complete_subtrees(ENTRIES[:n], algo)
        levels = merkle.subtree_levels([merkle.leaf_hash(e, algo) for e in ENTRIES[:n]], algo)
        assert {(lv, i): h for lv, row in enumerate(levels) for i, h in enumerate(row)} == subtrees, n


def test_frontier_rejects_a_wrong_number_of_hashes(merkle: ModuleType) -> None:
    """A Frontier needs exactly one root per piece of cover(0, size)."""
    h = merkle.leaf_hash(b"")
    with pytest.raises(InvalidArgument):
        merkle.Frontier(3, [h])
    with pytest.raises(InvalidArgument):
        merkle.Frontier(0, [h])


# --- cover and span_root --------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(span=sts.spans())
def test_cover_is_a_short_sequence_of_adjacent_aligned_subtrees(merkle: ModuleType, span: tuple[int, int]) -> None:
    """cover(start, stop) tiles the span left to right with aligned subtrees, at most 2*log2(width) of them."""
    start, stop = span
    pieces = merkle.cover(start, stop)
    pos = start
    for lv, i in pieces:
        assert i << lv == pos
        pos += 1 << lv
    assert pos == stop
    if stop == start:
        assert pieces == []
        return
    assert len(pieces) <= max(1, 2 * ((stop - start).bit_length() - 1))
    # Levels rise strictly, then fall strictly (the top level at most twice), and no
    # two adjacent equal-level pieces could merge into one aligned subtree.
    levels = [lv for lv, _ in pieces]
    top = max(levels)
    first, last = levels.index(top), len(levels) - 1 - levels[::-1].index(top)
    assert last - first <= 1
    assert all(a < b for a, b in zip(levels[:first], levels[1 : first + 1]))
    assert all(a > b for a, b in zip(levels[last:], levels[last + 1 :]))
    if last != first:
        assert pieces[first][1] % 2 == 1


def test_cover_uses_the_fewest_aligned_subtrees_for_every_span_up_to_48(merkle: ModuleType) -> None:
    """No tiling of a span (stop <= 48) by aligned subtrees has fewer pieces than cover()."""
    for start in range(48):
        # fewest[p]: fewest aligned subtrees tiling [start, p), by dynamic programming.
        fewest = {start: 0}
        for p in range(start, 48):
            lv = 0
            while p % (1 << lv) == 0 and p + (1 << lv) <= 48:
                q = p + (1 << lv)
                fewest[q] = min(fewest.get(q, q), fewest[p] + 1)
                lv += 1
        for stop in range(start, 49):
            assert len(merkle.cover(start, stop)) == fewest[stop], (start, stop)


@settings(max_examples=100, deadline=None)
@given(n=sts.sizes)
def test_cover_of_a_prefix_follows_the_binary_digits_of_its_size(merkle: ModuleType, n: int) -> None:
    """cover(0, n) has one subtree per 1-bit of n, largest first."""
    levels = [lv for lv in range(n.bit_length() - 1, -1, -1) if n >> lv & 1]
    assert [lv for lv, _ in merkle.cover(0, n)] == levels


@pytest.mark.parametrize("algo", ALGOS)
def test_span_root_equals_naive_mth_for_valid_subtrees(merkle: ModuleType, algo: str) -> None:
    """For every [start, stop) with start a multiple of bit_ceil(stop - start), stop <= 70, span_root is MTH."""
    entries = ENTRIES[:70]
    for stop in range(71):
        for start in range(stop + 1):
            if start % bit_ceil(stop - start) == 0:
                want = naive.mth(entries[start:stop], algo)
                assert merkle.span_root(entries, start, stop, algo) == want, (start, stop)


def test_span_root_is_the_fold_of_its_cover_roots_for_every_span(merkle: ModuleType) -> None:
    """For every span of a 40-leaf tree, span_root folds the naive roots of cover()'s pieces."""
    entries = ENTRIES[:40]
    subtrees = naive.complete_subtrees(entries)
    for stop in range(41):
        for start in range(stop + 1):
            pieces = [subtrees[c] for c in merkle.cover(start, stop)]
            assert merkle.span_root(entries, start, stop) == merkle.fold(pieces), (start, stop)


@FAST
@given(case=sts.with_span(sts.any_entry_lists(300)), algo=sts.algos)
def test_span_root_is_the_fold_of_its_cover_roots(merkle: ModuleType, case: tuple[list[bytes], int, int], algo: str) -> None:
    """span_root of any span equals fold of the naive roots of its cover() pieces, and MTH when aligned."""
    entries, start, stop = case
    pieces = [naive.mth(entries[i << lv : (i + 1) << lv], algo) for lv, i in merkle.cover(start, stop)]
    got = merkle.span_root(entries, start, stop, algo)
    assert got == merkle.fold(pieces, algo)
    if start % bit_ceil(stop - start) == 0:
        assert got == naive.mth(entries[start:stop], algo)


def test_fold_of_nothing_is_the_empty_root(merkle: ModuleType) -> None:
    """fold([]) is the empty-tree root and fold([h]) is h."""
    h = merkle.leaf_hash(b"x", "sha256")
    assert merkle.fold([], "sha256") == merkle.empty_root("sha256")
    assert merkle.fold([h], "sha256") == h


def test_proof_spans_roots_served_from_stored_subtrees_equal_the_proofs(merkle: ModuleType) -> None:
    """Proofs rebuilt with spans_root from stored subtree roots equal inclusion_proof and consistency_proof."""
    entries = ENTRIES[:45]
    lookup = naive.complete_subtrees(entries)
    for n in range(1, 46):
        for i in range(n):
            assert merkle.spans_root(merkle.inclusion_spans(i, n), lookup) == merkle.inclusion_proof(entries[:n], i)
        for m in range(n + 1):
            got = merkle.spans_root(merkle.consistency_spans(m, n), lookup)
            assert got == merkle.consistency_proof(entries[:n], m), (m, n)


def _stored_fetch(lookup: dict[tuple[int, int], bytes], calls: list[list[tuple[int, int]]]) -> Callable[
    [list[tuple[int, int]]], list[bytes]
]:
    """A store's ``fetch``: answers stored levels only, and records each call."""

    def fetch(coords: list[tuple[int, int]]) -> list[bytes]:
        calls.append(list(coords))
        assert all(public_merkle.is_stored(lv) for lv, _ in coords), coords
        return [lookup[c] for c in coords]

    return fetch


@FEW
@given(entries=sts.any_entry_lists(300), data=st.data(), algo=sts.algos)
def test_resolve_hashes_up_from_stored_levels_with_one_fetch_of_distinct_coords(
    merkle: ModuleType, entries: list[bytes], data: st.DataObject, algo: str
) -> None:
    """resolve gives every complete subtree's root, fetching each stored coordinate once, in one call."""
    assume(entries)
    lookup = naive.complete_subtrees(entries, algo)
    coords = data.draw(st.lists(st.sampled_from(sorted(lookup)), max_size=30))
    calls: list[list[tuple[int, int]]] = []
    got = merkle.resolve(coords, _stored_fetch(lookup, calls), algo)
    assert got == {c: lookup[c] for c in coords}
    assert len(calls) == (1 if coords else 0)
    if calls:
        assert len(set(calls[0])) == len(calls[0])


@FEW
@given(entries=sts.any_entry_lists(300), data=st.data(), algo=sts.algos)
def test_served_proofs_and_span_roots_equal_the_in_memory_ones(
    merkle: ModuleType, entries: list[bytes], data: st.DataObject, algo: str
) -> None:
    """serve answers inclusion, consistency and span spans from stored levels alone, in one fetch."""
    n = len(entries)
    assume(n)
    lookup = naive.complete_subtrees(entries, algo)
    i = data.draw(st.integers(0, n - 1))
    m = data.draw(st.integers(0, n))
    start = data.draw(st.integers(0, n))
    stop = data.draw(st.integers(start, n))
    for spans, want in [
        (merkle.inclusion_spans(i, n), merkle.inclusion_proof(entries, i, algo)),
        (merkle.consistency_spans(m, n), merkle.consistency_proof(entries, m, algo)),
        ([(start, stop), (0, n)], [merkle.span_root(entries, start, stop, algo), merkle.tree_root(entries, algo)]),
    ]:
        calls: list[list[tuple[int, int]]] = []
        assert merkle.serve(spans, _stored_fetch(lookup, calls), algo) == want
        assert len(calls) <= 1


@FEW
@given(size=st.integers(1, 600), data=st.data())
def test_native_and_pure_serve_the_same_bytes_from_any_stored_roots(size: int, data: st.DataObject) -> None:
    """resolve, serve and spans_root give the same bytes natively and in the reference, from stored roots of any value and length.

    A damaged store holds roots that belong to no tree, some not 32 bytes long: what is
    served from them must still be the same on both paths.
    """
    native, pure = _native_and_pure()
    stored = {(lv, i) for lv in range(0, size.bit_length(), public_merkle.TILE_HEIGHT) for i in range(size >> lv)}
    roots = data.draw(st.lists(st.one_of(st.binary(min_size=32, max_size=32), st.binary(max_size=40)),
                               min_size=len(stored), max_size=len(stored)))
    lookup = dict(zip(sorted(stored), roots))
    a = data.draw(st.integers(0, size))
    b = data.draw(st.integers(a, size))
    i = data.draw(st.integers(0, size - 1))
    spans = [(a, b), *pure.inclusion_spans(i, size), *pure.consistency_spans(a, size)]
    coords = [c for x, y in spans for c in pure.cover(x, y)]
    got = native.resolve(coords, _stored_fetch(lookup, []))
    assert got == pure.resolve(coords, _stored_fetch(lookup, []))
    assert native.serve(spans, _stored_fetch(lookup, [])) == pure.serve(spans, _stored_fetch(lookup, []))
    assert native.spans_root(spans, got) == pure.spans_root(spans, got)


def test_fold_equals_the_naive_right_to_left_merge_at_every_length(merkle: ModuleType) -> None:
    """fold's BLAKE3 loop and the generic one merge right to left alike, for 0 to 40 hashes."""
    hs = [merkle.leaf_hash(e) for e in ENTRIES[:40]]
    for k in range(41):
        for algo in ALGOS:
            acc = merkle.empty_root(algo) if k == 0 else hs[k - 1]
            for h in reversed(hs[: max(k - 1, 0)]):
                acc = merkle.node_hash(h, acc, algo)
            assert merkle.fold(hs[:k], algo) == acc, (k, algo)


# --- published RFC 6962 / RFC 9162 vectors -------------------------------------------


def test_rfc6962_eight_leaf_tree_roots_for_every_size(merkle: ModuleType) -> None:
    """tree_root, a Frontier and span_root give the published root for every size 0..8."""
    tree = rfc6962()["rfc6962_8_leaf_tree"]
    inputs = hexes(tree["leaf_inputs_hex"])
    assert merkle.empty_root("sha256").hex() == tree["empty_tree_root_hex"]
    f = merkle.Frontier(algo="sha256")
    for size in range(9):
        want = tree["root_hex_by_tree_size"][str(size)]
        assert merkle.tree_root(inputs[:size], "sha256").hex() == want
        assert merkle.span_root(inputs, 0, size, "sha256").hex() == want
        assert f.root().hex() == want
        if size < 8:
            f.append(merkle.leaf_hash(inputs[size], "sha256"))


def test_rfc6962_node_hashes_and_compact_ranges(merkle: ModuleType) -> None:
    """Each published node hash is the span_root of its span; cover(0, n) is the published compact range."""
    tree = rfc6962()["rfc6962_8_leaf_tree"]
    inputs = hexes(tree["leaf_inputs_hex"])
    for level in tree["node_hashes_by_level"]:
        for node in level:
            start, stop = node["covers"]
            assert merkle.span_root(inputs, start, stop, "sha256").hex() == node["hash_hex"]
    for size, pieces in tree["compact_range_of_prefix_by_tree_size"].items():
        assert merkle.cover(0, int(size)) == [(p["level"], p["index"]) for p in pieces]
        coords = merkle.cover(0, int(size))
        got = [merkle.span_root(inputs, i << lv, (i + 1) << lv, "sha256").hex() for lv, i in coords]
        assert got == [p["hash_hex"] for p in pieces]


def test_ctgo_inclusion_proofs_are_reproduced_exactly(merkle: ModuleType) -> None:
    """certificate-transparency-go's inclusion proofs equal ours hash for hash, and verify."""
    inputs = hexes(rfc6962()["rfc6962_8_leaf_tree"]["leaf_inputs_hex"])
    for case in rfc6962()["ctgo_inclusion_proofs"]:
        i, n = case["leaf_index"], case["tree_size"]
        assert inputs[i].hex() == case["leaf_input_hex"]
        proof = merkle.inclusion_proof(inputs[:n], i, "sha256")
        assert [h.hex() for h in proof] == case["proof_hex"]
        root = bytes.fromhex(case["root_hex"])
        assert merkle.verify_inclusion(inputs[i], i, n, proof, root, "sha256")


def test_ctgo_consistency_proofs_are_reproduced_exactly(merkle: ModuleType) -> None:
    """certificate-transparency-go's consistency proofs equal ours hash for hash, and verify."""
    inputs = hexes(rfc6962()["rfc6962_8_leaf_tree"]["leaf_inputs_hex"])
    for case in rfc6962()["ctgo_consistency_proofs"]:
        m, n = case["size1"], case["size2"]
        proof = merkle.consistency_proof(inputs[:n], m, "sha256")
        assert [h.hex() for h in proof] == case["proof_hex"]
        old, new = bytes.fromhex(case["root1_hex"]), bytes.fromhex(case["root2_hex"])
        assert merkle.tree_root(inputs[:m], "sha256") == old
        assert merkle.verify_consistency(m, n, old, new, proof, "sha256")


MTC_LEAVES = [bytes([i]) for i in range(130)]


def mtc_valid_subtrees() -> list[tuple[int, int]]:
    return [(start, end) for end in range(131) for start in range(end + 1) if start % bit_ceil(end - start) == 0]


def test_mtc_subtree_hashes_match_span_root(merkle: ModuleType) -> None:
    """span_root reproduces the Merkle Tree Certificates draft's subtree hash digest over 130 leaves."""
    vectors = rfc6962()["mtc_accumulated_subtree_vectors"]["subtree_hashes"]
    lines = "".join(
        f"[{start}, {end}) {merkle.span_root(MTC_LEAVES, start, end, 'sha256').hex()}\n"
        for start, end in mtc_valid_subtrees()
    )
    assert hashlib.sha256(lines.encode()).hexdigest() == vectors["sha256_of_all_lines"]


def test_mtc_subtree_inclusion_proofs_match_spans_served_from_stored_subtrees(merkle: ModuleType) -> None:
    """Inclusion proofs inside every MTC subtree, built from inclusion_spans and spans_root, match the draft."""
    vectors = rfc6962()["mtc_accumulated_subtree_vectors"]["subtree_inclusion_proofs"]
    lookup = naive.complete_subtrees(MTC_LEAVES, "sha256")
    out = []
    for start, end in mtc_valid_subtrees():
        for index in range(start, end):
            spans = [(a + start, b + start) for a, b in merkle.inclusion_spans(index - start, end - start)]
            hashes = merkle.spans_root(spans, lookup, "sha256")
            out.append(f"{index} [{start}, {end})" + "".join(" " + h.hex() for h in hashes) + "\n")
    assert hashlib.sha256("".join(out).encode()).hexdigest() == vectors["sha256_of_all_lines"]


PROBES = rfc6962()["transparency_dev_probes"]


@pytest.mark.parametrize("probe", PROBES["inclusion"], ids=lambda p: p["file"].removeprefix("testdata/inclusion/"))
def test_transparency_dev_inclusion_probe(merkle: ModuleType, probe: dict[str, Any]) -> None:
    """Our verifier accepts exactly the transparency-dev inclusion probes that want no error."""
    ok = merkle.verify_inclusion_hash(
        bytes.fromhex(probe["leafHash_hex"]),
        probe["leafIdx"],
        probe["treeSize"],
        hexes(probe["proof_hex"]),
        bytes.fromhex(probe["root_hex"]),
        "sha256",
    )
    assert ok is not probe["wantErr"]


# transparency-dev's verifier, for equal sizes, only compares the two roots byte for
# byte and never checks their length, so it accepts this probe's 12-byte placeholder
# root ("don't care 2"). Ours requires every root and proof hash to be exactly
# HASH_SIZE (32) bytes, so a malformed root never verifies, not even against itself.
REJECTED_ON_PURPOSE = {"testdata/consistency/additional/sizes-are-equal-one-and-proof-is-empty.json"}


def test_the_deliberately_rejected_probe_is_the_malformed_root_one(merkle: ModuleType) -> None:
    """The one valid probe we reject has roots that are not 32 bytes, which is why we reject it."""
    (probe,) = [p for p in PROBES["consistency"] if p["file"] in REJECTED_ON_PURPOSE]
    assert probe["wantErr"] is False
    assert len(bytes.fromhex(probe["root1_hex"])) == 12 != merkle.HASH_SIZE


@pytest.mark.parametrize(
    "probe", PROBES["consistency"], ids=lambda p: p["file"].removeprefix("testdata/consistency/")
)
def test_transparency_dev_consistency_probe(merkle: ModuleType, probe: dict[str, Any]) -> None:
    """Our verifier accepts the valid transparency-dev consistency probes and rejects the others."""
    ok = merkle.verify_consistency(
        probe["size1"],
        probe["size2"],
        bytes.fromhex(probe["root1_hex"]),
        bytes.fromhex(probe["root2_hex"]),
        hexes(probe["proof_hex"]),
        "sha256",
    )
    want_ok = not probe["wantErr"] and probe["file"] not in REJECTED_ON_PURPOSE
    assert ok is want_ok


# --- our BLAKE3 golden vectors ----------------------------------------------------------


def test_blake3_golden_roots(merkle: ModuleType) -> None:
    """tree_root reproduces every golden BLAKE3 root of both golden trees."""
    vectors = golden()
    assert merkle.empty_root().hex() == vectors["empty_root_hex"]
    rfc_inputs = rfc6962()["rfc6962_8_leaf_tree"]["leaf_inputs_hex"]
    assert vectors["trees"]["rfc6962-style"]["leaf_inputs_hex"][:8] == rfc_inputs
    assert vectors["trees"]["byte-leaves"]["leaf_inputs_hex"] == [bytes([i]).hex() for i in range(33)]
    for tree in vectors["trees"].values():
        inputs = hexes(tree["leaf_inputs_hex"])
        for size, root in tree["root_hex_by_tree_size"].items():
            assert merkle.tree_root(inputs[: int(size)]).hex() == root


def test_blake3_golden_inclusion_proofs(merkle: ModuleType) -> None:
    """Valid golden inclusion proofs are reproduced and verify; every tampered one is rejected."""
    vectors = golden()
    assert any(not c["want_valid"] for c in vectors["inclusion"])
    for case in vectors["inclusion"]:
        entry, i, n = bytes.fromhex(case["leaf_input_hex"]), case["leaf_index"], case["tree_size"]
        proof, root = hexes(case["proof_hex"]), bytes.fromhex(case["root_hex"])
        assert merkle.leaf_hash(entry).hex() == case["leaf_hash_hex"]
        assert merkle.verify_inclusion(entry, i, n, proof, root) is case["want_valid"], case["name"]
        if case["want_valid"]:
            inputs = hexes(vectors["trees"][case["tree"]]["leaf_inputs_hex"])
            assert merkle.inclusion_proof(inputs[:n], i) == proof


def test_blake3_golden_consistency_proofs(merkle: ModuleType) -> None:
    """Valid golden consistency proofs are reproduced and verify; every tampered one is rejected."""
    vectors = golden()
    assert any(not c["want_valid"] for c in vectors["consistency"])
    for case in vectors["consistency"]:
        m, n = case["size1"], case["size2"]
        old, new = bytes.fromhex(case["root1_hex"]), bytes.fromhex(case["root2_hex"])
        proof = hexes(case["proof_hex"])
        assert merkle.verify_consistency(m, n, old, new, proof) is case["want_valid"], case["name"]
        if case["want_valid"]:
            inputs = hexes(vectors["trees"][case["tree"]]["leaf_inputs_hex"])
            assert merkle.consistency_proof(inputs[:n], m) == proof


def test_blake3_golden_file_is_what_make_vectors_writes() -> None:
    """make_vectors.py regenerates the golden file byte for byte."""
    spec = importlib.util.spec_from_file_location("make_vectors", VECTORS / "make_vectors.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert module.render() == (VECTORS / "blake3_vectors.json").read_text(encoding="utf-8")


# --- argument errors --------------------------------------------------------------


UNKNOWN_ALGO_CALLS: dict[str, Callable[[ModuleType, str], object]] = {
    "leaf_hash": lambda m, a: m.leaf_hash(b"", a),
    "node_hash": lambda m, a: m.node_hash(b"\0" * 32, b"\0" * 32, a),
    "empty_root": lambda m, a: m.empty_root(a),
    "tree_root": lambda m, a: m.tree_root([b"x"], a),
    "span_root": lambda m, a: m.span_root([b"x", b"y"], 0, 2, a),
    "inclusion_proof": lambda m, a: m.inclusion_proof([b"x", b"y"], 0, a),
    "consistency_proof": lambda m, a: m.consistency_proof([b"x", b"y"], 1, a),
    "fold": lambda m, a: m.fold([b"\0" * 32, b"\0" * 32], a),
    "verify_inclusion": lambda m, a: m.verify_inclusion(b"x", 0, 1, [], b"\0" * 32, a),
    "verify_inclusion_hash": lambda m, a: m.verify_inclusion_hash(b"\0" * 32, 0, 1, [], b"\0" * 32, a),
    "root_from_inclusion": lambda m, a: m.root_from_inclusion(b"\0" * 32, 0, 1, [], a),
    "verify_consistency": lambda m, a: m.verify_consistency(1, 2, b"\0" * 32, b"\0" * 32, [b"\0" * 32], a),
    "Frontier": lambda m, a: m.Frontier(algo=a),
}


@pytest.mark.parametrize("algo", ["md5", "SHA256", "", "blake2b"])
@pytest.mark.parametrize("name", sorted(UNKNOWN_ALGO_CALLS))
def test_unknown_algo_raises_invalid_argument(merkle: ModuleType, name: str, algo: str) -> None:
    """Every function taking an algo raises InvalidArgument for an unknown hash name."""
    with pytest.raises(InvalidArgument) as info:
        UNKNOWN_ALGO_CALLS[name](merkle, algo)
    assert info.value.field == "algo"


@pytest.mark.parametrize("n", [0, 1, 2, 7])
def test_out_of_range_index_raises_invalid_argument(merkle: ModuleType, n: int) -> None:
    """inclusion_proof raises InvalidArgument for an index outside [0, size)."""
    entries = ENTRIES[:n]
    for index in (-1, n, n + 1):
        with pytest.raises(InvalidArgument) as info:
            merkle.inclusion_proof(entries, index)
        assert info.value.field == "index"


@pytest.mark.parametrize("n", [0, 1, 5])
def test_out_of_range_sizes_and_spans_raise_invalid_argument(merkle: ModuleType, n: int) -> None:
    """consistency_proof and span_root raise InvalidArgument for sizes or spans outside the tree."""
    entries = ENTRIES[:n]
    for old in (-1, n + 1):
        with pytest.raises(InvalidArgument):
            merkle.consistency_proof(entries, old)
    for start, stop in ((0, n + 1), (-1, n), (1, 0), (n, n + 2)):
        with pytest.raises(InvalidArgument):
            merkle.span_root(entries, start, stop)


@pytest.mark.parametrize("algo", ALGOS)
def test_leaf_hashes_equal_one_leaf_hash_per_entry(merkle: ModuleType, algo: str) -> None:
    """Hashing entries together gives each entry's own leaf hash, on both sides of the pre-absorb size."""
    entries = [b"", b"x", b"a" * 1023, b"b" * 1024, b"c" * 1025, b"d" * 5000, b"e" * 16384, b"f"]
    assert merkle.leaf_hashes(entries, algo) == [merkle.leaf_hash(e, algo) for e in entries]
    assert merkle.leaf_hashes(entries, algo) == [naive.leaf(e, algo) for e in entries]


def test_resolve_a_run_whose_leaves_were_listed_apart_by_earlier_coordinates(merkle: ModuleType) -> None:
    """Leaves asked for alone, out of order, before the subtree over them: the subtree still hashes them in order."""
    entries = [b"", b"", b"\x00", b"", b"", b""]
    lookup = naive.complete_subtrees(entries, "blake3")
    coords = [(0, 2), (0, 0), (0, 4), (2, 0)]
    got = merkle.resolve(coords, _stored_fetch(lookup, []), "blake3")
    assert got == {c: lookup[c] for c in coords}


# --- a root from given leaves and stored subtree roots -------------------------------


def _covers(coord: tuple[int, int], positions: list[int]) -> bool:
    level, idx = coord
    return any(idx << level <= p < (idx + 1) << level for p in positions)


@FAST
@given(case=sts.with_positions(sts.any_entry_lists(300)), algo=sts.algos)
def test_root_with_equals_the_naive_root_from_given_leaves_and_stored_roots(
    merkle: ModuleType, case: tuple[list[bytes], list[int]], algo: str
) -> None:
    """root_with gives MTH from any given leaves, fetching in one call only stored roots over no given position."""
    entries, positions = case
    lookup = naive.complete_subtrees(entries, algo)
    calls: list[list[tuple[int, int]]] = []
    leaves = {p: naive.leaf(entries[p], algo) for p in positions}
    assert merkle.root_with(leaves, len(entries), _stored_fetch(lookup, calls), algo) == naive.mth(entries, algo)
    assert len(calls) == (0 if len(positions) == len(entries) else 1)
    assert not any(_covers(c, positions) for call in calls for c in call)


@FAST
@given(case=sts.with_positions(DISTINCT), data=st.data(), algo=sts.algos)
def test_root_with_a_wrong_given_leaf_gives_another_root(
    merkle: ModuleType, case: tuple[list[bytes], list[int]], data: st.DataObject, algo: str
) -> None:
    """Any single-bit flip of any given leaf, or another position's leaf in its place, changes the root."""
    entries, positions = case
    assume(positions)
    lookup = naive.complete_subtrees(entries, algo)
    leaves = {p: naive.leaf(entries[p], algo) for p in positions}
    p = data.draw(st.sampled_from(positions))
    other = data.draw(st.integers(0, len(entries) - 1).filter(lambda q: q != p)) if len(entries) > 1 else None
    wrong = [flip(leaves[p], data.draw(st.integers(0, 255)))]
    if other is not None:
        wrong.append(naive.leaf(entries[other], algo))
    for leaf in wrong:
        got = merkle.root_with({**leaves, p: leaf}, len(entries), _stored_fetch(lookup, []), algo)
        assert got != naive.mth(entries, algo)


@pytest.mark.parametrize("algo", ALGOS)
def test_root_with_every_set_of_given_positions_in_small_trees(merkle: ModuleType, algo: str) -> None:
    """For sizes 0 to 9, every subset of given positions gives the tree's root."""
    for n in range(10):
        lookup = naive.complete_subtrees(ENTRIES[:n], algo)
        for mask in range(1 << n):
            leaves = {p: naive.leaf(ENTRIES[p], algo) for p in range(n) if mask >> p & 1}
            assert merkle.root_with(leaves, n, _stored_fetch(lookup, []), algo) == roots(algo)[n], (n, mask)


def test_root_with_rejects_positions_outside_the_tree_negative_sizes_and_unknown_hashes(merkle: ModuleType) -> None:
    """A position outside [0, size), a negative size or an unknown algo raises InvalidArgument before any fetch."""
    leaf = merkle.leaf_hash(b"x")
    calls: list[list[tuple[int, int]]] = []
    fetch = _stored_fetch({}, calls)
    for leaves, size, field in [({4: leaf}, 4, "leaves"), ({-1: leaf}, 4, "leaves"), ({0: leaf}, 0, "leaves"),
                                ({}, -1, "size")]:  # fmt: skip
        with pytest.raises(InvalidArgument) as info:
            merkle.root_with(leaves, size, fetch)
        assert info.value.field == field
    with pytest.raises(InvalidArgument) as info:
        merkle.root_with({}, 0, fetch, "md5")
    assert info.value.field == "algo"
    assert calls == []
    assert merkle.root_with({}, 0, fetch) == merkle.empty_root()


def _share_run_alongside(call: Callable[[], object]) -> float:
    """Return the share of ``call``'s time (run in another thread) during which this thread also ran.

    While ``call`` holds the GIL this thread cannot take a step, so the share is near 0;
    while it has released it, this thread steps all along, so the share is near 1.
    """
    import threading
    import time

    window: list[float] = []
    steps: list[float] = []
    done = threading.Event()

    def work() -> None:
        window.append(time.perf_counter())
        call()
        window.append(time.perf_counter())
        done.set()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-4)  # hand the GIL back soon after a call returns, so the window ends with it
    try:
        worker = threading.Thread(target=work)
        worker.start()
        clock, note = time.perf_counter, steps.append
        while not done.is_set():
            note(clock())
        worker.join()
    finally:
        sys.setswitchinterval(interval)
    start, end = window
    inside = [t for t in steps if start < t < end]
    return (max(inside) - min(inside)) / (end - start) if len(inside) > 1 else 0.0


def test_the_gil_probe_tells_held_from_released() -> None:
    """The probe below itself: a C loop that keeps the GIL gives a share near 0, a sleep near 1."""
    import time

    assert _share_run_alongside(lambda: sum(range(2 * 10**7))) < 0.3
    assert _share_run_alongside(lambda: time.sleep(0.05)) > 0.5


@pytest.mark.parametrize("what", ["leaf_hashes", "tree_root", "content digest"])
def test_native_hashing_releases_the_gil_so_other_threads_run(what: str) -> None:
    """While a large batch is hashed natively, another Python thread keeps running (held, it could not take a step)."""
    import compactstore.content as content

    _native_and_pure()
    bodies = [bytes([i % 251]) * 65536 for i in range(2048)]  # 128 MiB: tens of milliseconds of hashing
    call: Callable[[], object] = {
        "leaf_hashes": lambda: public_merkle.leaf_hashes(bodies),
        "tree_root": lambda: public_merkle.tree_root(bodies),
        "content digest": lambda: content.digester().update(bodies),
    }[what]
    assert _share_run_alongside(call) > 0.5
