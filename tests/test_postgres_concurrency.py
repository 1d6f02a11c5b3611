"""Eight writer processes on one PostgreSQL store: nothing lost, nothing doubled, every tree sound."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time

import pytest

import compactstore as cs

pytest.importorskip("psycopg")

ROUNDS = 60

WRITER = textwrap.dedent(
    """
    import json, sys, time
    import compactstore as cs
    url, who, session, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    acked = []
    with cs.open(url) as st:
        s = st.session(session)
        sys.stdout.write("ready\\n"); sys.stdout.flush()
        sys.stdin.readline()  # start together
        t0 = time.perf_counter()
        for i in range(n):
            if i % 4 == 3:
                batch = [cs.Turn("user", f"{who}-{i}-{j}") for j in range(3)]
                acked += [(r.pos, r.event.content) for r in s.extend(batch)]
            elif i % 10 == 5:
                # A retried append: the second call must return the first record.
                key = f"{who}-k{i}"
                first = s.append(cs.Turn("user", f"{who}-{i}"), idempotency_key=key)
                again = s.append(cs.Turn("user", f"{who}-{i}"), idempotency_key=key)
                assert again == first, (first, again)
                acked.append((first.pos, first.event.content))
            else:
                r = s.append(cs.Turn("user", f"{who}-{i}"))
                acked.append((r.pos, r.event.content))
        # Every writer of a session appends the same keyed event: it is stored once.
        common = s.append(cs.Turn("user", "common"), idempotency_key="common")
        elapsed = time.perf_counter() - t0
    print(json.dumps({"acked": acked, "common": common.pos, "elapsed": elapsed}))
    """
)


def test_eight_writer_processes_keep_every_session_gapless_and_verified(pg_url: str) -> None:
    """Four processes on one session and four on their own: every ack stored once, gapless, verify() clean."""
    cs.open(pg_url).close()  # create the schema before the race
    plan = [(f"w{i}", "shared") for i in range(4)] + [(f"x{i}", f"solo-{i}") for i in range(4)]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WRITER, pg_url, who, session, str(ROUNDS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )
        for who, session in plan
    ]
    for p in procs:
        assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    t0 = time.perf_counter()
    for p in procs:
        assert p.stdin is not None
        p.stdin.write("go\n")
        p.stdin.flush()
    acked: dict[str, list[tuple[int, str]]] = {}
    common: dict[str, set[int]] = {}
    for (_, session), p in zip(plan, procs):
        out, _ = p.communicate(timeout=300)
        assert p.returncode == 0
        got = json.loads(out)
        acked.setdefault(session, []).extend((pos, content) for pos, content in got["acked"])
        common.setdefault(session, set()).add(got["common"])
    wall = time.perf_counter() - t0
    total = sum(len(v) for v in acked.values())
    with cs.open(pg_url) as st:
        report = st.verify()
        assert report.ok, report.problems[:5]
        assert sorted(st.sessions()) == sorted(acked)
        for session, pairs in acked.items():
            records = list(st.session(session).scan())
            assert [r.pos for r in records] == list(range(len(records)))  # gapless
            stored = [(r.pos, r.event.content) for r in records]  # type: ignore[attr-defined]
            # Every acknowledged append is stored exactly once, at the position it was told.
            assert len(common[session]) == 1
            expected = sorted(pairs + [(common[session].pop(), "common")])
            assert sorted(stored) == expected
            assert len({c for _, c in stored}) == len(stored)
            seqs = [r.seq for r in records]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
        assert report.events == total + len(acked)
    print(f"\n8 writers, {total + len(acked)} events acknowledged in {wall:.2f}s ({(total + len(acked)) / wall:.0f}/s)")
