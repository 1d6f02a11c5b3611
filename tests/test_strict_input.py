"""Strict input: unknown fields, repeated keys and wrong types are refused by name, and nothing is written.

Every public entry point checks each argument by its kind (a position, a flag, text, a
list of text, a JSON mapping, a callable) in one place: a bool is not a position, a str
is not a list of str, None is not a value. Decoding refuses a field the event's kind
does not have and a key given twice in one JSON object.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec
import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compaction import migration

import compactstore as cs
from compactstore import events as ev
from compactstore.cli import main


@pytest.fixture
def session(store: cs.Store) -> cs.Session:
    """Return a session holding the migration story."""
    s = store.session("migration")
    migration(s)
    return s


def _state(target: str) -> tuple[bytes, ...] | tuple[str, int, bytes]:
    """Return what must not change: a SQLite file's bytes (and its WAL's), else each session's size and root."""
    if "://" not in target:
        return tuple(Path(target + suffix).read_bytes() if Path(target + suffix).exists() else b""
                     for suffix in ("", "-wal"))
    with cs.open(target) as st:
        heads = [st.session(n).head() for n in st.sessions()]
    return tuple((h.session, h.size, h.root) for h in heads)  # type: ignore[return-value]


def _append(target: str, text: str) -> Result:
    return CliRunner().invoke(main, ["append", "-s", target, "--session", "s"], input=text,
                              catch_exceptions=False)


TURN = '{"kind":"turn","role":"user","content":"hi"}'


# --- decoding: unknown fields and repeated keys ----------------------------------------------------


@pytest.mark.parametrize(("body", "field"), [
    (b'{"kind":"turn","role":"u","content":"x","colour":"red"}', "colour"),
    (b'{"kind":"binding","key":"k","value":1,"regenrable":true}', "regenrable"),
    (b'{"kind":"node","tier":1,"start":0,"stop":1,"span_root":"00","summary":"s",'
     b'"negative_facts":[{"pos":0,"status":"failed","why":"x"}]}', "negative_facts[0].why"),
    (b'{"kind":"turn","role":"u","role":"system","content":"x"}', "role"),
    (b'{"kind":"turn","kind":"turn","role":"u","content":"x"}', "kind"),
    (b'{"kind":"tool_call","call_id":"c","name":"n","args":{"a":1,"a":2}}', "a"),
    (b'{"kind":"turn","role":"u","content":"x","meta":{"k":[{"x":1,"\\u0078":2}]}}', "x"),
], ids=["unknown", "misspelt", "nested-unknown", "repeated", "repeated-kind", "repeated-in-args", "repeated-escaped"])
def test_decode_refuses_unknown_fields_and_repeated_keys(body: bytes, field: str) -> None:
    """A field the kind does not have, or a key given twice in one object, is refused by name, not dropped."""
    with pytest.raises(cs.InvalidEvent) as info:
        ev.decode(body)
    assert info.value.field == field


@pytest.mark.parametrize(("line", "message"), [
    ('{"kind":"turn","role":"user","content":"x","colour":"red"}', "line 2: turn event: colour:"),
    ('{"kind":"turn","role":"user","role":"system","content":"x"}', "line 2: turn event: role: given twice"),
    ('{"kind":"tool_call","call_id":"c","name":"n","args":{"a":1,"a":2}}', "line 2: tool_call event: a: given twice"),
], ids=["unknown", "repeated", "repeated-nested"])
def test_append_command_refuses_unknown_fields_and_repeated_keys(target: str, line: str, message: str) -> None:
    """`compactstore append` exits 2 on an unknown field or a repeated key, naming the line; the store is unchanged."""
    assert _append(target, TURN + "\n").exit_code == 0
    before = _state(target)
    result = _append(target, TURN + "\n" + line + "\n")
    assert result.exit_code == 2
    assert result.stderr.startswith(f"error: {message}"), result.stderr
    assert _state(target) == before


