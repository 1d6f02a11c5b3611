"""A literal is held to another by its canonical bytes, everywhere: ``1``, ``1.0`` and ``true`` are three literals.

Python's ``==`` says ``True == 1 == 1.0`` and ``0.0 == -0.0``: a spill, an excerpt, an
attempt, an artifact or a tool result holding one of these for a logged other is refused,
on both backends, and a source scan finds no JSON value compared by ``==`` in the package.
"""

from __future__ import annotations

import ast
from pathlib import Path

import msgspec
import pytest
from forge import unchecked
from hypothesis import given, settings
from hypothesis import strategies as st

import compactstore as cs
from compactstore import compaction, rules
from compactstore import events as ev
from compactstore.resolver import artifact_digest

from strategies import json_values

#: (logged, given): equal by Python, each another literal by its bytes.
PAIRS = [(1, True), (True, 1), (0, False), (1, 1.0), (1.0, 1), (0, 0.0), (0.0, -0.0), (False, 0.0),
         ([1], [True]), ({"a": 1}, {"a": 1.0})]
IDS = [f"{a!r}-for-{b!r}" for a, b in PAIRS]


@given(json_values, json_values)
@settings(max_examples=300, deadline=None)
def test_same_value_is_equal_canonical_bytes(a: object, b: object) -> None:
    """same_value holds exactly when the canonical JSON bytes are equal, and a value is always itself."""
    assert rules.same_value(a, b) == (ev.encode_json(a) == ev.encode_json(b))
    assert rules.same_value(a, msgspec.json.decode(msgspec.json.encode(a)))


@pytest.mark.parametrize(("logged", "given"), PAIRS, ids=IDS)
def test_python_equal_values_are_other_literals(logged: object, given: object) -> None:
    """Each pair is equal by ``==`` and not the same value."""
    assert logged == given and not rules.same_value(logged, given)


def _story(s: cs.Session, logged: object) -> list[ev.Event]:
    """Bind ``logged`` (pos 0) that an open obligation needs; return the spill and node that compact [0, 3) with it spilled."""
    s.bind("n", logged)  # 0
    s.oblige("o", needs=["n"])  # 1
    s.append(cs.Turn("user", "go"))  # 2
    return compaction.compaction(s.view, 3, 0, 3, summary="went", on_risk="spill")


def _forged(events: list[ev.Event], given: object) -> tuple[ev.Spill, ev.Summary]:
    """Return the spill holding ``given`` instead, with its own digest, and the node pointing at it."""
    spill, node = events
    assert isinstance(spill, ev.Spill) and isinstance(node, ev.Summary)
    forged = msgspec.structs.replace(spill, value=given, digest=rules.value_digest(given))
    return forged, msgspec.structs.replace(node, spills=[msgspec.structs.replace(node.spills[0], digest=forged.digest)])


@pytest.mark.parametrize(("logged", "given"), PAIRS, ids=IDS)
def test_admission_refuses_a_spill_or_excerpt_of_an_equal_other_value(store: cs.Store, logged: object, given: object) -> None:
    """A spill, or a node's kept excerpt, holding ``given`` for a binding of ``logged`` is refused; nothing is written."""
    s = store.session("s")
    events = _story(s, logged)
    forged, node = _forged(events, given)
    with pytest.raises(cs.InvalidEvent) as info:
        s.append(forged)
    assert info.value.field == "value"
    kept = compaction.compaction(s.view, 3, 0, 3, summary="went", on_risk="preserve")[-1]
    assert isinstance(kept, ev.Summary)
    with pytest.raises(cs.CompactionInvariantError):
        s.append(msgspec.structs.replace(kept, kept=[ev.Excerpt(0, "value", given)]))
    assert s.size == 3


@pytest.mark.parametrize(("logged", "given"), PAIRS, ids=IDS)
def test_a_spill_of_an_equal_other_value_planted_past_admission_certifies_nothing(store: cs.Store, logged: object,
                                                                                  given: object) -> None:
    """Planted by a writer that skips the rules: no marker is emitted over it, a planted one falls back, nothing states it as needed."""
    s = store.session("s")
    forged, node = _forged(_story(s, logged), given)
    with unchecked():
        s.extend([forged, node])  # 3, 4
    assert rules.spill_problem(forged, s.read(0).event, "spill:3") is not None
    with pytest.raises(cs.MarkerInvalid):
        s.mark(4)
    marker = ev.RecoveryMarker(size=5, root=s.head(5).root.hex(), node=4, conditions=list(rules.CONDITIONS), path=[4])
    with unchecked():
        pos = s.append(marker).pos
    for rehash in (False, True):
        got = s.resume(pos, rehash=rehash)
        assert got.mode == "fallback" and any("spill:3" in r for r in got.reasons)
        assert not got.needed


