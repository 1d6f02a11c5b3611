"""The README and docs/: two commands first, every Python block runs, the transcripts hold, every link resolves."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

import compactstore as cs

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
CLI = ROOT / "docs" / "cli.md"
#: Every document a reader is pointed to: the README, docs/, and the pages beside them.
DOCUMENTS = [README, *sorted((ROOT / "docs").glob("*.md")), ROOT / "RELIABILITY.md", ROOT / "benchmarks" / "README.md"]
#: Hex runs this long are digests and roots; where events carry the time they differ run to run.
DIGEST = re.compile(r"[0-9a-f]{16,}")


def _blocks(language: str, path: Path = README) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def _python_blocks() -> list[tuple[str, int, str]]:
    """Return ``(document, index, code)`` of every Python block of the README and docs/."""
    return [(path.relative_to(ROOT).as_posix(), i, block)
            for path in DOCUMENTS for i, block in enumerate(_blocks("python", path))]


def test_readme_starts_with_the_two_commands() -> None:
    """The first code block is `make demo` then `make test`, and `make demo` runs `compactstore demo`."""
    first = re.search(r"```(\w+)\n(.*?)```", README.read_text(), re.S)
    assert first is not None and first.group(1) == "sh"
    assert [line.split("#")[0].strip() for line in first.group(2).strip().splitlines()] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^demo:.*\n\t\$\(VENV\)/bin/compactstore demo$", makefile, re.M)


def test_the_readme_is_at_most_200_lines() -> None:
    """The README is read in ten minutes; the rest is in docs/."""
    assert len(README.read_text(encoding="utf-8").splitlines()) <= 200


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


def fake_openai() -> types.ModuleType:
    """Return a stand-in for the ``openai`` package: clients whose ``responses.create`` answers without a network.

    The answer is the tail of the prompt, longer than a summary may be, so a recipe's cut is exercised.
    """
    module = types.ModuleType("openai")

    class APIError(Exception):
        """The client's error base."""

    class Reply:
        def __init__(self, prompt: str) -> None:
            self.output_text = prompt[-2500:]

    class Responses:
        def create(self, *, model: str, input: str, **kwargs: Any) -> Reply:  # noqa: A002
            return Reply(input)

    class AsyncResponses:
        async def create(self, *, model: str, input: str, **kwargs: Any) -> Reply:  # noqa: A002
            return Reply(input)

    class OpenAI:
        def __init__(self) -> None:
            self.responses = Responses()

    class AsyncOpenAI:
        def __init__(self) -> None:
            self.responses = AsyncResponses()

    module.APIError, module.OpenAI, module.AsyncOpenAI = APIError, OpenAI, AsyncOpenAI  # type: ignore[attr-defined]
    return module


PYTHON_BLOCKS = _python_blocks()


