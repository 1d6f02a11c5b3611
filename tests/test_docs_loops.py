"""The memory loops of the README and docs/frameworks.md, on their defaults, for 1,000 turns on each backend.

Each block runs as written but for its turn count (``range(100)`` becomes
``range(1000)``) and its store (``"agent.db"`` becomes the test's target). What the model
is fed is watched where it is made: every context a session resolves, every rendering of
one as model input, every maintenance. The promise the documents make is held: once the
first marker certifies, every context is certified; no rendering is longer than
:data:`FED_BOUND` characters; no maintenance refused a step; the store verifies.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

import compactstore as cs
from compactstore.resolver import RawItem

ROOT = Path(__file__).resolve().parent.parent
#: The turns each loop runs here; the documents show 100.
TURNS = 1000
#: The most characters of model input a context may give, as JSON (what the documents state).
FED_BOUND = 16_000


def block(document: str, heading: str) -> str:
    """Return the first Python block of ``document`` after the line ``heading``."""
    text = (ROOT / document).read_text(encoding="utf-8")
    after = text.split(f"\n{heading}\n", 1)[1]
    found = re.search(r"```python\n(.*?)```", after, re.S)
    assert found is not None, f"no Python block after {heading!r} in {document}"
    return found.group(1)


def at_scale(code: str, target: str) -> str:
    """Return ``code`` with its loop run for :data:`TURNS` turns on ``target``."""
    assert "range(100)" in code and code.count('"agent.db"') == 1
    return code.replace("range(100)", f"range({TURNS})").replace('"agent.db"', repr(target))


@dataclass
class Watch:
    """What the sessions of one run resolved, rendered and maintained, in order."""

    modes: list[str] = field(default_factory=list)
    fed: list[int] = field(default_factory=list)
    refused: list[str] = field(default_factory=list)

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        """Wrap Session.context, Session.maintain and amaintain, and render.messages, to record what they give."""
        context, maintain, amaintain, messages = (
            cs.Session.context, cs.Session.maintain, cs.Session.amaintain, cs.render.messages)

        def watched_context(session: cs.Session) -> cs.Resolution:
            got = context(session)
            self.modes.append(got.mode)
            return got

        def watched_maintain(session: cs.Session, *args: Any, **kwargs: Any) -> cs.policy.Maintenance:
            done = maintain(session, *args, **kwargs)
            self.refused += done.refused
            return done

        async def watched_amaintain(session: cs.Session, *args: Any, **kwargs: Any) -> cs.policy.Maintenance:
            done = await amaintain(session, *args, **kwargs)
            self.refused += done.refused
            return done

        def watched_messages(*args: Any, **kwargs: Any) -> Any:
            out = messages(*args, **kwargs)
            self.fed.append(len(json.dumps(out, ensure_ascii=False)))
            return out

        monkeypatch.setattr(cs.Session, "context", watched_context)
        monkeypatch.setattr(cs.Session, "maintain", watched_maintain)
        monkeypatch.setattr(cs.Session, "amaintain", watched_amaintain)
        monkeypatch.setattr(cs.render, "messages", watched_messages)

    def check(self) -> None:
        """Hold the run to the documents' promise: certified from the first marker on, bounded, nothing refused."""
        assert "certified" in self.modes, self.modes[-5:]
        since = self.modes[self.modes.index("certified"):]
        assert since.count("certified") == len(since), f"{len(since) - since.count('certified')} fallbacks"
        assert min(len(since), len(self.fed)) >= TURNS * 9 // 10  # resolved and fed every turn once marked
        assert max(self.fed) <= FED_BOUND, max(self.fed)
        assert self.refused == []


def run(code: str, target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        check: Callable[[cs.Store], None]) -> None:
    """Run ``code`` at scale on ``target`` under a :class:`Watch`, check the watch, then the store with ``check``."""
    watch = Watch()
    watch.install(monkeypatch)
    monkeypatch.chdir(tmp_path)
    exec(compile(at_scale(code, target), "docs loop", "exec"), {"__name__": "__main__"})
    watch.check()
    monkeypatch.undo()
    with cs.open(target, create=False) as store:
        check(store)
        assert store.verify().ok


def test_the_readme_loop_stays_certified_and_bounded_for_1000_turns(
        target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's loop on CompactionPolicy(): certified once marked, under the bound, every failure retained."""

    def retained(s: cs.Session, node: cs.Node) -> set[int]:
        """Return the positions of the negative facts ``node`` retains, by reference to its children included."""
        return {f.pos for f in node.negative_facts}.union(*(retained(s, s.node(p)) for p in node.children))

    def check(store: cs.Store) -> None:
        s = store.session("run-7")
        got = s.context()
        kept = set().union(*(retained(s, n) for n in s.cover()))
        raw = {i.pos for i in got.context if isinstance(i, RawItem)}
        failed = {r.pos for r in s.scan() if isinstance(r.event, cs.ToolResult) and not r.event.ok}
        assert s.size > 3 * TURNS and got.mode == "certified"
        assert len(failed) > TURNS // 10 and failed <= kept | raw

    run(block("README.md", "## The memory loop"), target, tmp_path, monkeypatch, check)


def test_the_langgraph_loop_stays_certified_and_bounded_for_1000_turns(
        target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/frameworks.md's create_agent loop with the saver's middleware on CompactionPolicy(), for 1,000 turns."""
    pytest.importorskip("langchain.agents", reason="the test extra (langchain) is not installed")

    def check(store: cs.Store) -> None:
        assert store.session("langgraph:run-42").context().mode == "certified"

    run(block("docs/frameworks.md", "## LangGraph"), target, tmp_path, monkeypatch, check)


def test_the_agents_runner_loop_stays_certified_and_bounded_for_1000_turns(
        target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/frameworks.md's Runner loop with CompactStoreSession on CompactionPolicy(), for 1,000 turns."""
    pytest.importorskip("agents", reason="the test extra (openai-agents) is not installed")

    def check(store: cs.Store) -> None:
        assert store.session("openai-agents:run-42").context().mode == "certified"

    run(block("docs/frameworks.md", "## OpenAI Agents SDK"), target, tmp_path, monkeypatch, check)
