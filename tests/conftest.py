"""Shared fixtures: every store test runs against each backend through `target`.

``target`` is a fresh store location per test: a SQLite file, or a PostgreSQL URL of an
empty schema created for the test (see ``tests/pg.py`` for the server behind it).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

import compactstore as cs
from compactstore import structure

BACKENDS = ["sqlite", "postgres"]


@pytest.fixture(scope="session")
def pg_databases() -> Iterator[object]:
    """Return a factory of fresh PostgreSQL store locations, starting a server if none is given."""
    pytest.importorskip("psycopg", reason="the postgres extra is not installed")
    from pg import ENV_URL, Databases, TempServer, find_bin_dir

    server = None
    url = os.environ.get(ENV_URL)
    if not url:
        bin_dir = find_bin_dir()
        if bin_dir is None:
            pytest.skip(
                f"no PostgreSQL: initdb/pg_ctl are neither on PATH nor under /usr/lib/postgresql/*/bin, "
                f"and {ENV_URL} is unset"
            )
        server = TempServer(bin_dir)
        try:
            url = server.start()
        except BaseException:
            server.stop()
            raise
    dbs = Databases(url)
    try:
        yield dbs
    finally:
        dbs.close()
        if server is not None:
            server.stop()


@pytest.fixture
def pg_url(pg_databases: object) -> Iterator[str]:
    """Return the URL of a fresh, empty PostgreSQL store location, dropped after the test."""
    from pg import Databases

    assert isinstance(pg_databases, Databases)
    url = pg_databases.create()
    yield url
    pg_databases.drop(url)


@pytest.fixture(params=BACKENDS)
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Return a fresh store location for each backend."""
    if request.param == "postgres":
        return str(request.getfixturevalue("pg_url"))
    return str(tmp_path / "store.db")


@pytest.fixture
def sqlite_target(tmp_path: Path) -> str:
    """Return a fresh SQLite file path, for tests that open the file with sqlite3 itself."""
    return str(tmp_path / "store.db")


@pytest.fixture
def open_store(target: str) -> Iterator[Callable[..., cs.Store]]:
    """Return a function that opens the test's store (deterministic clock by default)."""
    opened: list[cs.Store] = []

    def _open(**kwargs: object) -> cs.Store:
        kwargs.setdefault("clock", cs.events.tick_clock())
        s = cs.open(target, **kwargs)  # type: ignore[arg-type]
        opened.append(s)
        return s

    yield _open
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: Callable[..., cs.Store]) -> cs.Store:
    """Return an open store with a deterministic clock."""
    return open_store()


def pytest_addoption(parser: pytest.Parser) -> None:
    """Register ``--slow``: also run the long campaigns marked ``slow``."""
    parser.addoption("--slow", action="store_true", default=False, help="run the long campaigns marked slow")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``slow`` unless ``--slow`` was given."""
    if config.getoption("--slow"):
        return
    skip = pytest.mark.skip(reason="long campaign: run with --slow")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def small_snapshots(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Snapshot the open items every 4 positions, so that small sessions cross many snapshots."""
    monkeypatch.setattr(structure, "SNAPSHOT_EVERY", 4)
    yield
