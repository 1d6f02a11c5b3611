#!/usr/bin/env python3
"""Coverage-guided fuzzing with atheris of the event decoder and the append path.

    pip install atheris
    python benchmarks/fuzz_atheris.py -runs=50000

Each input is split into a session name and an event body. ``events.decode`` must give
an event or raise ``InvalidEvent``; a decoded event is appended to a SQLite store, which
must either take it (and still verify) or raise a typed error and stay byte-for-byte as
it was. Any other exception stops the fuzzer with the input that caused it. Inputs that
hit the known gaps pinned in tests/reliability/test_hostile_input.py are counted, not
reported again.
"""

from __future__ import annotations

import atexit
import base64
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import atheris

with atheris.instrument_imports():
    import compactstore as cs
    from compactstore import events as ev

WORK = Path(tempfile.mkdtemp(prefix="fuzz-"))
STORE = cs.open(str(WORK / "fuzz.db"), clock=cs.events.tick_clock())
STORE.session("seed").append(cs.Turn("user", "seed"))
SEEN: Counter[str] = Counter()
#: With FUZZ_LOG set, every decoded input is written there (base64, one a line) before it is
#: appended, so that a crash that depends on the store's history can be replayed without atheris.
LOG = open(os.environ["FUZZ_LOG"], "a") if os.environ.get("FUZZ_LOG") else None  # noqa: SIM115


def _snapshot() -> tuple[bytes, bytes]:
    db, wal = WORK / "fuzz.db", WORK / "fuzz.db-wal"
    return db.read_bytes(), wal.read_bytes() if wal.exists() else b""


def test_one_input(data: bytes) -> None:
    """Decode, then append; every failure must be typed and write nothing."""
    SEEN["inputs"] += 1
    if SEEN["inputs"] % 20_000 == 0:
        _report()
    n = data[0] % 41 if data else 0
    name = data[1:1 + n].decode("utf-8", "replace").replace("\x00", "")
    body = data[1 + n:]
    try:
        event = ev.decode(body)
    except cs.InvalidEvent:
        SEEN["refused by decode"] += 1
        return
    except RecursionError:
        SEEN["known: RecursionError from decode"] += 1
        return
    SEEN["decoded"] += 1
    if LOG is not None:
        LOG.write(base64.b64encode(data).decode() + "\n")
        LOG.flush()
    before = _snapshot()
    try:
        STORE.session(name or "s").append(event)
    except cs.CompactStoreError:
        SEEN["refused by append"] += 1
        if _snapshot() != before:
            raise AssertionError("a refused append changed the store") from None
        return
    SEEN["appended"] += 1
    if SEEN["appended"] % 200 == 0:
        _verify_elsewhere()


def _verify_elsewhere() -> None:
    """Verify the store in a plain interpreter (verify() under atheris' instrumentation crashes CPython)."""
    got = subprocess.run([sys.executable, "-c", "import sys, compactstore as cs\n"
                          "r = cs.open(sys.argv[1]).verify()\nprint(r.ok, [str(p) for p in r.problems[:3]])",
                          str(WORK / "fuzz.db")], capture_output=True, text=True, check=True)
    SEEN["verified"] += 1
    if not got.stdout.startswith("True"):
        raise AssertionError(f"the store no longer verifies: {got.stdout}")


@atexit.register
def _report() -> None:
    print("fuzz figures:", dict(SEEN), file=sys.stderr, flush=True)


def _seeds(corpus: Path) -> None:
    """Write one valid body of every event kind (and a few near misses) as the starting corpus."""
    corpus.mkdir(exist_ok=True)
    s = cs.open(str(WORK / "seed.db"), clock=cs.events.tick_clock()).session("seed")
    s.append(cs.Turn("user", "go", meta={"a": [1, 2.5, None, True]}))
    s.append(cs.ToolCall("c1", "run_sql", {"sql": "SELECT 1"}), idempotency_key="k")
    s.append(cs.ToolResult("c1", "ERROR", ok=False, status="failed"))
    s.bind("rollback", "migrations/003_down.sql")
    s.oblige("finish", needs=["rollback"])
    s.append(cs.events.HandleOpened(handle="h", resource="file"))
    node = s.compact(0, 6, on_risk="spill")
    s.mark(node)
    s.mark_raw()
    for r in s.scan():
        for name in (b"s", b"'; DROP TABLE events; --", b"../x"):
            (corpus / f"{r.pos}-{len(name)}").write_bytes(bytes([len(name)]) + name + r.body)


if __name__ == "__main__":
    argv = list(sys.argv)
    if not any(not a.startswith("-") for a in argv[1:]):
        _seeds(WORK / "corpus")
        argv.append(str(WORK / "corpus"))
    atheris.Setup(argv, test_one_input)
    atheris.Fuzz()