def test_a_refused_append_leaves_the_store_file_byte_identical(sqlite_target: str) -> None:
    """After a refused `compactstore append`, the SQLite file and its WAL are byte for byte as they were."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        s = st.session("s")
        migration(s)
        s.mark(s.compact(0, 8, on_risk="spill"))
    before = _state(sqlite_target)
    for bad in ('{"kind":"turn","role":"user","content":"x","extra":1}',
                '{"kind":"turn","role":"user","content":"x","content":"y"}',
                '{"kind":"obligation","name":"o","needs":"rollback"}'):
        result = _append(sqlite_target, TURN + "\n" + bad + "\n")
        assert result.exit_code == 2, result.output
        assert _state(sqlite_target) == before
    with cs.open(sqlite_target) as st:  # every stored body, raw or derived, still decodes strictly
        assert st.verify().ok


def test_proof_check_refuses_unknown_fields_and_repeated_keys(sqlite_target: str) -> None:
    """`compactstore proof check` of a proof with a field it does not have, or a key given twice: exit 2."""
    with cs.open(sqlite_target) as st:
        migration(st.session("s"))
    proof = CliRunner().invoke(main, ["proof", "inclusion", "2", "-s", sqlite_target]).stdout
    assert CliRunner().invoke(main, ["proof", "check"], input=proof).exit_code == 0
    doc = json.loads(proof)
    for text in (json.dumps({**doc, "trusted": True}), json.dumps(doc)[:-1] + ', "pos": 3}'):
        result = CliRunner().invoke(main, ["proof", "check"], input=text)
        assert result.exit_code == 2 and result.stderr.startswith("error: proof file:"), result.output


# --- wrong types, by kind of argument ----------------------------------------------------------------


def _lossless(s: cs.Session) -> cs.Artifact:
    return s.artifact(s.compact(0, 8, loss=cs.LossClass.LOSSLESS, keep=cs.AUTO))


#: (label, call, field the error must name): each a value of the wrong kind for its argument.
WRONG: list[tuple[str, Callable[[cs.Session, cs.Artifact], object], str]] = [
    ("tool_results str", lambda s, a: s.reconstruct(a, "plan", uses={"x": "a"}, tool_results="abc"), "tool_results"),
    ("tool_results str pure", lambda s, a: cs.reconstruct(a, "plan", s.lookup, uses={"x": "a"}, tool_results="abc"),
     "tool_results"),
    ("tool_results None", lambda s, a: s.reconstruct(a, "plan", tool_results=None), "tool_results"),
    ("tool_result not JSON", lambda s, a: s.reconstruct(a, "plan", uses={"x": 1}, tool_results=[object()]),
     "tool_results[0]"),
    ("artifact None", lambda s, a: s.reconstruct(None, "plan"), "artifact"),
    ("artifact dict", lambda s, a: cs.reconstruct({"loss": "LOSSLESS"}, "plan", s.lookup), "artifact"),
    ("payload not JSON", lambda s, a: cs.reconstruct(cs.Artifact("LOSSLESS", {"x": object()}, "d"), "authorize",
                                                     s.lookup), "artifact.payload.x"),
    ("operation None", lambda s, a: s.reconstruct(a, None), "operation"),
    ("uses list", lambda s, a: s.reconstruct(a, "plan", uses=[("x", 1)]), "uses"),
    ("uses int key", lambda s, a: s.reconstruct(a, "plan", uses={1: 1}), "uses"),
    ("uses NaN", lambda s, a: s.reconstruct(a, "plan", uses={"x": float("nan")}, tool_results=[float("nan")]),
     "uses.x"),
    ("prior list", lambda s, a: cs.reconstruct(a, "plan", s.lookup, prior=["x"]), "prior"),
    ("lookup None", lambda s, a: cs.reconstruct(a, "authorize", None), "lookup"),
    ("attempt int", lambda s, a: s.reconstruct(a, "plan", attempt=5), "attempt"),
    ("compact keep dict", lambda s, a: s.compact(9, 11, keep={"rollback": True}), "keep"),
    ("compact keep bool pos", lambda s, a: s.compact(9, 11, keep=[(True, "value")]), "keep"),
    ("compact start bool", lambda s, a: s.compact(True, 3), "start"),
    ("compact summarizer", lambda s, a: s.compact(9, 11, summarizer="extractive"), "summarizer"),
    ("assert keep unhashable", lambda s, a: s.assert_compaction_safe(0, 3, keep=[["rollback"]]), "keep[0]"),
    ("assert start bool", lambda s, a: s.assert_compaction_safe(False, 3), "start"),
    ("roll_up summarizer", lambda s, a: s.roll_up([11], summarizer=5), "summarizer"),
    ("redact None", lambda s, a: s.redact(None, "gdpr"), "positions"),
    ("redact mixed", lambda s, a: s.redact([1, "2"], "gdpr"), "positions[1]"),
    ("head bool", lambda s, a: s.head(True), "size"),
    ("facts bool", lambda s, a: s.view.facts(True), "size"),
    ("reader bool", lambda s, a: s.view.reader(True), "size"),
    ("span_root bool", lambda s, a: s.span_root(True, 3), "start"),
    ("inclusion bool", lambda s, a: s.inclusion_proof(True), "pos"),
    ("consistency bool", lambda s, a: s.consistency_proof(False, 3), "old_size"),
    ("read_span records", lambda s, a: s.view.read_span(0, 3, records="yes"), "records"),
    ("root_with None", lambda s, a: s.view.root_with(None, 3), "leaves"),
    ("root_with str leaf", lambda s, a: s.view.root_with({0: "x"}, 3), "leaves"),
    ("resume rehash", lambda s, a: s.resume(0, rehash=1), "rehash"),
    ("artifact bool", lambda s, a: s.artifact(True), "node"),
    ("oblige allow_unbound", lambda s, a: s.oblige("o", ["rollback"], allow_unbound=1), "allow_unbound"),
    ("oblige needs dict", lambda s, a: s.oblige("o", {"rollback": 1}), "needs"),
    ("verify workers", lambda s, a: s.store.verify(workers="2"), "workers"),
    ("verify progress", lambda s, a: s.store.verify(progress=5), "progress"),
    ("check_head None", lambda s, a: s.store.check_head(None), "head"),
    ("seal_head size str", lambda s, a: s.store.seal_head(s.name, "1", b"", 0, b""), "size"),
    ("seal_head seqs str", lambda s, a: s.store.seal_head(s.name, 1, b"", 0, "1"), "seqs"),
    ("Store clock", lambda s, a: cs.Store(s.store.backend, clock=5), "clock"),
    ("copy src None", lambda s, a: cs.copy(None, s.store), "src"),
    ("copy batch bool", lambda s, a: cs.copy(s.store, s.store, batch=True), "batch"),
    ("copy progress", lambda s, a: cs.copy(s.store, s.store, progress=5), "progress"),
]


@pytest.mark.parametrize(("label", "call", "field"), WRONG, ids=[w[0] for w in WRONG])
def test_a_wrong_type_gets_a_typed_error_naming_it(session: cs.Session, label: str,
                                                    call: Callable[[cs.Session, cs.Artifact], object],
                                                    field: str) -> None:
    """A value of the wrong kind gets InvalidArgument naming the argument, never a plain TypeError; nothing is written."""
    artifact = _lossless(session)
    size = session.size
    with pytest.raises(cs.InvalidArgument) as info:
        call(session, artifact)
    assert info.value.field == field, info.value
    assert session.size == size


@pytest.mark.parametrize("kwargs", [{"durable": "yes"}, {"clock": 5}], ids=["durable", "clock"])
def test_open_refuses_a_wrong_type_before_creating_anything(tmp_path: Path, kwargs: dict[str, Any]) -> None:
    """cs.open with a flag that is not a bool or a clock that is not callable: InvalidArgument, no file."""
    path = tmp_path / "new.db"
    with pytest.raises(cs.InvalidArgument) as info:
        cs.open(str(path), **kwargs)
    assert info.value.field == next(iter(kwargs))
    assert not path.exists()


# --- obligations on bindings that do not exist ---------------------------------------------------------


def test_an_obligation_on_an_unbound_need_is_refused_unless_allowed(session: cs.Session) -> None:
    """oblige(needs=["typo"]) names the missing binding and writes nothing; allow_unbound=True opens it anyway."""
    size = session.size
    with pytest.raises(cs.InvalidArgument) as info:
        session.oblige("ship", needs=["rollback", "rolback"])
    assert info.value.field == "needs" and "'rolback'" in str(info.value) and info.value.hint
    assert session.size == size
    session.oblige("ship", needs=["rollback"])
    session.oblige("later", needs=["release-tag"], allow_unbound=True)
    session.bind("release-tag", "v1.2.0")
    session.oblige("tag", needs=["release-tag"])
    assert session.size == size + 4


# --- malformed JSON, at random ---------------------------------------------------------------------------

KINDS: dict[str, type[cs.Event]] = {str(t.__struct_config__.tag): t for t in ev.EVENT_TYPES}
#: A valid object of each raw kind, to be broken.
VALID: dict[str, dict[str, Any]] = {
    "turn": {"role": "user", "content": "hi", "name": "ann"},
    "tool_call": {"call_id": "c1", "name": "run", "args": {"sql": "SELECT 1"}},
    "tool_result": {"call_id": "c1", "output": "ok", "ok": True},
    "binding": {"key": "k", "value": [1, 2], "regenerable": False, "how": "ls"},
    "obligation": {"name": "o", "needs": ["k"]},
    "fulfilment": {"name": "o"},
    "handle_opened": {"handle": "h", "resource": "file", "detail": "d"},
    "handle_closed": {"handle": "h"},
}
#: Values of each JSON type; a field is given one its type does not accept.
SAMPLES: dict[str, list[Any]] = {
    "str": ["x", ""], "int": [3, -1], "float": [1.5], "bool": [True, False], "null": [None],
    "list": [["x"], [1]], "object": [{"a": 1}],
}


def _wrong_values(cls: type[cs.Event], name: str) -> list[Any]:
    """Return JSON values that field ``name`` of ``cls`` refuses by type (empty for a free-form JSON field)."""
    info = msgspec.inspect.type_info(cls)
    assert isinstance(info, msgspec.inspect.StructType)
    t = next(f.type for f in info.fields if f.name == name)
    members = list(t.types) if isinstance(t, msgspec.inspect.UnionType) else [t]
    accepts = set()
    for m in members:
        if isinstance(m, msgspec.inspect.AnyType):
            return []
        accepts |= {
            msgspec.inspect.StrType: {"str"}, msgspec.inspect.IntType: {"int"}, msgspec.inspect.BoolType: {"bool"},
            msgspec.inspect.NoneType: {"null"}, msgspec.inspect.ListType: {"list"},
            msgspec.inspect.DictType: {"object"}, msgspec.inspect.LiteralType: {"literal"},
        }[type(m)]
    if "literal" in accepts:
        return [1, "not-one-of-them"] + ([] if "null" in accepts else [None])
    wrong = [v for k, vs in SAMPLES.items() if k not in accepts for v in vs]
    return wrong + ([[1]] if "list" in accepts else [])  # every list field here holds str


@st.composite
def malformed_lines(draw: st.DrawFn) -> tuple[str, str]:
    """Return ``(what, JSON line)``: a valid raw event broken one way (unknown field, repeated key, wrong type)."""
    kind = draw(st.sampled_from(sorted(VALID)))
    cls = KINDS[kind]
    pairs: list[tuple[str, Any]] = [("kind", kind), *VALID[kind].items()]
    how = draw(st.sampled_from(["unknown", "repeated", "wrong-type"]))
    if how == "unknown":
        name = draw(st.text(st.characters(min_codepoint=32, max_codepoint=0x2FF), min_size=1, max_size=12)
                    .filter(lambda n: n not in cls.__struct_fields__ and n != "kind"))
        value = draw(st.one_of(st.none(), st.booleans(), st.integers(), st.text(max_size=5), st.just({"a": [1]})))
        pairs.insert(draw(st.integers(0, len(pairs))), (name, value))
    elif how == "repeated":
        name, value = draw(st.sampled_from(pairs))
        again = draw(st.one_of(st.just(value), st.text(max_size=5), st.integers()))
        pairs.insert(draw(st.integers(0, len(pairs))), (name, again))
    else:
        fields = [n for n in cls.__struct_fields__ if _wrong_values(cls, n)]
        name = draw(st.sampled_from(fields))
        value = draw(st.sampled_from(_wrong_values(cls, name)))
        pairs = [(k, v) for k, v in pairs if k != name] + [(name, value)]
    line = "{" + ",".join(f"{json.dumps(k)}:{json.dumps(v)}" for k, v in pairs) + "}"
    return how, line


def _settings(examples: int) -> Callable[[Any], Any]:
    return settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))


def test_random_malformed_lines_are_refused_by_the_append_command(sqlite_target: str) -> None:
    """Any raw event line with an unknown field, a repeated key or a wrongly typed field: exit 2, file unchanged."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st0:
        migration(st0.session("s"))
    before = _state(sqlite_target)

    @_settings(40)
    @given(malformed_lines())
    def run(case: tuple[str, str]) -> None:
        how, line = case
        result = _append(sqlite_target, TURN + "\n" + line + "\n")
        assert result.exit_code == 2, (how, line, result.output)
        assert result.stderr.startswith("error: line 2: "), (how, line, result.stderr)
        assert _state(sqlite_target) == before

    run()


def test_random_malformed_events_are_refused_by_session_append(store: cs.Store) -> None:
    """The same lines through the library (decode, then append; or a struct built with the wrong type): InvalidEvent, nothing written."""
    s = store.session("s")
    migration(s)
    head = s.head()

    @_settings(60)
    @given(malformed_lines())
    def run(case: tuple[str, str]) -> None:
        how, line = case
        with pytest.raises(cs.InvalidEvent):
            s.append(ev.decode(line.encode()))
        if how == "wrong-type":
            # Struct constructors do not check types: the store must.
            raw = json.loads(line)
            cls = KINDS[raw.pop("kind")]
            with pytest.raises(cs.InvalidEvent):
                s.append(cls(**raw))
            with pytest.raises(cs.InvalidEvent):
                s.extend([cs.Turn("user", "fine"), cls(**raw)])
        assert s.head() == head

    run()
