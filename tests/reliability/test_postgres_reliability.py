"""The crash and concurrency campaigns on PostgreSQL: client processes killed, the server crashed.

The same harness as on SQLite (``crash_harness.py``): writers doing the mixed workload
on a ``durable=True`` store (``synchronous_commit = on``), killed with SIGKILL at random
moments; and a server of its own shut down with ``pg_ctl stop -m immediate`` (a crash:
no checkpoint, recovery from the WAL at the next start) under running writers. After
each: the store opens, verifies, and holds every acknowledged operation exactly once.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from crash_harness import Campaign

pytest.importorskip("psycopg")


def _assert_clean(campaign: Campaign) -> None:
    f = campaign.figures
    print(f.summary())
    assert f.failures == [], "\n".join(f.failures[:10])
    assert (f.lost, f.duplicated, f.phantom) == (0, 0, 0), f.summary()


def test_killed_postgres_clients_lose_no_acknowledged_event(pg_databases: Any, tmp_path: Path) -> None:
    """Two writers killed at random moments, 12 kills, on PostgreSQL."""
    made: list[str] = []

    def fresh() -> str:
        made.append(pg_databases.create())
        return made[-1]

    campaign = Campaign(tmp_path, seed=5, new_target=fresh, max_delay=1.0)
    try:
        figures = campaign.run(kills=12)
        _assert_clean(campaign)
        assert figures.acked_ops > 50, figures.summary()
    finally:
        for url in made:
            pg_databases.drop(url)


def test_postgres_writers_side_by_side_keep_every_session_sound(pg_url: str, tmp_path: Path) -> None:
    """Four writers appending, compacting and marking on one PostgreSQL store at once, no kill."""
    campaign = Campaign(tmp_path, seed=8, writers=4, new_target=lambda: pg_url)
    campaign.calm(ops=80)
    _assert_clean(campaign)


class OwnServer:
    """A PostgreSQL cluster of the test's own, which it may crash and restart."""

    def __init__(self) -> None:
        from pg import Databases, TempServer, find_bin_dir

        bin_dir = find_bin_dir()
        if bin_dir is None:
            pytest.skip("no PostgreSQL binaries")
        self.server = TempServer(bin_dir)
        self.url = self.server.start()
        self.dbs = Databases(self.url)

    def _pg_ctl(self, *args: str) -> None:
        s = self.server
        s._run(str(s.bin_dir / "pg_ctl"), "-D", str(s.data), *args)

    def crash(self) -> None:
        """Shut down without a checkpoint: what a power cut does to the server's processes."""
        self.dbs.close()
        self._pg_ctl("-m", "immediate", "-w", "stop")

    def restart(self) -> None:
        """Start again on the same data directory and port; recovery replays the WAL."""
        from pg import Databases

        s = self.server
        opts = (
            f"-c listen_addresses=127.0.0.1 -p {s.port} -c unix_socket_directories={s.root} "
            "-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=300"
        )
        self._pg_ctl("-l", str(s.log), "-o", opts, "-w", "-t", "60", "start")
        self.dbs = Databases(self.url)

    def close(self) -> None:
        self.dbs.close()
        self.server.stop()


@pytest.fixture
def own_server() -> Iterator[OwnServer]:
    """A throwaway cluster this test may crash."""
    server = OwnServer()
    yield server
    server.close()


def test_a_crashed_postgres_server_loses_no_acknowledged_event(own_server: OwnServer, tmp_path: Path) -> None:
    """Three immediate shutdowns under two running writers: after each restart the store verifies
    and holds every acknowledged operation exactly once."""
    target = own_server.dbs.create()
    campaign = Campaign(tmp_path, seed=9, new_target=lambda: target, max_delay=1.5, max_events=10**9)
    for _ in range(3):
        campaign.crash_server(own_server.crash, own_server.restart)
    _assert_clean(campaign)
    assert campaign.figures.server_crashes == 3 and campaign.figures.acked_ops > 20, campaign.figures.summary()
