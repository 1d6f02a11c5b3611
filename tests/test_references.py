"""A caller's copy of a logged event, and a proof, are taken at their word only where the log or a MAC binds it.

Every session method that takes a ``Node`` or a ``Marker`` (read from their signatures,
so a new one is held to this too) takes its position only once its session and leaf
are this session's. ``proof check`` names a session only when the head MAC binds it, and
with the key every field of a proof is bound: an edit to any one of them is refused.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner

import compactstore as cs
from compactstore.cli import main
from compactstore.cli.proof import ConsistencyProof, InclusionProof
from compactstore.store import Session

KEY = "correct horse battery staple"
ENV = {"CS_TEST_KEY": KEY}


class _Str(str):
    """A str that says it equals anything."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = str.__hash__


class _Bytes(bytes):
    """Bytes that say they equal anything."""

    def __eq__(self, other: object) -> bool:
        return True

    def __ne__(self, other: object) -> bool:
        return False

    __hash__ = bytes.__hash__


def _story(s: cs.Session) -> tuple[cs.Node, cs.Node, cs.Marker]:
    """Log two L1 nodes over contiguous spans and a marker over the second; return them."""
    s.extend([cs.Turn("user", "one"), cs.Turn("user", "two")])
    first = s.compact(0, 2, summary="first")  # 2
    s.extend([cs.Turn("user", "three"), cs.Turn("user", "four")])
    second = s.compact(2, 5, summary="second")  # 5
    return first, second, s.mark(second)


#: Each session method's parameters that take a Node or a Marker, read from the signatures.
TAKERS = [(name, p.name) for name, fn in inspect.getmembers(Session, inspect.isfunction) if not name.startswith("_")
          for p in list(inspect.signature(fn).parameters.values())[1:]
          if "Node" in str(p.annotation) or "Marker" in str(p.annotation)]


def test_the_methods_taking_references_are_found() -> None:
    """The signature scan finds the known takers (a guard on the scan)."""
    assert {("roll_up", "nodes"), ("artifact", "node"), ("restore_span", "node"), ("resume", "marker"),
            ("mark", "node")} <= set(TAKERS)


def _variants(own: Any, foreign: Any, elsewhere: int) -> dict[str, Any]:
    """Return copies of ``own`` that are not the event it names: another session's, edited, moved, or lying about their types."""
    replace = msgspec.structs.replace
    return {
        "another session's": foreign,
        "another session's, named by a str that equals anything": replace(foreign, session=_Str(foreign.session)),
        "its leaf edited": replace(own, leaf=bytes(32)),
        "its leaf edited, by bytes that equal anything": replace(own, leaf=_Bytes(bytes(32))),
        "moved to another position": replace(own, pos=elsewhere),
        "a bool for a position": replace(own, pos=True),
        "a str for a position": replace(own, pos=str(own.pos)),
    }


@pytest.mark.parametrize(("method", "param"), TAKERS, ids=[f"{m}.{p}" for m, p in TAKERS])
def test_a_reference_not_to_this_sessions_event_is_refused(store: cs.Store, method: str, param: str) -> None:
    """Every Node or Marker a method takes is refused (ForeignReference, or InvalidArgument for no position) unless it is this session's event; nothing is written."""
    a, b = store.session("a"), store.session("b")
    first, second, marker = _story(a)
    other_first, other_second, other_marker = _story(b)
    annotation = str(inspect.signature(getattr(Session, method)).parameters[param].annotation)
    if "Marker" in annotation:
        variants = _variants(marker, other_marker, second.pos)
    else:
        variants = _variants(first, other_first, second.pos)

    def call(obj: Any) -> object:
        arg = [obj, second] if "Sequence" in annotation else obj
        return getattr(a, method)(**{param: arg})

    size = a.size
    for label, obj in variants.items():
        with pytest.raises(cs.InvalidArgument) as info:
            call(obj)
        if label != "a str for a position" and label != "a bool for a position":
            assert isinstance(info.value, cs.errors.ForeignReference), (label, info.value)
        assert a.size == size, label
    call(marker if "Marker" in annotation else first)  # its own event is taken


def test_roll_up_of_another_sessions_nodes_rolls_up_nothing(store: cs.Store) -> None:
    """a.roll_up(nodes of b) is refused, though b's nodes sit at a's positions with a's very spans."""
    a, b = store.session("a"), store.session("b")
    _story(a)
    first, second, _ = _story(b)
    with pytest.raises(cs.errors.ForeignReference):
        a.roll_up([first, second])
    assert a.roll_up([a.node(first.pos), a.node(second.pos)]).tier == 2


