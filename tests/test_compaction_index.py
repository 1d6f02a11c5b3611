"""Compaction from the structural index: the same facts, nodes and refusals as the full pass."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_compaction import migration
from test_structure_index import IDS, KEYS, _raw_event, append_raw

import compactstore as cs
from sqlite_edit import tamper
from compactstore import compaction, content
from compactstore import events as ev
from compactstore import rules
from compactstore.compaction import AUTO
from compactstore.facts import Facts, FullFacts, IndexedFacts
from compactstore.log.reader import Reader

_names = itertools.count()


def _full(session: cs.Session, size: int) -> Facts:
    return FullFacts([r.event for r in session.scan(0, size)], session.span_root)


@contextmanager
def _full_path() -> Iterator[None]:
    """Make compaction take the full pass over the events, as a session with redactions does."""
    indexed = Reader.facts

    def full(self: Reader, size: int | None = None, *, reader: object = None) -> Facts:
        return FullFacts([r.event for r in self.scan(0, self.size if size is None else size)], self.span_root)

    Reader.facts = full  # type: ignore[method-assign, assignment]
    try:
        yield
    finally:
        Reader.facts = indexed  # type: ignore[method-assign]


# --- random sessions, compactions with every kind of argument ---------------------------------


_SPAN = st.tuples(st.integers(0, 999), st.integers(0, 999))
"""Where a span starts and ends, as fractions of the session's size when the step runs."""


def _span(at: tuple[int, int], size: int) -> tuple[int, int]:
    a = at[0] * size // 1000
    return a, a + 1 + at[1] * (size - a) // 1000 if a < size else a + 1


@st.composite
def _compaction(draw: st.DrawFn, size: int) -> dict[str, object]:
    args: dict[str, object] = {
        "span": draw(_SPAN), "summary": draw(st.sampled_from(["gist", None])),
        "loss": draw(st.sampled_from([cs.LossClass.LOSSY_GIST, cs.LossClass.LOSSY_GIST, *cs.LossClass])),
        "on_risk": draw(st.sampled_from(["refuse", "preserve", "spill", "spill"])),
    }
    sometimes = st.integers(0, 3).map(lambda n: n == 0)
    positions = st.integers(-1, size + 2) | st.sampled_from([True, 2**70])
    if draw(sometimes):
        args["negative_facts"] = draw(st.lists(positions, max_size=3))
    if draw(sometimes):
        args["unresolved"] = draw(st.lists(st.sampled_from([f"{p}{i}" for p in "cho" for i in IDS]), max_size=2))
    if draw(sometimes):
        args["resolved"] = draw(st.sampled_from([[], [], ["ca"], ["ha", "oa"]]))
    if draw(st.integers(0, 2)) == 0:
        excerpt = st.tuples(st.integers(0, size - 1), st.sampled_from(["value", "key"]))
        args["keep"] = draw(st.lists(st.sampled_from(KEYS) | excerpt, max_size=2))
    return args


@st.composite
def scripts(draw: st.DrawFn) -> list[tuple[str, object]]:
    """Steps: raw events, compactions, digests, forged nodes and gate checks."""
    steps: list[tuple[str, object]] = []
    size = 0
    for _ in range(draw(st.integers(4, 40))):
        what = draw(st.sampled_from(["raw"] * 6 + ["bind", "rebind", "oblige", "compact", "compact", "digest",
                                                    "forge", "safe"]))
        if what == "raw" or size < 2:
            steps.append(("raw", _raw_event(draw, size)))
            size += 1
        elif what == "bind":  # more bindings and obligations than among raw events: more risks for the gate
            steps.append(("raw", ev.Binding(key=draw(st.sampled_from(KEYS)), value=size,
                                            regenerable=draw(st.integers(0, 3)) == 0)))
            size += 1
        elif what == "rebind":  # a key bound again, and soon needed: its live value moves on
            key = draw(st.sampled_from(KEYS[:1]))
            steps.append(("raw", ev.Binding(key=key, value=f"v{size}")))
            steps.append(("raw", ev.Obligation(name=f"o{draw(st.sampled_from(IDS))}", needs=[key])))
            size += 2
        elif what == "oblige":
            steps.append(("raw", ev.Obligation(name=f"o{draw(st.sampled_from(IDS))}",
                                               needs=draw(st.lists(st.sampled_from(KEYS), min_size=1, unique=True)))))
            size += 1
        elif what == "compact":
            steps.append(("compact", draw(_compaction(size))))
            size += 3
        elif what == "digest":
            facts = draw(st.none() | st.lists(st.integers(-1, size + 2), max_size=3))
            steps.append(("digest", (draw(st.integers(1, 3)), facts, draw(st.sampled_from([None, *cs.LossClass])))))
            size += 1
        elif what == "forge":
            # Some claim a span past their own position, or tier 2.
            steps.append(("forge", (draw(_SPAN), draw(st.integers(0, 3)), draw(st.sampled_from([1, 1, 2])))))
            size += 1
        else:
            steps.append(("safe", (draw(_SPAN), draw(st.lists(st.sampled_from(KEYS), max_size=2)))))
    return steps


