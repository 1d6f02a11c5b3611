"""The copy of the Agents SDK's session tests is the SDK's, unchanged below each file's header."""

from __future__ import annotations

import hashlib
from pathlib import Path

from copy_sdk_tests import DEST, FILES, copied_version, header


def test_each_copied_file_is_its_header_and_the_bytes_the_sdk_ships() -> None:
    """Every listed file starts with its header; the rest has the SHA-256 that SHA256SUMS recorded from the sdist."""
    lines = (DEST / "SHA256SUMS").read_text(encoding="utf-8").splitlines()
    version = copied_version()
    sums = {path: digest for digest, path in (line.split("  ", 1) for line in lines[1:])}
    assert sorted(sums) == sorted(FILES)
    for path in FILES:
        data = (DEST / path).read_bytes()
        head = header(version, path)
        assert data.startswith(head), path
        assert hashlib.sha256(data[len(head):]).hexdigest() == sums[path], path


def test_the_copy_holds_the_sdk_s_licence_and_nothing_unlisted() -> None:
    """The SDK's MIT licence is beside the files, and every .py file in the copy is one the script copies."""
    licence = (DEST / "LICENSE").read_text(encoding="utf-8")
    assert licence.startswith("MIT License") and "OpenAI" in licence
    present = sorted(str(p.relative_to(DEST)) for p in DEST.rglob("*.py"))
    assert present == sorted(FILES)
