"""Copy the OpenAI Agents SDK's session tests from its source distribution into tests/agents_sdk/tests/.

    python tests/agents_sdk/copy_sdk_tests.py /path/to/openai_agents-0.24.0.tar.gz

The source distribution (``pip download --no-deps --no-binary :all: openai-agents==<version>``)
carries the SDK's ``tests/``; only the files in :data:`FILES` are copied: the session tests
and what they import. Each ``.py`` file is copied byte for byte below a header naming its
origin and licence; ``SHA256SUMS`` records the digest of each file as the SDK ships it, which
``test_sdk_copy.py`` holds the copies to. The SDK is MIT-licensed; its LICENSE is copied
beside the files.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tarfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEST = HERE / "tests"
#: The SDK's files copied, as paths inside its ``tests/``: the session tests, then their imports.
FILES = (
    "memory/test_session.py",
    "memory/test_session_limit.py",
    "memory/test_compaction_model_visibility.py",
    "__init__.py",
    "conftest.py",
    "testing_processor.py",
    "test_responses.py",
    "model_test_helpers.py",
    "utils/simple_session.py",
)
HEADER = (
    "# From openai-agents {version} (https://github.com/openai/openai-agents-python), tests/{path},\n"
    "# copied unchanged below these three lines by tests/agents_sdk/copy_sdk_tests.py.\n"
    "# Copyright (c) 2025 OpenAI. MIT License: see LICENSE in this directory.\n"
)


def copied_version() -> str:
    """Return the SDK version the copy is of, as ``SHA256SUMS`` records it."""
    first = (DEST / "SHA256SUMS").read_text(encoding="utf-8").splitlines()[0]
    return first.removeprefix("# openai-agents ")


def header(version: str, path: str) -> bytes:
    """Return the header a copied ``.py`` file starts with."""
    return HEADER.format(version=version, path=path).encode()


def main(sdist: Path) -> None:
    """Copy :data:`FILES` and the LICENSE out of ``sdist`` and write ``SHA256SUMS``."""
    match = re.fullmatch(r"openai_agents-(.+)\.tar\.gz", sdist.name)
    if match is None:
        raise SystemExit(f"{sdist}: want an openai_agents-<version>.tar.gz source distribution")
    version = match.group(1)
    root = f"openai_agents-{version}/"
    sums = []
    with tarfile.open(sdist) as tar:
        def read(name: str) -> bytes:
            member = tar.extractfile(root + name)
            if member is None:
                raise SystemExit(f"{sdist}: no {name}")
            return member.read()

        (DEST / "LICENSE").parent.mkdir(parents=True, exist_ok=True)
        (DEST / "LICENSE").write_bytes(read("LICENSE"))
        for path in FILES:
            body = read("tests/" + path)
            target = DEST / path
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(header(version, path) + body)
            sums.append(f"{hashlib.sha256(body).hexdigest()}  {path}\n")
    (DEST / "SHA256SUMS").write_text(f"# openai-agents {version}\n" + "".join(sums), encoding="utf-8")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit(__doc__)
    main(Path(sys.argv[1]))