@pytest.mark.parametrize(("logged", "given"), PAIRS[:1], ids=IDS[:1])
def test_spilled_refuses_a_spill_of_an_equal_other_value(store: cs.Store, logged: object, given: object) -> None:
    """Session.spilled never returns a spill's value where the binding it stands for holds another literal."""
    s = store.session("s")
    forged, node = _forged(_story(s, logged), given)
    with unchecked():
        s.extend([forged, node])
    with pytest.raises(cs.IntegrityError):
        s.spilled("spill:3")


@pytest.mark.parametrize(("logged", "given"), PAIRS, ids=IDS)
def test_retries_and_reconstruction_hold_literals_by_bytes(store: cs.Store, logged: object, given: object) -> None:
    """An attempt, a use, a tool result or an edited artifact holding ``given`` for a logged ``logged`` is refused."""
    s = store.session("s")
    s.bind("n", logged)
    s.append(cs.Turn("user", "go"))
    art = s.artifact(s.compact(0, 2, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO))
    assert rules.same_value(art.payload["literals"]["n"], logged)  # type: ignore[index]
    s.append(ev.Attempt(key="a", operation="commit", literals={"n": logged}))
    with pytest.raises(cs.ReconstructionUnsoundError):
        s.append(ev.Attempt(key="a", operation="commit", literals={"n": given}))
    with pytest.raises(cs.ReconstructionUnsoundError):
        s.reconstruct(art, "plan", uses={"n": given})
    with pytest.raises(cs.ReconstructionUnsoundError):
        s.reconstruct(art, "plan", uses={"fresh": logged}, tool_results=[given])
    payload = {**art.payload, "literals": {**art.payload["literals"], "n": given}}  # type: ignore[dict-item]
    edited = msgspec.structs.replace(art, payload=payload)
    edited = msgspec.structs.replace(edited, digest=artifact_digest(
        edited.payload, edited.span_root, loss=edited.loss, session=edited.session, node=edited.node, size=edited.size,
        root=edited.root, store=edited.store))
    for call in (lambda: s.reconstruct(edited, "authorize"), lambda: cs.reconstruct(edited, "authorize", s.lookup)):
        with pytest.raises(cs.ReconstructionUnsoundError):
            call()
    assert s.reconstruct(art, "authorize") == art.payload


#: Attribute names that hold JSON values: compared by ``==``, ``1`` would pass for ``true``.
JSON_ATTRIBUTES = {"value", "output", "args", "literals", "meta", "payload"}


def _json_compares(source: str) -> list[int]:
    """Return the lines of ``source`` that compare a JSON-valued attribute by ``==``, ``!=``, ``in`` or ``not in``."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare) and any(isinstance(op, ast.Eq | ast.NotEq | ast.In | ast.NotIn) for op in node.ops):
            operands = [node.left, *node.comparators]
            if any(isinstance(o, ast.Attribute) and o.attr in JSON_ATTRIBUTES for o in operands):
                out.append(node.lineno)
    return out


def test_no_json_value_is_compared_by_python_equality_in_the_package() -> None:
    """Every place a literal is held to another goes through rules.same_value (a scan of the source)."""
    root = Path(cs.__file__).parent
    found = {str(p.relative_to(root)): lines for p in sorted(root.rglob("*.py"))
             if (lines := _json_compares(p.read_text()))}
    assert found == {}


def test_the_scan_finds_a_python_equality_of_values() -> None:
    """The scan itself: it flags the comparison that let a spill of ``true`` stand for a binding of ``1``."""
    assert _json_compares("ok = spill.value == source.value\nok = a.key == b.key\nok = x in e.literals\n") == [1, 3]


@given(st.sampled_from(PAIRS))
def test_value_digest_tells_the_pairs_apart(pair: tuple[object, object]) -> None:
    """A spill's digest is of its bytes: the digest of one literal of a pair is not the other's."""
    assert rules.value_digest(pair[0]) != rules.value_digest(pair[1])
