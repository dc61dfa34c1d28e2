"""Scan files for leaked secrets: a run's Allure results, JUnit XML, console logs, the generated HTML.

Text files are searched as they are; JSON is also searched after decoding (a key escaped as ``\\u002d`` or
split by JSON escaping would otherwise slip through), and base64 blobs embedded in a single-file Allure report
are decoded and searched too.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from pytest_ml4.report.redact import DEFAULT, Leak, Redactor

_B64_RE = re.compile(r"'([A-Za-z0-9+/]{40,}={0,2})'")
_BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".webp", ".woff", ".woff2", ".ttf", ".ico"}


@dataclass(frozen=True)
class FileLeak:
    """A leak and the file (and embedded part) it was found in."""

    path: Path
    where: str
    leak: Leak

    def __str__(self) -> str:
        return f"{self.path} [{self.where}]: {self.leak.kind} at {self.leak.start}: {self.leak.context}"


def scan_text(text: str, path: Path, redactor: Redactor = DEFAULT, where: str = "text") -> list[FileLeak]:
    """Leaks in one text, including its JSON-decoded form and embedded base64 blobs."""
    found = [FileLeak(path, where, leak) for leak in redactor.find_leaks(text)]
    if path.suffix == ".json":
        try:
            decoded = json.dumps(json.loads(text), ensure_ascii=False)
            found += [FileLeak(path, "json-decoded", leak) for leak in redactor.find_leaks(decoded)]
        except ValueError:
            pass
    for m in _B64_RE.finditer(text):
        try:
            blob = base64.b64decode(m.group(1), validate=True).decode("utf-8")
        except (binascii.Error, UnicodeDecodeError):
            continue
        found += [FileLeak(path, f"base64 at {m.start()}", leak) for leak in redactor.find_leaks(blob)]
    return found


def scan_paths(paths: Iterable[Path], redactor: Redactor = DEFAULT) -> list[FileLeak]:
    """Leaks in the given files and, recursively, in the files of the given folders."""
    found: list[FileLeak] = []
    for root in paths:
        files = sorted(p for p in root.rglob("*") if p.is_file()) if root.is_dir() else [root]
        for path in files:
            if path.suffix.lower() in _BINARY_SUFFIXES:
                continue
            text = path.read_bytes().decode("utf-8", errors="replace")
            found += scan_text(text, path, redactor)
    return found
