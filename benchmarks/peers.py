#!/usr/bin/env python3
"""Peers: the same 1 KiB turns appended through agent-memory stores that run on SQLite.

    python benchmarks/peers.py [--repeat N] [--quick] [--turns N] [--state-turns N]

The peers are optional (``pip install -e '.[bench]'``); a peer that is not installed is
skipped with a line saying so. Every store writes to its own fresh SQLite file in WAL
mode at ``synchronous=FULL`` (set on langgraph's and the Agents SDK's connections;
eventsourcing keeps SQLite's default; compactstore with ``durable=True``), so every
acknowledged turn survives power loss on every side: each round reads the setting back
from the connection that wrote, and a store at another one fails the run. Every call is
one transaction (one fsync) on every side:

* compactstore: ``Session.append`` (one turn per call) and ``Session.extend`` (100);
* langgraph ``SqliteSaver.put_writes``: one pending write per turn (one per call, and
  100 writes per call), against a checkpoint;
* langgraph ``SqliteSaver.put`` with the whole message state per turn, as a graph does
  after every step: quadratic, so on ``--state-turns`` turns only, against compactstore
  appending the same number of turns;
* OpenAI Agents ``SQLiteSession.add_items`` with 1 and 100 items per call;
* eventsourcing on SQLite: an aggregate with one event per turn, saved after every turn
  (and after every 100);
* compactstore through its own adapters, when the package has them
  (``compactstore.adapters.langgraph.CompactStoreSaver`` and
  ``compactstore.adapters.openai_agents.CompactStoreSession``), in the same modes.

For each it reports turns/s (median of the rounds) as a ratio against compactstore in
the same mode, the time to read every turn back (``Session.scan``, ``get_tuple`` with
its pending writes, ``get_items``, ``repository.get``), and bytes on disk per turn (the
file with its -wal after the store is closed). One commit per turn costs an fsync, so
``--quick`` (what ``make bench`` runs) appends 500 turns per round in the
one-per-call modes instead of 10,000 (and 200 instead of 1,000 with full-state
checkpoints); the batched modes always append 10,000.

Writes benchmarks/results/peers.json.
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import harness  # noqa: E402
from harness import Goal, Section, Stat, interleaved, rate, ratio, seconds  # noqa: E402
from plain import (  # noqa: E402
    AdapterLangGraphWrites,
    AdapterOpenAI,
    LangGraphWrites,
    OpenAISession,
    Run,
    Store,
    sqlite_saver,
)
from plain import messages as workload  # noqa: E402

import compactstore as cs  # noqa: E402

Turn = dict[str, str]


class Compactstore(Store):
    """compactstore, durable=True."""

    name = "compactstore"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.store = cs.open(path, durable=True)
        self.session = self.store.session("chat")

    def append(self, turns: list[Turn]) -> None:
        if len(turns) == 1:
            self.session.append(cs.Turn(turns[0]["role"], turns[0]["content"]))
        else:
            self.session.extend([cs.Turn(t["role"], t["content"]) for t in turns])

    def read_back(self) -> int:
        return sum(1 for _ in self.session.scan())

    def close(self) -> None:
        self.store.close()


class LangGraphState(Store):
    """langgraph SqliteSaver.put: a checkpoint of the whole message list after every turn."""

    name = "langgraph put, full state"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.conn, self.saver = sqlite_saver(path)
        self.config: dict[str, Any] = {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}}
        self.messages: list[Turn] = []

    def append(self, turns: list[Turn]) -> None:
        from langgraph.checkpoint.base import empty_checkpoint

        self.messages.extend(turns)
        cp = empty_checkpoint()
        n = len(self.messages)
        cp["channel_values"] = {"messages": list(self.messages)}
        cp["channel_versions"] = {"messages": n}
        self.config = self.saver.put(self.config, cp, {"source": "loop", "step": n, "parents": {}}, {"messages": n})

    def read_back(self) -> int:
        got = self.saver.get_tuple({"configurable": {"thread_id": "chat", "checkpoint_ns": ""}})
        return len(got.checkpoint["channel_values"]["messages"]) if got else 0

    def close(self) -> None:
        self.conn.close()


class EventSourcing(Store):
    """eventsourcing on SQLite: a Conversation aggregate, one TurnAdded event per turn."""

    name = "eventsourcing (SQLite)"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        from eventsourcing.application import Application

        conversation = _conversation_class()

        class Chat(Application):  # type: ignore[type-arg]
            pass

        self.app = Chat(env={"PERSISTENCE_MODULE": "eventsourcing.sqlite", "SQLITE_DBNAME": path})
        self.conv = conversation()
        self.app.save(self.conv)

    def append(self, turns: list[Turn]) -> None:
        for t in turns:
            self.conv.add_turn(t["role"], t["content"])
        self.app.save(self.conv)

    def read_back(self) -> int:
        return len(self.app.repository.get(self.conv.id).turns)

    def close(self) -> None:
        self.app.close()


class AdapterLangGraphState(LangGraphState):
    """compactstore through its LangGraph adapter: CompactStoreSaver.put with the whole state, durable=True."""

    name = "compactstore via langgraph adapter, full state"

    def __init__(self, path: str) -> None:
        Store.__init__(self, path)
        from compactstore.adapters.langgraph import CompactStoreSaver

        self.store = cs.open(path, durable=True)
        self.saver = CompactStoreSaver(self.store)
        self.config = {"configurable": {"thread_id": "chat", "checkpoint_ns": ""}}
        self.messages = []

    def close(self) -> None:
        self.store.close()


_CONVERSATION: Any = None


def _conversation_class() -> Any:
    global _CONVERSATION
    if _CONVERSATION is None:
        from eventsourcing.domain import Aggregate, event

        class Conversation(Aggregate):
            @event("Started")
            def __init__(self) -> None:
                self.turns: list[tuple[str, str]] = []

            @event("TurnAdded")
            def add_turn(self, role: str, content: str) -> None:
                self.turns.append((role, content))

        _CONVERSATION = Conversation
    return _CONVERSATION


#: (store class, the distribution that provides it, the modules it needs)
PEERS: list[tuple[type[Store], str, tuple[str, ...]]] = [
    (LangGraphWrites, "langgraph-checkpoint-sqlite", ("langgraph.checkpoint.sqlite",)),
    (OpenAISession, "openai-agents", ("agents",)),
    (EventSourcing, "eventsourcing", ("eventsourcing",)),
]
#: compactstore through its framework adapters, when the package has them
ADAPTERS: list[tuple[type[Store], str, tuple[str, ...]]] = [
    (AdapterLangGraphWrites, "compactstore[langgraph]", ("langgraph.checkpoint.base", "compactstore.adapters.langgraph")),
    (AdapterOpenAI, "compactstore[openai]", ("agents", "compactstore.adapters.openai_agents")),
]


def _installed(modules: tuple[str, ...]) -> bool:
    for module in modules:
        try:
            if importlib.util.find_spec(module) is None:
                return False
        except ModuleNotFoundError:
            return False
    return True


def _works(cls: type[Store], tmp: str) -> str | None:
    """Return None when ``cls`` appends and reads back a few turns, else why not."""
    try:
        Run(cls, workload(3), 1, tmp)()
    except Exception as exc:  # noqa: BLE001 - an optional peer that fails is skipped, not fatal
        return f"{type(exc).__name__}: {exc}"
    return None


def peer_rows(repeat: int, one_turns: int, batch_turns: int, state_turns: int) -> Section:
    """Measure every installed peer against compactstore, mode by mode, interleaved."""
    section = Section(
        "Peers on SQLite, synchronous=FULL: the same 1 KiB turns",
        ("mode", "store", "turns", "min", "median", "max", "turns/s", "vs compactstore", "read back",
         "bytes/turn"),
    )
    tmp = tempfile.mkdtemp(prefix="cs-bench-peers-")
    present: list[type[Store]] = []
    for cls, dist, modules in [*ADAPTERS, *PEERS]:
        why = None if _installed(modules) else f"{dist} is not installed (pip install -e '.[bench]')"
        why = why or _works(cls, tmp)
        if why:
            section.notes.append(f"{cls.name}: skipped, {why}")
        else:
            present.append(cls)
    modes: list[tuple[str, int, int, list[type[Store]]]] = [
        ("one turn per call", one_turns, 1, [Compactstore, *present]),
        ("100 turns per call", batch_turns, 100, [Compactstore, *present]),
    ]
    if LangGraphWrites in present:
        state = [Compactstore, LangGraphState]
        if AdapterLangGraphWrites in present and _works(AdapterLangGraphState, tmp) is None:
            state.insert(1, AdapterLangGraphState)
        modes.append(("full state per turn", state_turns, 1, state))
    try:
        warm = workload(50)
        for cls in {c for _, _, _, classes in modes for c in classes}:
            Run(cls, warm, 1, tmp)()  # imports, schema code paths, caches: not timed
        for mode, count, per_call, classes in modes:
            turns = workload(count)
            runs = {cls.name: Run(cls, turns, per_call, tmp) for cls in classes}
            got = interleaved([(name, run) for name, run in runs.items()], repeat, warmup=0)
            ours = Stat.of(got[Compactstore.name]).median
            twins = {AdapterLangGraphWrites.name: LangGraphWrites.name, AdapterOpenAI.name: OpenAISession.name,
                     AdapterLangGraphState.name: LangGraphState.name}
            for name, run in runs.items():
                st = Stat.of(got[name])
                read = Stat.of(run.read).median
                per_turn = sorted(run.bytes)[len(run.bytes) // 2] / count
                shown = name if mode != "full state per turn" or name != Compactstore.name else f"{name} (append)"
                section.rows.append((mode, shown, f"{count:,}", seconds(st.min), seconds(st.median), seconds(st.max),
                                     rate(count / st.median), ratio(ours / st.median), seconds(read),
                                     f"{per_turn:,.0f}"))
                section.data.append({"mode": mode, "store": name, "turns": count, "per_call": per_call,
                                     **st.as_dict(), "turns_per_s": count / st.median,
                                     "vs_compactstore": ours / st.median, "read_back_s": read,
                                     "bytes_per_turn": per_turn})
                if not name.startswith("compactstore"):
                    section.goals.append(Goal(f"{mode}: compactstore / {name}", st.median / ours, 1.0))
                elif name in twins and twins[name] in got:
                    twin = Stat.of(got[twins[name]]).median
                    section.goals.append(Goal(f"{mode}: {name} / {twins[name]}", twin / st.median, 1.0))
            print(f"  measured {mode}", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    section.notes.append("vs compactstore: the peer's turns/s over compactstore's in the same mode (above 1: faster "
                         "than compactstore); every store ran in WAL at synchronous=FULL, as read back from the "
                         "connection that wrote (compactstore with durable=True)")
    return section


def main(argv: list[str] | None = None) -> int:
    """Run every mode, print the table and write benchmarks/results/peers.json."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=5, help="timed rounds per row (default 5)")
    parser.add_argument("--quick", action="store_true", help="500 turns in the one-per-call modes, not 10,000")
    parser.add_argument("--turns", type=int, help="turns in the one-per-call modes (default 10,000; --quick 500)")
    parser.add_argument("--batch-turns", type=int, default=10_000, help="turns in the batched mode (default 10,000)")
    parser.add_argument("--state-turns", type=int, help="turns with full-state checkpoints (default 1,000; --quick 200)")
    args = parser.parse_args(argv)
    one = args.turns or (500 if args.quick else 10_000)
    state = args.state_turns or (200 if args.quick else 1_000)
    info = harness.machine()
    harness.print_machine(info, args.repeat)
    section = peer_rows(args.repeat, one, args.batch_turns, state)
    section.print()
    path = harness.write_json("peers", info, [section], repeat=args.repeat, turns=one,
                              batch_turns=args.batch_turns, state_turns=state)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
