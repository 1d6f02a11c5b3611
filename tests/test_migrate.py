"""Migrations: a store made by each earlier schema's code is refused until migrated, then reads as it did.

The fixtures under ``tests/fixtures/schemaN`` were written by the code of schema N
(``tests/fixtures/make_fixture.py`` says how): SQL dumps of its stores, and what that
code read of them (``expected.json``). Each is loaded into a fresh SQLite file or
PostgreSQL schema, migrated, and held to what the old code read.
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import pytest

import compactstore as cs
from compactstore import migrate as migrations
from compactstore.backends import SCHEMA_VERSION

FIXTURES = Path(__file__).resolve().parent / "fixtures"
SCHEMAS = sorted((p.name.removeprefix("schema") for p in FIXTURES.glob("schema*") if p.is_dir()), key=int)
OLDER = [v for v in SCHEMAS if v != SCHEMA_VERSION]
KEY = "fixture-key-not-a-secret"


def _expected(version: str) -> dict[str, Any]:
    return json.loads((FIXTURES / f"schema{version}" / "expected.json").read_text(encoding="utf-8"))  # type: ignore[no-any-return]


def load_sqlite(version: str, path: Path, name: str = "sqlite") -> str:
    """Write the fixture store of ``version`` to a SQLite file at ``path``; return the path."""
    conn = sqlite3.connect(path)
    conn.executescript((FIXTURES / f"schema{version}" / f"{name}.sql").read_text(encoding="utf-8"))
    conn.close()
    return str(path)


def load_postgres(version: str, url: str) -> str:
    """Write the fixture store of ``version`` into the empty schema ``url`` names; return the URL."""
    import psycopg

    schema = dict(parse_qsl(urlsplit(url).query))["options"].rsplit("-csearch_path=", 1)[1]
    text = (FIXTURES / f"schema{version}" / "postgres.sql").read_text(encoding="utf-8")
    text = text.replace("CREATE SCHEMA cs_fixture;", "").replace("cs_fixture.", f"{schema}.")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(text.encode())
    return url


def _schema_of(target: str) -> str | None:
    backend = cs.store.open_backend(target, durable=False, create=False)
    try:
        return migrations.version_of(backend)
    finally:
        backend.close()


def _held_to(store: cs.Store, want: dict[str, Any]) -> None:
    """Assert ``store`` reads as the old code read it: heads, contexts and every marker's resolution."""
    report = store.verify()
    assert report.ok, report.problems
    assert sorted(store.sessions()) == sorted(want["sessions"])
    for name, got in want["sessions"].items():
        s = store.session(name)
        assert s.size == got["size"] and s.head().root.hex() == got["root"]
        for label, r in [("context", s.context()), *((p, s.resume(int(p))) for p in got["markers"])]:
            old = got["context"] if label == "context" else got["markers"][label]
            now = {"marker": r.marker, "mode": r.mode, "size": r.size, "root": r.root.hex(), "reasons": list(r.reasons),
                   "digest": r.digest.hex(), "items": [[type(i).__name__, i.pos] for i in r.context]}
            assert now == {k: old[k] for k in now}, (name, label)


def test_there_is_a_fixture_of_this_release_s_schema_and_of_each_it_migrates() -> None:
    assert SCHEMAS == [*migrations.MIGRATES_FROM, SCHEMA_VERSION]


@pytest.mark.parametrize("version", OLDER)
def test_an_older_store_is_refused_with_the_command_and_left_as_it_was(version: str, tmp_path: Path) -> None:
    path = load_sqlite(version, tmp_path / "old.db")
    before = sqlite3.connect(path).execute("SELECT count(*) FROM structure_index").fetchone()
    with pytest.raises(cs.errors.SchemaOutdatedError) as got:
        cs.open(path)
    assert got.value.command == f"compactstore migrate {path}" and got.value.found == version
    assert got.value.command in (got.value.hint or "")
    assert _schema_of(path) == version
    assert sqlite3.connect(path).execute("SELECT count(*) FROM structure_index").fetchone() == before