def _outcome(call: Callable[[], object], session: str) -> object:
    try:
        got = call()
    except (cs.InvalidArgument, cs.CompactionInvariantError) as exc:
        # The two sessions compared have different names; a message may name its session.
        return (type(exc).__name__, str(exc).replace(repr(session), "'<session>'"), getattr(exc, "risks", None))
    return None if got is None else msgspec.structs.replace(got, session="", leaf=b"")  # type: ignore[type-var]


def _run(s: cs.Session, steps: list[tuple[str, object]]) -> list[object]:
    """Play ``steps`` and return what each compaction, digest and gate check gave (a node or a refusal)."""
    out: list[object] = []
    for what, arg in steps:
        if what == "raw":
            append_raw(s, arg)
        elif what == "compact":
            kwargs = dict(arg)  # type: ignore[call-overload]
            start, stop = _span(kwargs.pop("span"), s.size)
            out.append(_outcome(lambda: s.compact(start, stop, **kwargs), s.name))
        elif what == "digest":
            n, facts, loss = arg  # type: ignore[misc]
            l1 = sorted((x for x in s.nodes() if x.tier == 1), key=lambda x: x.start)
            for run in (l1[i : i + n] for i in range(len(l1))):
                if len(run) == n and all(x.stop == y.start for x, y in zip(run, run[1:])):
                    kwargs = {} if facts is None else {"negative_facts": facts}
                    out.append(_outcome(lambda: s.roll_up(run, summary=None, loss=loss, **kwargs), s.name))  # noqa: B023
                    break
        elif what == "forge":
            at, past, tier = arg  # type: ignore[misc]
            a, b = _span(at, s.size)
            forged = ev.Summary(tier=tier, start=a, stop=b + past, span_root=s.span_root(a, b).hex(), summary="forged")
            out.append(_outcome(lambda: s.append(forged), s.name))  # noqa: B023  # the write path refuses it
        else:
            at, keep = arg  # type: ignore[misc]
            a, b = _span(at, s.size)
            out.append(_outcome(lambda: s.assert_compaction_safe(a, b, keep), s.name))  # noqa: B023
    return out


def _log(s: cs.Session) -> list[ev.Event]:
    return [msgspec.structs.replace(r.event, ts=None) for r in s.scan()]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=scripts())
def test_compaction_from_the_index_writes_what_the_full_pass_writes(
    target: str, small_snapshots: None, steps: list[tuple[str, object]]
) -> None:
    """The same script, once from the index and once by full passes: the same nodes, spills and refusals."""
    # Two stores on one target, each with its own clock: the two sessions get the same
    # stamps. Closed with each example: a PostgreSQL store holds a pool of connections.
    n = next(_names)
    with cs.open(target, clock=cs.events.tick_clock()) as one, cs.open(target, clock=cs.events.tick_clock()) as other:
        indexed, full = one.session(f"i{n}"), other.session(f"f{n}")
        got = _run(indexed, steps)
        with _full_path():
            want = _run(full, steps)
        assert got == want
        assert _log(indexed) == _log(full)
        assert isinstance(indexed.view.facts(indexed.size), IndexedFacts)


def _answers(f: Facts, start: int, stop: int, probe: list[object]) -> dict[str, object]:
    size = f.size
    items = [*f.unresolved_at(start, stop), *f.resolved_in(start, stop),
             *(ev.Item(p, k, i) for p in (start - 1, start, stop - 2) for k, i in  # type: ignore[arg-type]
               [("tool_call", "ca"), ("handle", "hb"), ("obligation", "oc")])]
    bound = [f.latest_binding(k, b) for k in KEYS for b in (start, stop, size)]
    negative = f.negatives_at(probe)
    return {
        "overlap": [str(rules.overlap(f, t, start, stop, size)) for t in (1, 2)],
        "nodes": f.nodes(),
        "negatives_in": f.negatives_in(start, stop),
        "negatives_at": [negative(p) for p in probe],
        "unresolved_at": f.unresolved_at(start, stop),
        "resolved_in": f.resolved_in(start, stop),
        "resolved_before": sorted(f.resolved_before(items, stop), key=lambda i: (i.pos, i.kind, i.id)),
        "latest_binding": bound,
        "bindings": [f.binding(b[0]) for b in bound if b is not None],
        "keys_at": f.keys_at(probe),
        "keys_in": f.keys_in(start, stop),
        "open_obligations": f.open_obligations(),
        # The rules over these facts: the gate by live value, the literals, what nodes claim.
        "risks": rules.risks(f, start, stop, probe),  # type: ignore[arg-type]
        "literals": rules.span_literals(f, start, stop),
        "claims": [rules.false_claims(f, n) for _, n in f.nodes()],
        "lossless": [rules.lossless_problems(f, n) for _, n in f.nodes()],
        "markers": [rules.check_marker(f, p) for p, _ in f.nodes()],
    }


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=scripts(), data=st.data())
def test_the_indexed_facts_equal_the_full_pass(
    store: cs.Store, small_snapshots: None, steps: list[tuple[str, object]], data: st.DataObject
) -> None:
    """For random sessions, checkpoints and spans, every answer of the index equals the full pass's."""
    s = store.session(f"s{next(_names)}")
    _run(s, steps)
    for _ in range(4):
        if s.size < 1:
            break
        size = data.draw(st.integers(1, s.size))
        start = data.draw(st.integers(0, size - 1))
        stop = data.draw(st.integers(start + 1, size))
        probe = data.draw(st.lists(st.integers(-1, size + 1) | st.sampled_from([True, 2**70]), max_size=6))
        index = s.view.facts(size)
        assert isinstance(index, IndexedFacts)
        assert _answers(index, start, stop, probe) == _answers(_full(s, size), start, stop, probe)


