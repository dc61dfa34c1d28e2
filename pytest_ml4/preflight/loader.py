"""Find config files under the given paths, parse them, and tie each document to the hardware it runs on.

The hardware comes from the deployment target (``targets/<name>.yaml``): given explicitly (``--target``), or
found because the target's ``manifests:`` list names the file, or named in the file by a
``# ml4-target: NAME`` comment (used by the fixtures).  Without a target a DGD's GPU family is read from
its ``nvidia.com/gpu.product`` node affinity; anything else stays "unknown hardware" and hardware-specific
rules do not judge it.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import yaml

from pytest_ml4.preflight.model import Document, HardwareInfo, relpath
from pytest_ml4.preflight.parsers import (
    comment_target,
    parse_shell,
    parse_systemd_unit,
    parse_yaml,
)
from pytest_ml4.target.model import Target, TargetError, known_targets, load_target

CONFIG_SUFFIXES = (".yaml", ".yml", ".service", ".sh", ".bash", ".cmd", ".conf")


def collect_files(paths: list[str | Path]) -> list[Path]:
    """Files to lint: given files as they are, directories searched recursively for config suffixes."""
    out: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*") if f.is_file() and f.suffix in CONFIG_SUFFIXES
                          and not any(part.startswith(".") for part in f.relative_to(p).parts))
        elif p.is_file():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such file or directory: {p}")
    return out


@lru_cache(maxsize=1)
def _manifest_index() -> dict[Path, str]:
    index: dict[Path, str] = {}
    for name in known_targets():
        try:
            target = load_target(name)
        except TargetError:
            continue
        for manifest in target.manifests:
            index[target.resolve(manifest).resolve()] = name
    return index


def target_for_file(path: Path, text: str) -> Target | None:
    name = _manifest_index().get(path.resolve()) or comment_target(text)
    return load_target(name) if name else None


def hardware_of(target: Target) -> HardwareInfo:
    hw = target.hardware
    return HardwareInfo(family=hw.family, memory_per_gpu_gib=hw.memory_per_gpu_gib, spec=hw,
                        origin=f"target {target.name}")


def parse_file(path: Path, text: str) -> list[Document]:
    shown = relpath(path)
    if path.suffix == ".service" or "[Service]" in text:
        return parse_systemd_unit(text, shown)
    if path.suffix in (".yaml", ".yml"):
        return parse_yaml(text, shown)
    return parse_shell(text, shown)


def load_file(path: Path, target: Target | None = None) -> list[Document]:
    """Documents of one file with target and hardware set; a file that cannot be read yields an error document."""
    shown = relpath(path)
    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as err:
        return [Document(path=shown, kind="unreadable", errors=[f"cannot read: {err}"])]
    try:
        chosen = target or target_for_file(path, text)
    except TargetError as err:
        return [Document(path=shown, kind="unmapped", errors=[str(err).splitlines()[0]])]
    try:
        docs = parse_file(path, text)
    except (yaml.YAMLError, ValueError) as err:
        return [Document(path=shown, kind="unparsable", errors=[f"cannot parse: {str(err).splitlines()[0]}"])]
    for doc in docs:
        doc.target = chosen
        if chosen is not None:
            doc.hardware = hardware_of(chosen)
    return docs


def load_paths(paths: list[str | Path], target: Target | None = None) -> list[Document]:
    docs: list[Document] = []
    for f in collect_files(paths):
        docs += load_file(f, target)
    return docs


__all__ = ["collect_files", "hardware_of", "known_targets", "load_file", "load_paths", "target_for_file"]
