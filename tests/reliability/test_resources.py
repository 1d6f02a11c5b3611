"""Resources: a read-only file system, a full disk, a database locked by another process.

Each must give a clear, typed error and lose nothing already acknowledged. The file
system cases mount a small tmpfs (the tests run as root in CI); where mounting is not
permitted they skip. The lock cases run the writer in a subprocess whose SQLite busy
timeout is lowered from its 60 s default so that they take a second; the same case
with the real timeout runs with ``--slow``.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

import compactstore as cs


class Tmpfs:
    """A small tmpfs mounted for one test, unmounted after it."""

    def __init__(self, where: Path, size: str) -> None:
        where.mkdir()
        self.where = where
        got = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True, text=True)
        if got.returncode != 0:
            pytest.skip(f"cannot mount a tmpfs here: {got.stderr.strip()}")

    def remount(self, opts: str) -> None:
        subprocess.run(["mount", "-o", f"remount,{opts}", str(self.where)], check=True, capture_output=True)

    def unmount(self) -> None:
        subprocess.run(["umount", "-l", str(self.where)], capture_output=True)


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    """A 512 KiB tmpfs."""
    fs = Tmpfs(tmp_path / "mnt", "512k")
    yield fs
    fs.unmount()


def _fill(s: cs.Session, acked: list[tuple[int, str]]) -> BaseException:
    """Append until the disk is full; return the error that stopped it."""
    for i in range(100_000):
        text = f"{i} " + "x" * 1500
        try:
            rec = s.append(cs.Turn("user", text))
        except BaseException as exc:  # noqa: BLE001 - whatever it is, the test looks at it
            return exc
        acked.append((rec.pos, text))
    raise AssertionError("the disk never filled")


def _check_acked(path: Path, acked: list[tuple[int, str]]) -> None:
    with cs.open(str(path)) as st:
        assert st.verify().ok
        s = st.session("s")
        assert [(r.pos, r.event.content) for r in s.scan()] == acked  # type: ignore[attr-defined]


def test_a_full_disk_loses_nothing_acknowledged(tmpfs: Tmpfs) -> None:
    """Appending until the file system is full: the failed append writes nothing, every earlier one is
    there, and once space is freed the store verifies and takes appends again."""
    path = tmpfs.where / "s.db"
    acked: list[tuple[int, str]] = []
    with cs.open(str(path), durable=True) as st:
        s = st.session("s")
        _fill(s, acked)
        assert s.size == len(acked) and st.verify().ok
    assert len(acked) > 5
    tmpfs.remount("size=8m")
    _check_acked(path, acked)
    with cs.open(str(path)) as st:
        st.session("s").append(cs.Turn("user", "after"))
        assert st.verify().ok


def test_a_full_disk_gives_a_typed_error(tmpfs: Tmpfs) -> None:
    """The append that finds the disk full raises a CompactStoreError saying so."""
    with cs.open(str(tmpfs.where / "s.db"), durable=True) as st:
        err = _fill(st.session("s"), [])
    assert isinstance(err, cs.CompactStoreError), repr(err)
    assert "full" in str(err)


@pytest.fixture
def big_tmpfs(tmp_path: Path) -> Iterator[Tmpfs]:
    """An 8 MiB tmpfs."""
    fs = Tmpfs(tmp_path / "big", "8m")
    yield fs
    fs.unmount()


def test_a_read_only_file_system_gives_a_typed_error_and_keeps_the_store(big_tmpfs: Tmpfs) -> None:
    """A store on a file system remounted read-only: cs.open raises CompactStoreError; rw again, all is there."""
    tmpfs = big_tmpfs
    path = tmpfs.where / "s.db"
    acked = []
    with cs.open(str(path), durable=True) as st:
        s = st.session("s")
        for i in range(20):
            acked.append((s.append(cs.Turn("user", f"t{i}")).pos, f"t{i}"))
    tmpfs.remount("ro")
    with pytest.raises(cs.CompactStoreError) as info:
        cs.open(str(path))
    assert "s.db" in str(info.value)
    tmpfs.remount("rw")
    _check_acked(path, acked)


LOCKER = textwrap.dedent(
    """
    import sqlite3, sys, time
    conn = sqlite3.connect(sys.argv[1], isolation_level=None)
    conn.execute("BEGIN EXCLUSIVE")
    print("locked", flush=True)
    sys.stdin.readline()
    """
)

WRITER = textwrap.dedent(
    """
    import sys, time
    import compactstore.backends.sqlite as backend
    if sys.argv[2] != "default":
        backend.BUSY_TIMEOUT_MS = int(sys.argv[2])
    import compactstore as cs
    st = cs.open(sys.argv[1])
    s = st.session("s")
    s.append(cs.Turn("user", "before the lock"))
    print("ready", flush=True)
    sys.stdin.readline()  # the parent takes the lock now
    t0 = time.perf_counter()
    try:
        s.append(cs.Turn("user", "during the lock"))
        print("appended")
    except cs.CompactStoreError as exc:
        print(f"typed {type(exc).__name__}: {exc}")
    except Exception as exc:
        print(f"untyped {type(exc).__module__}.{type(exc).__name__}: {exc}")
    print(f"waited {time.perf_counter() - t0:.1f}")
    """
)


def _locked_append(path: Path, timeout_ms: str) -> list[str]:
    """Append while another process holds an exclusive lock; return what the writer printed."""
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(path), timeout_ms],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert writer.stdout is not None and writer.stdin is not None
    assert writer.stdout.readline().strip() == "ready"
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        out, err = writer.communicate("\n", timeout=180)
    finally:
        locker.communicate("\n", timeout=30)
    assert writer.returncode == 0, err
    return out.splitlines()


def _check_lock_outcome(path: Path, lines: list[str]) -> None:
    with cs.open(str(path)) as st:
        assert st.verify().ok
        assert [r.event.content for r in st.session("s").scan()] == ["before the lock"]  # type: ignore[attr-defined]
    assert lines[0] != "appended", lines


def test_a_locked_database_loses_nothing(tmp_path: Path) -> None:
    """An append blocked by another process's lock past the busy timeout fails and writes nothing;
    what was acknowledged before is intact."""
    path = tmp_path / "s.db"
    lines = _locked_append(path, "300")
    _check_lock_outcome(path, lines)


def test_a_locked_database_gives_a_typed_error(tmp_path: Path) -> None:
    """The append that times out on the lock raises LockTimeout, the retryable ConflictError PostgreSQL raises too."""
    lines = _locked_append(tmp_path / "s.db", "300")
    assert lines[0].startswith("typed LockTimeout"), lines


def test_opening_a_locked_database_gives_a_typed_error(tmp_path: Path) -> None:
    """Opening a store another process holds locked past the busy timeout raises CompactStoreError."""
    path = tmp_path / "s.db"
    cs.open(str(path)).close()
    locker = subprocess.Popen([sys.executable, "-c", LOCKER, str(path)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert locker.stdout is not None and locker.stdout.readline().strip() == "locked"
        got = subprocess.run(
            [sys.executable, "-c", "import sys\nimport compactstore.backends.sqlite as b\nb.BUSY_TIMEOUT_MS = 300\n"
             "import compactstore as cs\ntry:\n    cs.open(sys.argv[1])\nexcept cs.CompactStoreError as e:\n"
             "    print('typed', e)\n", str(path)],
            capture_output=True, text=True, timeout=120,
        )
    finally:
        locker.communicate("\n", timeout=30)
    assert got.stdout.startswith("typed") and "locked" in got.stdout, (got.stdout, got.stderr)


@pytest.mark.slow
def test_a_locked_database_with_the_default_busy_timeout(tmp_path: Path) -> None:
    """The same with the real 60 s busy timeout: the append waits it out, then fails and writes nothing."""
    path = tmp_path / "s.db"
    lines = _locked_append(path, "default")
    _check_lock_outcome(path, lines)
    assert float(lines[-1].split()[-1]) >= 59, lines
