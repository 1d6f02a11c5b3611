"""The `compactstore` command as a real process: the console script, `python -m compactstore`, a terminal."""

from __future__ import annotations

import json
import os
import pty
import select
import subprocess
import sys
from pathlib import Path

import compactstore as cs

SCRIPT = Path(sys.executable).with_name("compactstore")


def cli(*args: str, cwd: Path, input: str | None = None, module: bool = False) -> subprocess.CompletedProcess[str]:
    """Run the console script (or ``python -m compactstore``) in ``cwd``."""
    command = [sys.executable, "-m", "compactstore"] if module else [str(SCRIPT)]
    env = {k: v for k, v in os.environ.items() if k != "COMPACTSTORE_STORE"}
    return subprocess.run([*command, *args], cwd=cwd, input=input, capture_output=True, text=True, env=env,
                          timeout=120)


def test_the_demo_then_the_other_commands_on_its_store(tmp_path: Path) -> None:
    """`compactstore demo` leaves compactstore.db, which the other commands read by default."""
    demo = cli("demo", cwd=tmp_path)
    assert demo.returncode == 0, demo.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compactstore.db"]
    verify = cli("verify", cwd=tmp_path, module=True)
    assert verify.returncode == 0 and verify.stdout.startswith("ok: 1 session")
    resume = cli("resume", "33", "--json", cwd=tmp_path)
    assert resume.returncode == 0 and json.loads(resume.stdout)["mode"] == "certified"
    show = cli("show", cwd=tmp_path)
    assert show.returncode == 0 and "session 'migration-42'" in show.stdout and "LOSSY_GIST" in show.stdout
    audit = cli("audit", cwd=tmp_path)
    assert audit.returncode == 1 and "'snapshot'" in audit.stdout
    proof = cli("proof", "inclusion", "8", cwd=tmp_path)
    checked = cli("proof", "check", cwd=tmp_path, input=proof.stdout)
    assert checked.returncode == 0, checked.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compactstore.db"]


def test_bad_input_through_a_pipe_is_one_line_exit_2_and_writes_nothing(tmp_path: Path) -> None:
    """Malformed JSON Lines on stdin: the process exits 2 with one line on stderr, and no store appears."""
    lines = '{"kind": "turn", "role": "user", "content": "hi"}\n{"kind": "turn", "role": \n'
    result = cli("append", "--session", "s", cwd=tmp_path, input=lines, module=True)
    assert result.returncode == 2
    assert result.stderr.startswith("error: line 2: not valid JSON") and result.stderr.count("\n") == 1
    assert result.stdout == "" and list(tmp_path.iterdir()) == []
    unknown = cli("append", "--session", "s", cwd=tmp_path, input='{"kind": "thought", "text": "x"}\n')
    assert unknown.returncode == 2 and "line 1: unknown kind 'thought'" in unknown.stderr
    missing = cli("show", "-s", "nope.db", cwd=tmp_path)
    assert missing.returncode == 2 and missing.stderr.startswith("error: no store at nope.db")
    assert list(tmp_path.iterdir()) == []


def test_piped_round_trip_between_two_processes(tmp_path: Path) -> None:
    """`export | append` between processes gives the same root."""
    assert cli("demo", "-s", "a.db", cwd=tmp_path).returncode == 0
    exported = cli("export", "-s", "a.db", cwd=tmp_path)
    appended = cli("append", "-s", "b.db", "--session", "migration-42", "--json", cwd=tmp_path, input=exported.stdout)
    assert appended.returncode == 0, appended.stderr
    with cs.open(str(tmp_path / "a.db")) as a:
        assert json.loads(appended.stdout)["root"] == a.session("migration-42").head().root.hex()


def _on_terminal(args: list[str], cwd: Path) -> tuple[int, str]:
    """Run the console script with stdout and stderr on a pseudo-terminal; return its status and output."""
    main_fd, child_fd = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "100"}
    proc = subprocess.Popen([str(SCRIPT), *args], cwd=cwd, stdin=subprocess.DEVNULL, stdout=child_fd,
                            stderr=child_fd, env=env)
    os.close(child_fd)
    out = b""
    while True:
        ready, _, _ = select.select([main_fd], [], [], 30)
        if not ready:
            break
        try:
            chunk = os.read(main_fd, 65536)
        except OSError:  # the child closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main_fd)
    return proc.wait(timeout=60), out.decode(errors="replace")


def test_verify_shows_a_progress_bar_on_a_terminal_and_none_when_piped(tmp_path: Path) -> None:
    """On a terminal verify draws a bar on stderr; piped, its output is the report alone."""
    assert cli("demo", cwd=tmp_path).returncode == 0
    status, shown = _on_terminal(["verify"], tmp_path)
    assert status == 0
    assert "━" in shown and "43/43" in shown and "ok: 1 session, 43 events" in shown
    piped = cli("verify", cwd=tmp_path)
    assert piped.returncode == 0 and piped.stderr == "" and "━" not in piped.stdout
    assert piped.stdout.count("\n") == 1
