"""A throwaway PostgreSQL server for the tests, and a fresh database per test.

With ``COMPACTSTORE_TEST_PG_URL`` set, the tests use that database instead (a UTF8
database, PostgreSQL 13 or newer, whose user may create schemas in it). Otherwise :class:`TempServer` runs the
machine's ``initdb`` and ``pg_ctl`` (from PATH or ``/usr/lib/postgresql/*/bin``) in a
temporary directory, on 127.0.0.1 with its unix socket in that directory, as a non-root
user when the tests run as root, and stops and removes it afterwards.
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from urllib.parse import parse_qsl, quote, urlencode, urlsplit, urlunsplit

import psycopg

ENV_URL = "COMPACTSTORE_TEST_PG_URL"
#: The system user that runs the server when the tests run as root.
SERVER_USER = "postgres"

#: Runs beside the tests: once the test process is gone (killed, even with SIGKILL),
#: stops the server and removes its directory, so no server outlives its run.
WATCHDOG = """
import os, shutil, subprocess, sys, time
pid, root, cmd = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
while True:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(1)
subprocess.run(cmd, capture_output=True, timeout=60)
shutil.rmtree(root, ignore_errors=True)
"""


def find_bin_dir() -> Path | None:
    """Return the directory holding ``initdb`` and ``pg_ctl``, or None when there is none."""
    initdb = shutil.which("initdb")
    if initdb and shutil.which("pg_ctl"):
        real = Path(initdb).resolve().parent
        if (real / "pg_ctl").exists():
            return real
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name), reverse=True)
    for d in candidates:
        if (Path(d) / "initdb").exists() and (Path(d) / "pg_ctl").exists():
            return Path(d)
    return None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ensure_user(name: str) -> None:
    try:
        pwd.getpwnam(name)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
            check=True,
            capture_output=True,
        )


class TempServer:
    """A PostgreSQL cluster in a temporary directory, started on a free loopback port."""

    def __init__(self, bin_dir: Path, *, durable: bool = False) -> None:
        """Prepare (but do not start) a cluster using the binaries in ``bin_dir``.

        Tests trade durability for speed (``fsync``, ``synchronous_commit`` and full page
        writes off); ``durable=True`` keeps the server's defaults, for benchmarks that
        measure durable commits.
        """
        self.bin_dir = bin_dir
        self.durable = durable
        self.root = Path(tempfile.mkdtemp(prefix="compactstore-pg-"))
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.password = secrets.token_hex(16)
        self.port = 0
        self.watchdog: subprocess.Popen[bytes] | None = None
        self.as_user: list[str] = []
        if os.geteuid() == 0:  # PostgreSQL refuses to run as root
            _ensure_user(SERVER_USER)
            self.as_user = ["runuser", "-u", SERVER_USER, "--"]
            shutil.chown(self.root, SERVER_USER)
        self.root.chmod(0o700)

    def _run(self, *args: str) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        env["LC_ALL"] = "C"
        subprocess.run([*self.as_user, *args], check=True, capture_output=True, env=env, cwd=self.root, timeout=120)

    def start(self) -> str:
        """Create and start the cluster; return the URL of its ``postgres`` database."""
        pwfile = self.root / "pw"
        pwfile.write_text(self.password)
        if self.as_user:
            shutil.chown(pwfile, SERVER_USER)
        self._run(
            str(self.bin_dir / "initdb"), "-D", str(self.data), "-U", "postgres", "-E", "UTF8", "--locale=C",
            "--auth=scram-sha-256", f"--pwfile={pwfile}", "--no-sync",
        )
        pwfile.unlink()
        for attempt in range(5):
            self.port = _free_port()
            opts = (
                f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.root} "
                "-c max_connections=300"
            )
            if not self.durable:
                opts += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
            try:
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts,
                          "-w", "-t", "60", "start")
                break
            except subprocess.CalledProcessError:
                if attempt == 4:
                    raise RuntimeError(f"PostgreSQL did not start:\n{self.log.read_text()[-4000:]}") from None
                time.sleep(0.2)
        stop = [*self.as_user, str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop"]
        self.watchdog = subprocess.Popen(
            [sys.executable, "-c", WATCHDOG, str(os.getpid()), str(self.root), *stop],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True,  # outlives a signal sent to the test run's process group
        )
        return f"postgresql://postgres:{quote(self.password)}@127.0.0.1:{self.port}/postgres"

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        if self.watchdog is not None:
            self.watchdog.kill()
            self.watchdog.wait()
        try:
            if (self.data / "postmaster.pid").exists():
                self._run(str(self.bin_dir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def with_schema(url: str, schema: str) -> str:
    """Return ``url`` with ``schema`` as its search path (through libpq's ``options``)."""
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    options = " ".join([v for k, v in query if k == "options"] + [f"-csearch_path={schema}"])
    query = [(k, v) for k, v in query if k != "options"] + [("options", options)]
    return urlunsplit(parts._replace(query=urlencode(query, quote_via=quote)))


class Databases:
    """Hands out one fresh, empty schema per test in the database at ``url``.

    A schema is as good as a database to the store (it names its tables unqualified)
    and costs a millisecond where a database costs a checkpoint.
    """

    def __init__(self, url: str) -> None:
        """Connect to the database as a user allowed to create schemas in it."""
        self.url = url
        self._conn = psycopg.connect(url, autocommit=True)
        self._n = 0
        self._prefix = f"cs_test_{os.getpid()}_{secrets.token_hex(3)}"

    def create(self) -> str:
        """Create an empty schema and return a URL whose search path is that schema alone."""
        self._n += 1
        name = f"{self._prefix}_{self._n}"
        self._conn.execute(f"CREATE SCHEMA {name}")
        return with_schema(self.url, name)

    def drop(self, url: str) -> None:
        """Drop the schema of ``url`` and everything in it."""
        options = dict(parse_qsl(urlsplit(url).query))["options"]
        name = options.rsplit("-csearch_path=", 1)[1]
        self._conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")

    def close(self) -> None:
        """Close the connection."""
        self._conn.close()