# --- proof check -------------------------------------------------------------------------


def _run(*args: str, input: str | None = None) -> Any:
    return CliRunner().invoke(main, list(args), input=input, env=ENV)


@pytest.fixture
def proofs(target: str) -> dict[str, dict[str, Any]]:
    """Return an inclusion and a consistency proof from session 'a' of a keyed store."""
    with cs.open(target, key=KEY, clock=cs.events.tick_clock()) as store:
        s = store.session("a")
        s.extend([cs.Turn("user", f"turn {i}") for i in range(6)])
    out = {}
    for kind, args in (("inclusion", ("proof", "inclusion", "3")), ("consistency", ("proof", "consistency", "2"))):
        got = _run(*args, "-s", target, "--key-env", "CS_TEST_KEY")
        assert got.exit_code == 0, got.output
        out[kind] = json.loads(got.stdout)
    return out


@pytest.mark.parametrize("kind", ["inclusion", "consistency"])
def test_a_proof_relabelled_to_another_session_is_not_reported_as_its(proofs: dict[str, dict[str, Any]], kind: str) -> None:
    """Without the key, the session is the proof's word, never reported as proven; with it, a relabelled proof is refused."""
    doc = proofs[kind]
    relabelled = json.dumps(dict(doc, session="other"))
    plain = _run("proof", "check", input=relabelled)
    assert plain.exit_code == 0 and "in 'other'" not in plain.stdout and "'other' at size" not in plain.stdout
    assert "session 'other' is the proof's word" in plain.stdout
    keyed = _run("proof", "check", "--key-env", "CS_TEST_KEY", input=relabelled)
    assert keyed.exit_code == 1 and "head MAC does not verify" in keyed.output
    good = _run("proof", "check", "--key-env", "CS_TEST_KEY", "--json", input=json.dumps(doc))
    assert good.exit_code == 0 and json.loads(good.stdout)["session"] == "a"
    bare = _run("proof", "check", "--key-env", "CS_TEST_KEY", input=json.dumps(dict(doc, mac=None)))
    assert bare.exit_code == 1 and "carries no head MAC" in bare.output


def _edits(value: object, name: str) -> list[object]:
    """Return values other than ``value`` that a forger might put in field ``name``."""
    if name == "algo":
        return ["sha256" if value == "blake3" else "blake3"]
    if isinstance(value, bool) or value is None:
        return []
    if isinstance(value, int):
        return [value + 1, value - 1]
    if isinstance(value, list):
        return [[], [*value, "00" * 32]] + ([[value[0][:-1] + ("0" if value[0][-1] != "0" else "1"), *value[1:]]] if value else [])
    if isinstance(value, str) and all(c in "0123456789abcdef" for c in value) and len(value) % 2 == 0 and value:
        return [value[:-1] + ("0" if value[-1] != "0" else "1")]
    assert isinstance(value, str)
    return [value + " ", "other"]


@pytest.mark.parametrize("kind", ["inclusion", "consistency"])
def test_with_the_key_every_field_of_a_proof_is_bound(proofs: dict[str, dict[str, Any]], kind: str) -> None:
    """An edit to any one field of a proof (read from its type, so a new field is held too) is refused when checked with the key."""
    doc = proofs[kind]
    fields = (InclusionProof if kind == "inclusion" else ConsistencyProof).__struct_fields__
    assert _run("proof", "check", "--key-env", "CS_TEST_KEY", input=json.dumps(doc)).exit_code == 0
    edited = 0
    for name in fields:
        for value in _edits(doc.get(name), name):
            got = _run("proof", "check", "--key-env", "CS_TEST_KEY", input=json.dumps(dict(doc, **{name: value})))
            assert got.exit_code in (1, 2), (name, value, got.output)
            edited += 1
    assert edited >= len(fields)


def test_an_unkeyed_stores_proof_checked_with_a_key_is_refused(target: str) -> None:
    """A proof with no head MAC binds no session: checked with a key, it is refused."""
    with cs.open(target, clock=cs.events.tick_clock()) as store:
        store.session("a").append(cs.Turn("user", "x"))
    got = _run("proof", "inclusion", "0", "-s", target)
    assert got.exit_code == 0
    assert _run("proof", "check", "--key-env", "CS_TEST_KEY", input=got.stdout).exit_code == 1
    assert _run("proof", "check", input=got.stdout).exit_code == 0
