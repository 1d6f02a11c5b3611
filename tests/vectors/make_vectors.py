#!/usr/bin/env python3
"""Regenerate ``blake3_vectors.json``, the BLAKE3 golden vectors of compactstore.merkle.

    python tests/vectors/make_vectors.py          # rewrite the file
    python tests/vectors/make_vectors.py --check  # exit 1 if the file is stale

Every hash is computed with the naive RFC 9162 oracle (``tests/naive_merkle.py``),
not with the code under test; ``compactstore.merkle`` is then asked to agree, and
to reject every tampered case, before anything is written. The output depends on
nothing but this script, so regenerating it gives the same bytes.

Two trees are used:

* ``rfc6962-style``: 16 entries, the first 8 being RFC 6962's test inputs
  ("", 00, 10, 2021, 3031, 40414243, ...) and entry i >= 8 the i bytes
  ``16*(i-1), 16*(i-1)+1, ...``, continuing their pattern of one byte run per leaf.
* ``byte-leaves``: 33 entries, entry i being the single byte ``i``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUT = HERE / "blake3_vectors.json"
sys.path.insert(0, str(HERE.parent))

import naive_merkle as naive  # noqa: E402

from compactstore import merkle  # noqa: E402

ALGO = "blake3"

RFC6962_INPUTS = [
    bytes.fromhex(h)
    for h in (
        "",
        "00",
        "10",
        "2021",
        "3031",
        "40414243",
        "5051525354555657",
        "606162636465666768696a6b6c6d6e6f",
    )
]
RFC_STYLE = RFC6962_INPUTS + [bytes(range(16 * (i - 1), 16 * (i - 1) + i)) for i in range(8, 16)]
BYTE_LEAVES = [bytes([i]) for i in range(33)]
TREES = {"rfc6962-style": RFC_STYLE, "byte-leaves": BYTE_LEAVES}

# (tree, leaf_index, tree_size)
INCLUSION_VALID = [
    ("rfc6962-style", 0, 1),
    ("rfc6962-style", 0, 8),
    ("rfc6962-style", 5, 8),
    ("rfc6962-style", 2, 3),
    ("rfc6962-style", 1, 5),
    ("rfc6962-style", 6, 7),
    ("rfc6962-style", 0, 16),
    ("rfc6962-style", 15, 16),
    ("rfc6962-style", 10, 13),
    ("rfc6962-style", 12, 13),
    ("byte-leaves", 0, 33),
    ("byte-leaves", 17, 33),
    ("byte-leaves", 32, 33),
    ("byte-leaves", 31, 32),
    ("byte-leaves", 5, 21),
]
INCLUSION_TAMPER_BASES = [("rfc6962-style", 5, 8), ("rfc6962-style", 10, 13), ("byte-leaves", 17, 31)]

# (tree, size1, size2)
CONSISTENCY_VALID = [
    ("rfc6962-style", 0, 0),
    ("rfc6962-style", 0, 5),
    ("rfc6962-style", 1, 1),
    ("rfc6962-style", 1, 8),
    ("rfc6962-style", 6, 8),
    ("rfc6962-style", 2, 5),
    ("rfc6962-style", 6, 7),
    ("rfc6962-style", 3, 16),
    ("rfc6962-style", 7, 16),
    ("rfc6962-style", 8, 16),
    ("rfc6962-style", 15, 16),
    ("rfc6962-style", 4, 13),
    ("byte-leaves", 1, 33),
    ("byte-leaves", 5, 33),
    ("byte-leaves", 16, 33),
    ("byte-leaves", 32, 33),
    ("byte-leaves", 21, 29),
]
CONSISTENCY_TAMPER_BASES = [("rfc6962-style", 6, 8), ("rfc6962-style", 4, 13), ("byte-leaves", 21, 29)]

EXTRA = naive.HASHES[ALGO](b"extra")


def true_root(tree: str, size: int) -> bytes:
    """Return the real root of the first ``size`` entries of ``tree``."""
    assert size <= len(TREES[tree])
    return naive.mth(TREES[tree][:size], ALGO)


def flip(h: bytes, bit: int) -> bytes:
    """Return ``h`` with bit ``bit`` (0 = most significant bit of byte 0) inverted."""
    b = bytearray(h)
    b[bit // 8] ^= 0x80 >> (bit % 8)
    return bytes(b)


def hexes(hashes: list[bytes]) -> list[str]:
    return [h.hex() for h in hashes]


def inclusion_case(tree: str, index: int, size: int) -> dict[str, Any]:
    entries = TREES[tree][:size]
    proof = naive.path(index, entries, ALGO)
    root = naive.mth(entries, ALGO)
    assert merkle.inclusion_proof(entries, index, ALGO) == proof, (tree, index, size)
    assert merkle.tree_root(entries, ALGO) == root, (tree, size)
    return {
        "name": "valid",
        "tree": tree,
        "leaf_index": index,
        "tree_size": size,
        "leaf_input_hex": entries[index].hex(),
        "leaf_hash_hex": naive.leaf(entries[index], ALGO).hex(),
        "proof_hex": hexes(proof),
        "root_hex": root.hex(),
        "want_valid": True,
    }


def inclusion_tampers(base: dict[str, Any]) -> list[dict[str, Any]]:
    proof = [bytes.fromhex(h) for h in base["proof_hex"]]
    root = bytes.fromhex(base["root_hex"])
    entry = bytes.fromhex(base["leaf_input_hex"])
    index, size = base["leaf_index"], base["tree_size"]
    changes: list[tuple[str, dict[str, Any]]] = []
    for j in range(len(proof)):
        bit = (37 * j + 3) % 256
        changes.append((f"flipped-bit-in-proof-{j}", {"proof": proof[:j] + [flip(proof[j], bit)] + proof[j + 1 :]}))
    changes += [
        ("wrong-index", {"index": index + 1 if index + 1 < size else index - 1}),
        ("index-equals-size", {"index": size}),
        ("wrong-size-plus-1", {"size": size + 1, "root": true_root(base["tree"], size + 1)}),
        ("wrong-size-minus-1", {"size": size - 1, "root": true_root(base["tree"], size - 1)}),
        ("wrong-size-doubled-same-root", {"size": size * 2}),
        ("wrong-leaf", {"entry": entry + b"\x00"}),
        ("wrong-root", {"root": flip(root, 255)}),
        ("empty-root", {"root": naive.mth([], ALGO)}),
        ("truncated-proof", {"proof": proof[:-1]}),
        ("extra-hash", {"proof": proof + [EXTRA]}),
        ("prepended-root", {"proof": [root] + proof}),
        ("swapped-proof-hashes", {"proof": [proof[1], proof[0]] + proof[2:]}),
        ("reversed-proof", {"proof": proof[::-1]}),
        ("empty-proof", {"proof": []}),
        ("short-hash-in-proof", {"proof": [proof[0][:31]] + proof[1:]}),
    ]
    out = []
    for name, change in changes:
        case = {
            "name": name,
            "tree": base["tree"],
            "leaf_index": change.get("index", index),
            "tree_size": change.get("size", size),
            "leaf_input_hex": change.get("entry", entry).hex(),
            "leaf_hash_hex": naive.leaf(change.get("entry", entry), ALGO).hex(),
            "proof_hex": hexes(change.get("proof", proof)),
            "root_hex": change.get("root", root).hex(),
            "want_valid": False,
        }
        out.append(case)
    return out


def consistency_case(tree: str, size1: int, size2: int) -> dict[str, Any]:
    entries = TREES[tree][:size2]
    proof = naive.proof(size1, entries, ALGO) if size1 else []
    root1, root2 = naive.mth(entries[:size1], ALGO), naive.mth(entries, ALGO)
    assert merkle.consistency_proof(entries, size1, ALGO) == proof, (tree, size1, size2)
    return {
        "name": "valid",
        "tree": tree,
        "size1": size1,
        "size2": size2,
        "root1_hex": root1.hex(),
        "root2_hex": root2.hex(),
        "proof_hex": hexes(proof),
        "want_valid": True,
    }


def consistency_tampers(base: dict[str, Any]) -> list[dict[str, Any]]:
    proof = [bytes.fromhex(h) for h in base["proof_hex"]]
    root1, root2 = bytes.fromhex(base["root1_hex"]), bytes.fromhex(base["root2_hex"])
    size1, size2 = base["size1"], base["size2"]
    changes: list[tuple[str, dict[str, Any]]] = []
    for j in range(len(proof)):
        bit = (37 * j + 4) % 256
        changes.append((f"flipped-bit-in-proof-{j}", {"proof": proof[:j] + [flip(proof[j], bit)] + proof[j + 1 :]}))
    changes += [
        ("wrong-size1", {"size1": size1 + 1, "root1": true_root(base["tree"], size1 + 1)}),
        ("wrong-size2", {"size2": size2 + 1, "root2": true_root(base["tree"], size2 + 1)}),
        ("size1-greater-than-size2", {"size1": size2 + 1, "root1": true_root(base["tree"], size2 + 1)}),
        ("size1-zero", {"size1": 0}),
        ("wrong-root1", {"root1": flip(root1, 255)}),
        ("wrong-root2", {"root2": flip(root2, 255)}),
        ("swapped-roots", {"root1": root2, "root2": root1}),
        ("truncated-proof", {"proof": proof[:-1]}),
        ("extra-hash", {"proof": proof + [EXTRA]}),
        ("prepended-root1", {"proof": [root1] + proof}),
        ("swapped-proof-hashes", {"proof": [proof[1], proof[0]] + proof[2:]}),
        ("reversed-proof", {"proof": proof[::-1]}),
        ("empty-proof", {"proof": []}),
        ("short-hash-in-proof", {"proof": [proof[0][:31]] + proof[1:]}),
    ]
    out = []
    for name, change in changes:
        out.append(
            {
                "name": name,
                "tree": base["tree"],
                "size1": change.get("size1", size1),
                "size2": change.get("size2", size2),
                "root1_hex": change.get("root1", root1).hex(),
                "root2_hex": change.get("root2", root2).hex(),
                "proof_hex": hexes(change.get("proof", proof)),
                "want_valid": False,
            }
        )
    return out


def check_inclusion(case: dict[str, Any]) -> bool:
    return merkle.verify_inclusion(
        bytes.fromhex(case["leaf_input_hex"]),
        case["leaf_index"],
        case["tree_size"],
        [bytes.fromhex(h) for h in case["proof_hex"]],
        bytes.fromhex(case["root_hex"]),
        ALGO,
    )


def check_consistency(case: dict[str, Any]) -> bool:
    return merkle.verify_consistency(
        case["size1"],
        case["size2"],
        bytes.fromhex(case["root1_hex"]),
        bytes.fromhex(case["root2_hex"]),
        [bytes.fromhex(h) for h in case["proof_hex"]],
        ALGO,
    )


def cross_check(cases: list[dict[str, Any]], verify: Callable[[dict[str, Any]], bool]) -> None:
    for case in cases:
        got = verify(case)
        if got != case["want_valid"]:
            raise SystemExit(f"compactstore.merkle disagrees with the oracle on {case}: verified={got}")


def build() -> dict[str, Any]:
    """Return the vectors document."""
    inclusion = [inclusion_case(*c) for c in INCLUSION_VALID]
    for base in INCLUSION_TAMPER_BASES:
        inclusion += inclusion_tampers(inclusion_case(*base))
    consistency = [consistency_case(*c) for c in CONSISTENCY_VALID]
    for base in CONSISTENCY_TAMPER_BASES:
        consistency += consistency_tampers(consistency_case(*base))
    cross_check(inclusion, check_inclusion)
    cross_check(consistency, check_consistency)

    trees: dict[str, Any] = {}
    for name, entries in TREES.items():
        roots = {str(n): naive.mth(entries[:n], ALGO).hex() for n in range(len(entries) + 1)}
        for n, root in roots.items():
            assert merkle.tree_root(entries[: int(n)], ALGO).hex() == root, (name, n)
        trees[name] = {"leaf_inputs_hex": [e.hex() for e in entries], "root_hex_by_tree_size": roots}

    return {
        "description": (
            "BLAKE3 golden vectors for compactstore.merkle (RFC 9162 tree shape). "
            "Leaf hash = BLAKE3(0x00 || input); node hash = BLAKE3(0x01 || left || right); "
            "root of the empty tree = BLAKE3(''). All hashes hex-encoded, indexes 0-based. "
            "Computed by tests/naive_merkle.py; regenerate with tests/vectors/make_vectors.py. "
            "Cases with want_valid false are valid cases with one named change (their 'name'); "
            "a changed size comes with the true root of that size unless the name says 'same-root'. "
            "A consistency proof from size 0 is empty and needs root1 = the empty root."
        ),
        "hash": ALGO,
        "empty_root_hex": naive.mth([], ALGO).hex(),
        "trees": trees,
        "inclusion": inclusion,
        "consistency": consistency,
    }


def render() -> str:
    """Return the file's exact text."""
    return json.dumps(build(), indent=1) + "\n"


def main(argv: list[str]) -> int:
    text = render()
    if "--check" in argv:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT} is stale; run {Path(__file__).name} to regenerate it", file=sys.stderr)
            return 1
        print(f"{OUT} is up to date")
        return 0
    OUT.write_text(text, encoding="utf-8", newline="\n")
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