def test_a_session_with_redactions_compacts_by_the_full_pass(store: cs.Store) -> None:
    """A redacted body no longer gives its facts: compaction then reads the events, and refuses as before."""
    s = store.session("m")
    migration(s)
    s.redact([3], "personal data")
    assert isinstance(s.view.facts(s.size), FullFacts)
    with pytest.raises(cs.CompactionInvariantError, match="finish-migration"):
        s.compact(0, 8)
    node = s.compact(0, 8, on_risk="spill")
    assert [r.key for r in node.spills] == ["rollback"] and node.content_digest is None


def test_the_migration_story_compacts_alike_both_ways(open_store: Callable[..., cs.Store]) -> None:
    """The README's story: the same refusal, the same spilled node, the same L2, from the index or not."""
    got = []
    for name, path in (("indexed", None), ("full", _full_path)):
        s = open_store().session(name)
        migration(s)
        with path() if path else nullcontext():
            with pytest.raises(cs.CompactionInvariantError) as info:
                s.compact(0, 8)
            a = s.compact(0, 8, on_risk="spill", negative_facts=AUTO)
            b = s.compact(8, 11, loss=cs.LossClass.LOSSY_LITERAL)
            l2 = s.roll_up([a, b])
        got.append((str(info.value), _log(s), l2.resolved, l2.unresolved))
    assert got[0] == got[1]


# --- one read of the span ----------------------------------------------------------------------


def test_a_compaction_reads_its_span_once(store: cs.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """compact digests the span as it reads it, the commit's check takes that read, and a lossy roll-up reads no span."""
    s = store.session("m")
    migration(s)
    spans: list[tuple[int, int]] = []  # every read of stored rows, by span
    rows = store.backend.rows

    def counted(sid: int, start: int, stop: int, *args: object) -> object:
        spans.append((start, stop))
        return rows(sid, start, stop, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(store.backend, "rows", counted)
    a = s.compact(0, 8, on_risk="spill")  # the summarizer's records come from the same read
    b = s.compact(8, 11)
    l2 = s.roll_up([a, b])
    assert spans == [(0, 8), (8, 11)]
    assert [s.restore_span(n.pos).certified_by for n in (a, b, l2)] == ["content_digest", "content_digest", "span_root"]


def test_a_node_appended_by_hand_is_held_to_its_span(store: cs.Store) -> None:
    """A node whose digest, root or span is not its span's is refused at append, and nothing is written."""
    s = store.session("m")
    migration(s)
    size = s.size
    node = compaction.compaction(s.view, size, 8, 11, summary="s")[-1]  # built, not appended
    false = content.content_digest([b"x"]).hex()
    # Moved to [9, 11), the node also lists an item opened at 8, outside its span.
    for changed in ({"content_digest": false}, {"span_root": s.span_root(8, 10).hex()}, {"start": 9}):
        with pytest.raises(cs.InvalidEvent, match="content_digest|span_root|outside the span"):
            s.append(msgspec.structs.replace(node, **changed))
        assert s.size == size
    assert s.append(node).pos == size  # the node as built keeps the rules


def test_a_body_that_does_not_match_its_leaf_is_refused_as_before(sqlite_target: str) -> None:
    """The read that digests the span checks each body against its leaf; a changed body is refused at commit."""
    with cs.open(sqlite_target, clock=cs.events.tick_clock()) as st:
        migration(st.session("m"))
    tamper(sqlite_target, "UPDATE events SET body = CAST(replace(CAST(body AS TEXT), 'No.', 'OK.') AS BLOB) WHERE pos = 4")
    with cs.open(sqlite_target) as st:
        s = st.session("m")
        with pytest.raises(cs.IntegrityError, match="at pos 4 does not match its leaf"):
            s.compact(0, 5)
        assert s.size == 11
