"""Several processes appending to one SQLite file keep every session gapless and verifiable."""

from __future__ import annotations

import json
import multiprocessing
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import compactstore as cs

WRITER = textwrap.dedent(
    """
    import json, sys
    import compactstore as cs
    path, who, session, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    acked = []
    with cs.open(path) as st:
        s = st.session(session)
        for i in range(n):
            if i % 4 == 3:
                batch = [cs.Turn("user", f"{who}-{i}-{j}") for j in range(3)]
                acked += [r.event.content for r in s.extend(batch)]
            else:
                acked.append(s.append(cs.Turn("user", f"{who}-{i}")).event.content)
    print(json.dumps(acked))
    """
)


def test_concurrent_writer_processes_give_a_gapless_verified_log(tmp_path: Path) -> None:
    """Six processes (four on one session, two on others) lose and duplicate nothing."""
    path = str(tmp_path / "shared.db")
    cs.open(path).close()
    plan = [(f"w{i}", "shared") for i in range(4)] + [("x0", "solo-0"), ("x1", "solo-1")]
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, path, who, session, "60"], stdout=subprocess.PIPE, text=True)
        for who, session in plan
    ]
    acked: dict[str, list[str]] = {"shared": [], "solo-0": [], "solo-1": []}
    for (_, session), proc in zip(plan, procs):
        out, _ = proc.communicate(timeout=300)
        assert proc.returncode == 0
        acked[session] += json.loads(out)
    with cs.open(path) as st:
        assert st.verify().ok
        for session, contents in acked.items():
            records = list(st.session(session).scan())
            assert [r.pos for r in records] == list(range(len(records)))
            stored = [r.event.content for r in records]  # type: ignore[attr-defined]
            assert sorted(stored) == sorted(contents)
            assert len(set(stored)) == len(stored)


def _open_and_append(path: str, who: int, start: Any, failures: Any) -> None:
    start.wait()
    try:
        with cs.open(path) as st:
            st.session(f"opener-{who}").append(cs.Turn("user", "first"))
    except Exception as exc:  # reported to the parent, which fails the test
        failures.put(f"{type(exc).__name__}: {exc}")


def test_processes_opening_a_new_file_at_once_all_succeed(tmp_path: Path) -> None:
    """Six processes released together on a file that does not exist yet all open it and append.

    SQLite refuses the concurrent switch to WAL without waiting; the store must wait for it.
    Twenty-five rounds make 150 first opens, where a store that did not wait failed
    several percent of them.
    """
    ctx = multiprocessing.get_context("fork")
    failures = ctx.Queue()
    for round_ in range(25):
        path = str(tmp_path / f"new-{round_}.db")
        start = ctx.Barrier(6)
        procs = [ctx.Process(target=_open_and_append, args=(path, i, start, failures)) for i in range(6)]
        for proc in procs:
            proc.start()
        for proc in procs:
            proc.join(timeout=120)
            assert proc.exitcode == 0
        with cs.open(path) as st:
            assert sorted(st.sessions()) == sorted(f"opener-{i}" for i in range(6))
    found = []
    while not failures.empty():
        found.append(failures.get())
    assert found == []


def test_handles_interleaving_on_one_file_build_on_the_latest_head(tmp_path: Path) -> None:
    """Two handles on one file, taking turns: each append builds on the other's commits, never on its own last one."""
    path = str(tmp_path / "two.db")
    with cs.open(path) as a, cs.open(path) as b:
        sa, sb, other = a.session("s"), b.session("s"), b.session("t")
        got = []
        for i in range(6):
            got.append(sa.append(cs.Turn("user", f"a{i}")))  # a's remembered head is stale from i = 1 on
            got.append(sb.append(cs.Turn("user", f"b{i}")))
            other.append(cs.Turn("user", f"t{i}"))  # moves the next seq only
        assert [r.pos for r in got] == list(range(12))
        # A compare-and-append and an idempotent retry after the other handle moved the session.
        sb.append(cs.Turn("user", "b-last"), idempotency_key="k")
        assert sa.extend([cs.Turn("user", "a-last")], expect_size=13)[0].pos == 13
        assert sa.append(cs.Turn("user", "b-last"), idempotency_key="k").pos == 12
        # A derived event admitted by the rules, built after the other handle's commit.
        sb.append(cs.Turn("user", "b-more"))
        node = sa.compact(0, 4, summary="the first four turns")
        assert node.pos == 15
        # One the rules admit (reading the log), appended after the other handle's commit.
        sb.append(cs.Turn("user", "b-again"))
        assert sa.append(cs.events.Redaction(positions=[1, 15], reason="gone")).pos == 17  # the node is built from 1
        assert sa.size == sb.size == 18
        assert sa.head() == sb.head()
        assert a.verify().ok
        seqs = sorted(r.seq for name in ("s", "t") for r in a.session(name).scan())
        assert seqs == list(range(1, len(seqs) + 1))
