"""The README: its two commands come first, its Python blocks run as written, its demo works."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import compactstore as cs

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), re.S)


def test_readme_starts_with_the_two_commands() -> None:
    """The first code block is `make demo` then `make test`, and `make demo` runs `compactstore demo`."""
    first = re.search(r"```(\w+)\n(.*?)```", README.read_text(), re.S)
    assert first is not None and first.group(1) == "sh"
    assert [line.split("#")[0].strip() for line in first.group(2).strip().splitlines()] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:.*\n\t\$\(VENV\)/bin/compactstore demo$", makefile, re.M)


def test_the_python_example_is_ten_lines_and_ends_in_the_promised_refusal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The example appends, compacts behind the gate, marks, resumes certified, and is refused on its last line."""
    example = _blocks("python")[0]
    code = [line for line in example.splitlines() if line.strip()]
    assert len(code) <= 11  # the import and ten lines
    monkeypatch.chdir(tmp_path)
    with pytest.raises(cs.ReconstructionUnsoundError, match="LOSSY_GIST"):
        exec(compile(example, "README.md", "exec"), {})
    assert capsys.readouterr().out == "certified\n"
    with cs.open("agent.db") as store:
        s = store.session("run-42")
        assert [r.kind for r in s.scan()] == ["turn", "tool_result", "binding", "obligation", "spill", "node", "marker"]
        assert store.verify().ok


def test_every_python_block_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Python block runs in a fresh folder; a last line marked `# raises X` must raise X."""
    for i, block in enumerate(_blocks("python")):
        folder = tmp_path / str(i)
        folder.mkdir()
        monkeypatch.chdir(folder)
        last = [line for line in block.splitlines() if line.strip()][-1]
        expected = re.search(r"# raises (\w+)", last)
        if expected:
            with pytest.raises(getattr(cs, expected.group(1))):
                exec(compile(block, f"README.md block {i}", "exec"), {})
        else:
            exec(compile(block, f"README.md block {i}", "exec"), {})


def test_the_readme_transcript_matches_the_demo(tmp_path: Path) -> None:
    """The commands the README shows after `make demo` print what it says they print."""
    script = Path(sys.executable).with_name("compactstore")
    subprocess.run([str(script), "demo"], cwd=tmp_path, check=True, capture_output=True)
    transcript = README.read_text().split("After `make demo`", 1)[1].split("```console\n", 1)[1].split("```", 1)[0]
    for command, output in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", transcript, re.M):
        done = subprocess.run(command.replace("compactstore", str(script)), shell=True, cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.stdout == output, command


def test_make_demo_runs_the_demo_and_leaves_exactly_one_store(tmp_path: Path) -> None:
    """What `make demo` runs tells the whole story and leaves one verified store, compactstore.db."""
    script = Path(sys.executable).with_name("compactstore")
    out = subprocess.run([str(script), "demo"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "marker refused: negative_facts" in out and "verify the copy: FAILED" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compactstore.db"]
    with cs.open(str(tmp_path / "compactstore.db")) as store:
        assert store.verify().ok
