"""The frozen encoding: every event kind's bytes and leaf, as ``tests/vectors/golden_events.json`` holds them.

A store written by one release must verify, resume and restore under every later one,
so the bytes of an event, once written, never change meaning or form. The golden file
is append-only: its first ``FROZEN`` bodies are pinned by their Merkle root here, so
regenerating the file cannot quietly rewrite them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import msgspec
import pytest

from compactstore import events as ev
from compactstore import merkle, merkle_pure

VECTORS = Path(__file__).resolve().parent / "vectors"
sys.path.insert(0, str(VECTORS))

import make_golden  # noqa: E402

#: How many golden bodies are frozen, and the RFC 9162 root over them (BLAKE3).
FROZEN = (30, "4270a91e9da81e1484a69045184ddf3c737f5366ec1b17b896287a1a81ebb6b2")


def _golden() -> dict[str, Any]:
    return json.loads((VECTORS / "golden_events.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


ROWS = _golden()["events"]


def test_the_frozen_bodies_are_unchanged() -> None:
    """The first FROZEN bodies of the file are the ones the contract pinned, byte for byte."""
    count, root = FROZEN
    bodies = [r["body"].encode() for r in ROWS]
    assert len(bodies) >= count
    assert merkle_pure.tree_root(bodies[:count]).hex() == root


def test_the_file_is_what_the_generator_writes() -> None:
    """Today's encoder writes each golden event as the file holds it: a change to any kind's bytes fails here."""
    assert make_golden.written() == (VECTORS / "golden_events.json").read_text(encoding="utf-8")


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}-{r['kind']}" for i, r in enumerate(ROWS)])
def test_each_body_decodes_and_encodes_to_itself(row: dict[str, str]) -> None:
    """A golden body decodes to its kind, and canonical encoding gives back the same bytes."""
    body = row["body"].encode()
    event = ev.decode(body)
    assert event.kind == row["kind"]
    assert ev.canonical(event)[1] == body
    assert ev.encode(event) == body


@pytest.mark.parametrize("row", ROWS, ids=[f"{i}-{r['kind']}" for i, r in enumerate(ROWS)])
def test_each_leaf_is_the_same_on_the_native_and_pure_paths(row: dict[str, str]) -> None:
    """The leaf of a golden body is the golden leaf, through the native core and the pure reference."""
    body = row["body"].encode()
    assert merkle.leaf_hash(body).hex() == row["leaf"]
    assert merkle_pure.leaf_hash(body).hex() == row["leaf"]


def test_the_tree_over_every_golden_body_has_the_golden_root() -> None:
    bodies = [r["body"].encode() for r in ROWS]
    assert merkle.tree_root(bodies).hex() == _golden()["root"]
    assert merkle_pure.tree_root(bodies).hex() == _golden()["root"]


def test_every_stored_kind_and_field_has_a_golden_body() -> None:
    """A new kind, or a new field of a kind, is not covered until a golden body shows it set."""
    stored = {t for t in ev.EVENT_TYPES if t is not ev.Redacted}  # a read's placeholder, never a body
    seen: dict[str, set[str]] = {}
    for r in ROWS:
        seen.setdefault(r["kind"], set()).update(json.loads(r["body"]))
    for t in stored:
        kind = str(t.__struct_config__.tag)
        assert kind in seen, f"no golden body of kind {kind!r}"
        info = msgspec.inspect.type_info(t)
        assert isinstance(info, msgspec.inspect.StructType)
        missing = {f.encode_name for f in info.fields} - seen[kind]
        assert not missing, f"golden bodies of {kind!r} never set {sorted(missing)}"