@pytest.mark.parametrize(("document", "index", "block"), PYTHON_BLOCKS, ids=[f"{d}:{i}" for d, i, _ in PYTHON_BLOCKS])
def test_every_python_block_runs(document: str, index: int, block: str, tmp_path: Path,
                                 monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Each Python block of the README and docs/ runs in a fresh folder and prints what its comments say.

    A last line marked `# raises X` must raise X. Each `print(...)  # text` prints a line
    that starts with the text up to its first ": " or " (". A block that imports the
    OpenAI client gets a stand-in with no network.
    """
    monkeypatch.chdir(tmp_path)
    if re.search(r"^from openai import .*OpenAI", block, re.M):
        monkeypatch.setitem(sys.modules, "openai", fake_openai())
    last = [line for line in block.splitlines() if line.strip()][-1]
    expected = re.search(r"# raises (\w+)", last)
    code = compile(block, f"{document} block {index}", "exec")
    if expected:
        error = getattr(cs, expected.group(1), None) or getattr(cs.errors, expected.group(1))
        with pytest.raises(error):
            exec(code, {"__name__": "__main__"})
    else:
        exec(code, {"__name__": "__main__"})
    said = [re.split(r": | \(", c)[0] for c in re.findall(r"^\s*print\(.*\)\s+# (.*)$", block, re.M)]
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(said) and all(p.startswith(w) for p, w in zip(printed, said)), (printed, said)


def _transcript(document: Path, after: str) -> str:
    """Return the first console block of ``document`` after the text ``after``."""
    return document.read_text(encoding="utf-8").split(after, 1)[1].split("```console\n", 1)[1].split("```", 1)[0]


def _replay(transcript: str, folder: Path, *, digests: bool) -> None:
    """Run each ``$ command`` of ``transcript`` in ``folder`` and compare what it prints (stdout and stderr).

    ``$ cat FILE`` writes FILE from its output first. ``digests``: compare hex digests
    too; else each is compared as a placeholder.
    """
    script = Path(sys.executable).with_name("compactstore")
    for command, output in re.findall(r"^\$ (.*)\n((?:(?!\$ ).*\n)*)", transcript, re.M):
        if command.startswith("cat "):
            (folder / command.split()[1]).write_text(output, encoding="utf-8")
        done = subprocess.run(command.replace("compactstore", str(script)), shell=True, cwd=folder,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        got, want = (done.stdout, output) if digests else (DIGEST.sub("…", done.stdout), DIGEST.sub("…", output))
        assert got == want, command


@pytest.mark.parametrize("document", [README, CLI], ids=["README.md", "docs/cli.md"])
def test_the_transcript_after_the_demo_prints_what_it_says(document: Path, tmp_path: Path) -> None:
    """The commands the README and docs/cli.md show after `make demo` print what they say they print."""
    script = Path(sys.executable).with_name("compactstore")
    subprocess.run([str(script), "demo"], cwd=tmp_path, check=True, capture_output=True)
    _replay(_transcript(document, "After `make demo`"), tmp_path, digests=True)


def test_the_transcript_of_your_own_events_prints_what_it_says(tmp_path: Path) -> None:
    """docs/cli.md's JSON Lines session appends, is refused by the gate, spills, marks and refuses an unknown kind."""
    _replay(_transcript(CLI, "## Your own events"), tmp_path, digests=False)


def test_make_demo_runs_the_demo_and_leaves_exactly_one_store(tmp_path: Path) -> None:
    """What `make demo` runs tells the whole story and leaves one verified store, compactstore.db."""
    script = Path(sys.executable).with_name("compactstore")
    out = subprocess.run([str(script), "demo"], cwd=tmp_path, capture_output=True, text=True, check=True).stdout
    assert "marker refused: negative_facts" in out and "verify the copy: FAILED" in out
    assert sorted(p.name for p in tmp_path.iterdir()) == ["compactstore.db"]
    with cs.open(str(tmp_path / "compactstore.db")) as store:
        assert store.verify().ok


def test_every_link_in_the_docs_resolves() -> None:
    """Each relative link of the README and docs/ names a file of the repository (and its anchor a heading there)."""
    broken = []
    for document in DOCUMENTS:
        for target in re.findall(r"\]\(([^)\s]+)\)", document.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            file = (document.parent / path).resolve() if path else document
            if not file.exists():
                broken.append(f"{document.relative_to(ROOT)}: {target}")
            elif anchor and file.suffix == ".md":
                headings = re.findall(r"^#+ (.*)$", file.read_text(encoding="utf-8"), re.M)
                slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
                if anchor not in slugs:
                    broken.append(f"{document.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


def test_the_benchmarks_page_is_one_run_written_by_run_all() -> None:
    """benchmarks/README.md is what `make bench` writes: run_all's introduction, then one table of goals and commands."""
    spec = importlib.util.spec_from_file_location("run_all", ROOT / "benchmarks" / "run_all.py")
    assert spec is not None and spec.loader is not None
    run_all = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(run_all)
    text = (ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8")
    assert text.startswith(run_all.INTRO)
    tables = re.findall(r"^\| --- ", text, re.M)
    rows = re.findall(r"^\| (`python benchmarks/\w+\.py[^`]*`)? \| .+ \| .+ \| [<>]= .+ \| (met|\*\*missed\*\*) \|$", text, re.M)
    assert len(tables) == 1 and len(rows) >= 20
    assert "checkout" not in text