@pytest.mark.parametrize("version", SCHEMAS)
def test_a_migrated_sqlite_store_reads_as_its_own_code_read_it(version: str, tmp_path: Path) -> None:
    """Every event, leaf, head and seal kept; verify ok; contexts and markers resolve as before; a backup is left."""
    path = load_sqlite(version, tmp_path / "old.db")
    with cs.open(path, migrate=version != SCHEMA_VERSION) as store:
        _held_to(store, _expected(version)["plain"])
    assert _schema_of(path) == SCHEMA_VERSION
    backup = f"{path}.schema-{version}.bak"
    assert _schema_of(backup) == version if version != SCHEMA_VERSION else not Path(backup).exists()
    fresh = str(tmp_path / "fresh.db")
    cs.open(fresh).close()
    layout = "SELECT type, name, tbl_name, sql FROM sqlite_master ORDER BY name"
    assert sqlite3.connect(path).execute(layout).fetchall() == sqlite3.connect(fresh).execute(layout).fetchall()
    keyed = load_sqlite(version, tmp_path / "keyed.db", "sqlite-keyed")
    with cs.open(keyed, key=KEY, migrate=True) as store:
        _held_to(store, _expected(version)["keyed"])


@pytest.mark.parametrize("version", SCHEMAS)
def test_a_migrated_postgres_store_reads_as_its_own_code_read_it(version: str, pg_url: str, pg_databases: object) -> None:
    url = load_postgres(version, pg_url)
    if version != SCHEMA_VERSION:
        with pytest.raises(cs.errors.SchemaOutdatedError):
            cs.open(url)
        dry = subprocess.run([sys.executable, "-m", "compactstore", "migrate", url, "--dry-run", "--json"],
                             capture_output=True, text=True)
        assert dry.returncode == 0, dry.stderr
        assert json.loads(dry.stdout)["dry_run"] and _schema_of(url) == version
    with cs.open(url, migrate=True) as store:
        _held_to(store, _expected(version)["postgres"])
    assert _schema_of(url) == SCHEMA_VERSION
    fresh = pg_databases.create()  # type: ignore[attr-defined]
    try:
        cs.open(fresh).close()
        assert _pg_layout(url) == _pg_layout(fresh)
    finally:
        pg_databases.drop(fresh)  # type: ignore[attr-defined]


def _pg_layout(url: str) -> list[tuple[str, ...]]:
    """Return the schema's tables' columns, its triggers and its functions' sources, as PostgreSQL keeps them."""
    import psycopg

    with psycopg.connect(url) as conn:
        cols = conn.execute("SELECT table_name, column_name, data_type FROM information_schema.columns "
                            "WHERE table_schema = current_schema() ORDER BY 1, 2").fetchall()
        triggers = conn.execute("SELECT tgname, tgrelid::regclass::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid "
                                "WHERE NOT tgisinternal AND c.relnamespace = current_schema()::regnamespace ORDER BY 1, 2").fetchall()
        funcs = conn.execute("SELECT proname, prosrc FROM pg_proc WHERE pronamespace = current_schema()::regnamespace "
                             "ORDER BY 1").fetchall()
    return [tuple(map(str, r)) for r in [*cols, *triggers, *funcs]]


@pytest.mark.parametrize("version", OLDER)
def test_the_migrate_command_dry_runs_then_migrates_then_has_nothing_to_do(version: str, tmp_path: Path) -> None:
    path = load_sqlite(version, tmp_path / "old.db")

    def run(*args: str) -> tuple[int, dict[str, Any]]:
        got = subprocess.run([sys.executable, "-m", "compactstore", "migrate", path, "--json", *args],
                             capture_output=True, text=True)
        return got.returncode, json.loads(got.stdout) if got.stdout else {"stderr": got.stderr}

    code, out = run("--dry-run")
    assert code == 0 and out["dry_run"] and out["source"] == version and _schema_of(path) == version
    code, out = run()
    assert code == 0, out
    assert out["target"] == SCHEMA_VERSION and out["verified"] and out["backup"] == f"{path}.schema-{version}.bak"
    assert out["steps"] and all(s.startswith(f"{version} -> ") for s in out["steps"][:1])
    code, out = run()
    assert code == 0 and out["source"] == out["target"] == SCHEMA_VERSION and not out["steps"]


def test_a_store_newer_than_this_release_is_refused_and_not_migrated(tmp_path: Path) -> None:
    path = str(tmp_path / "new.db")
    cs.open(path).close()
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER meta_no_update")
    conn.execute("UPDATE meta SET value = '99' WHERE name = 'schema_version'")
    conn.commit()
    conn.close()
    for migrate in (False, True):
        with pytest.raises(cs.CompactStoreError, match="schema '99'"):
            cs.open(path, migrate=migrate)
    backend = cs.store.open_backend(path, durable=False, create=False)
    try:
        with pytest.raises(cs.CompactStoreError, match="cannot migrate a store of schema '99'"):
            migrations.migrate(backend, path)
    finally:
        backend.close()
