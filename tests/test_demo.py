"""`compactstore demo`: the story it plays, its determinism, and the one store it leaves behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

import compactstore as cs
from compactstore import demo
from compactstore.cli import main


def _run(cwd: Path, *args: str) -> tuple[int, str, str]:
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(cwd)
        result = CliRunner().invoke(main, ["demo", *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_demo_tells_the_story_and_leaves_one_verified_store(tmp_path: Path) -> None:
    """Every beat of the story is printed, and exactly one store, which verifies, is left in the folder."""
    code, out, _ = _run(tmp_path)
    assert code == 0
    for beat in (
        "refused: obligation 'finish-migration' (pos 16) needs non-regenerable binding 'rollback' bound at pos 14",
        "'rollback' spilled to spill:29",
        "L2 node 32 digests both",
        "marker 33 -> L2 node 32: certified (closure, negative_facts, anchoring)",
        "resume 33: certified; 1 summary node stands for 29 raw events",
        "marker refused: negative_facts at pos 36: rejected item dropped",
        "a raw-checkpoint marker 42 is always safe: resume gives fallback",
        "authorize from it: refused: operation 'authorize' needs restoration, but the artifact is LOSSY_GIST",
        "audit: binding 'snapshot' (pos 15) was compacted away by node 30",
        "verify the copy: FAILED",
        "resume 33 on the copy: refused",
        "verify compactstore.db itself: ok, 43 events",
    ):
        assert beat in out, beat
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compactstore.db"]
    with cs.open(str(tmp_path / "compactstore.db")) as store:
        assert store.sessions() == ["migration-42"] and store.verify().ok


def test_the_demo_prints_the_same_digests_on_every_run(tmp_path: Path) -> None:
    """Two runs in two folders print identical stories; a rerun replaces the demo's own store."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = _run(tmp_path / "a")[1], _run(tmp_path / "b")[1]
    assert first == second and "digest b110d48ad92a04d6" in first
    again = _run(tmp_path / "a")
    assert again[0] == 0 and again[1] == first
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["compactstore.db"]


def test_the_demo_refuses_to_replace_a_store_it_did_not_write(tmp_path: Path) -> None:
    """A compactstore.db with other sessions, or a file that is no store, is left alone: exit 2."""
    with cs.open(str(tmp_path / "compactstore.db")) as store:
        store.session("mine").append(cs.Turn("user", "keep me"))
    code, _, err = _run(tmp_path)
    assert code == 2 and "holds sessions the demo did not write (mine)" in err
    with cs.open(str(tmp_path / "compactstore.db")) as store:
        assert store.sessions() == ["mine"]
    other = tmp_path / "notes.txt"
    other.write_text("not a store")
    code, _, err = _run(tmp_path, "--store", str(other))
    assert code == 2 and "is not a compactstore store" in err and other.read_text() == "not a store"
    assert _run(tmp_path, "--store", "postgresql://x/y")[0] == 2


def test_the_demo_reports_json(tmp_path: Path) -> None:
    """With --json the demo prints its results as one JSON document."""
    code, out, _ = _run(tmp_path, "--json", "--store", "d.db")
    assert code == 0
    data = json.loads(out)
    assert data["certified"]["mode"] == "certified" and data["fallback"]["mode"] == "fallback"
    assert data["tampered"]["ok"] is False and data["verified"] is True and data["size"] == 43


def test_the_story_runs_from_python(tmp_path: Path) -> None:
    """`compactstore.demo.run` plays the same story, printing through the callable it is given."""
    lines: list[tuple[str, str | None]] = []
    result = demo.run(str(tmp_path / "x.db"), lambda text, style=None: lines.append((text, style)))
    assert result["root"] and any(style == "bad" for _, style in lines)
    assert lines[0] == ("compactstore demo: a coding agent makes a schema migration reversible", "title")
