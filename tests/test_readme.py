"""The README's Python blocks run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import compactstore as cs

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_quickstart_runs_and_ends_in_the_promised_refusal(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The quickstart block appends, prints a root, and is refused on its last line."""
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), re.S)
    assert blocks
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cs.InvalidEvent) as info:
        exec(compile(blocks[0], "README.md", "exec"), {})
    assert info.value.field == "args.rows"
    with cs.open("agent.db") as store:
        assert store.session("run-42").size == 2 and store.verify().ok


def test_readme_starts_with_the_two_commands() -> None:
    """The first code block is `make demo` then `make test`."""
    first = re.findall(r"```sh\n(.*?)```", README.read_text(), re.S)[0]
    assert [line.split("#")[0].strip() for line in first.strip().splitlines()] == ["make demo", "make test"]


def test_the_demo_runs_and_leaves_exactly_one_store(tmp_path: Path) -> None:
    """`make demo`'s script proves, catches the tampered copy, and leaves one verified store."""
    import subprocess
    import sys

    script = README.parent / "examples" / "quickstart.py"
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "verifies offline: True" in out and "tampered copy: verify ok=False" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo.db"]
    with cs.open(str(tmp_path / "demo.db")) as store:
        assert store.verify().ok
