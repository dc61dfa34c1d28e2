"""Every path the docs name exists in the checkout.

Read: README.md, docs/**/*.md and examples/**/*.md. Checked: backticked paths under the project's top folders
(`pytest_ml4/...`, `harness/...`, `suites/...`, ...), backticked dotted module names (`pytest_ml4.x.y`,
`pytest_ml4_sim.x.y`) and markdown links to local files. A `<...>` placeholder or a `*` in the text is a wildcard,
`{a,b}` names each of a and b. The failure lists file:line and the path that does not exist.
"""

from __future__ import annotations

import functools
import glob
import re
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: The top folders whose backticked paths are checked.
ROOTS = ("pytest_ml4", "harness", "suites", "tests", "scripts", "fixtures", "benchmarks", "docs", "targets", "examples")
#: Where a dotted module name lives: the core package at the root, the embedded deployment under harness/.
#: (`setup.py` ships `suites/` as `pytest_ml4.suites`.)
PACKAGES = {
    "pytest_ml4.suites": REPO / "suites",
    "pytest_ml4_sim": REPO / "harness" / "pytest_ml4_sim",
    "pytest_ml4": REPO / "pytest_ml4",
}

BACKTICKED = re.compile(r"`([^`\n]+)`")
PATH = re.compile(r"(?<![\w./-])((?:" + "|".join(ROOTS) + r")/(?:[^\s`'\"(),;{]|\{[^{}\s]*\})*)")
MODULE = re.compile(r"(?<![\w./-])((?:pytest_ml4_sim|pytest_ml4)(?:\.\w+)+)")
#: A module named by its file name alone (`endpoint.py`): some file of the checkout has that name.
BARE_MODULE = re.compile(r"(?<![\w./-])(\w+\.py)\b")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^\s*(```|~~~)")


def doc_files() -> list[Path]:
    files = [REPO / "README.md"]
    for folder in ("docs", "examples"):
        files += sorted((REPO / folder).rglob("*.md"))
    return files


@functools.cache
def file_names() -> frozenset[str]:
    return frozenset(path.name for path in REPO.rglob("*.py") if ".venv" not in path.parts)


def doc_lines(path: Path) -> Iterator[tuple[int, str]]:
    """The lines outside fenced code blocks (those hold commands and their output, not references)."""
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            yield number, line


def expand_braces(text: str) -> list[str]:
    match = re.search(r"\{([^{}]*,[^{}]*)\}", text)
    if not match:
        return [text]
    return [
        expanded
        for choice in match.group(1).split(",")
        for expanded in expand_braces(text[: match.start()] + choice + text[match.end() :])
    ]


def clean(reference: str) -> str:
    """The path part of a reference: no `::test` node id, `:line` suffix, `#anchor` or trailing punctuation."""
    reference = reference.split("::")[0].split("#")[0]
    reference = re.sub(r":[\d,-]*$", "", reference)
    return reference.rstrip(".:")


def exists(reference: str, base: Path) -> bool:
    for candidate in expand_braces(re.sub(r"<[^<>]*>", "*", reference)):
        for folder in (REPO, base):
            pattern = str(folder / candidate)
            if ("*" in candidate and glob.glob(pattern, recursive=True)) or Path(pattern).exists():
                return True
    return False


def module_exists(dotted: str) -> bool:
    """A dotted name resolves: packages and modules as files, then at most attributes of a module (or names a
    package's __init__ defines or imports)."""
    head = next(name for name in PACKAGES if dotted == name or dotted.startswith(name + "."))
    parts = dotted[len(head) + 1 :].split(".") if dotted != head else []
    where = PACKAGES[head]
    for index, part in enumerate(parts):
        if (where / part).is_dir():
            where = where / part
        elif (where / f"{part}.py").is_file():
            return True
        else:
            init = where / "__init__.py"
            # The root package exports nothing by name; a subpackage's __init__ may.
            return index > 0 and init.is_file() and re.search(rf"\b{re.escape(part)}\b", init.read_text()) is not None
    return True


def references(path: Path) -> Iterator[tuple[int, str, bool]]:
    """(line, reference, resolves) for each path, module and local link on the doc's lines."""
    for number, line in doc_lines(path):
        for span in BACKTICKED.findall(line):
            for reference in PATH.findall(span):
                reference = clean(reference)
                yield number, reference, exists(reference, path.parent)
            for dotted in MODULE.findall(span):
                yield number, dotted, module_exists(dotted)
            for name in BARE_MODULE.findall(span):
                yield number, name, name in file_names()
        for target in LINK.findall(BACKTICKED.sub("", line)):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue
            target = clean(target)
            yield number, target, exists(target, path.parent)


def test_every_doc_path_exists() -> None:
    missing = [
        f"{doc.relative_to(REPO)}:{line}: {reference}"
        for doc in doc_files()
        for line, reference, resolves in references(doc)
        if not resolves
    ]
    assert not missing, f"{len(missing)} doc references name nothing in the checkout:\n" + "\n".join(missing)


def test_the_checker_finds_a_missing_path(tmp_path: Path) -> None:
    doc = tmp_path / "page.md"
    doc.write_text(
        "See `pytest_ml4/target/model.py` and `pytest_ml4/targets.py`, `fixtures/killmatrix/<target>.yaml`,\n"
        "`pytest_ml4.target.model.load_target`, `pytest_ml4.targets`, [the guide](missing.md).\n"
        "```\nls pytest_ml4/nowhere.py\n```\n",
        encoding="utf-8",
    )
    found = [(line, reference) for line, reference, resolves in references(doc) if not resolves]
    assert found == [(1, "pytest_ml4/targets.py"), (2, "pytest_ml4.targets"), (2, "missing.md")]


def test_each_decisions_file_is_one_topic_and_indexed() -> None:
    """`docs/decisions/<topic>.md` starts `# Decisions: <topic>`, holds `## <title>` sections only, and the map's
    index links it (a topic file nobody can find from ARCHITECTURE.md is lost)."""
    index = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8")
    problems = []
    for path in sorted((REPO / "docs" / "decisions").glob("*.md")):
        lines = path.read_text(encoding="utf-8").splitlines()
        name = path.relative_to(REPO)
        if not lines or lines[0] != f"# Decisions: {path.stem}":
            problems.append(f"{name}:1: first line must be '# Decisions: {path.stem}'")
        problems += [
            f"{name}:{number}: a decision is a '## <title>' section, not {line.split()[0]!r}"
            for number, line in doc_lines(path)
            if number > 1 and re.match(r"#(?!# )#*\s", line)
        ]
        if f"](decisions/{path.name})" not in index:
            problems.append(f"{name}: not in docs/ARCHITECTURE.md's index")
    assert not problems, "\n".join(problems)


def test_the_map_stays_one_page() -> None:
    """ARCHITECTURE.md is the map a maintainer reads first; contracts and decisions have files of their own."""
    lines = (REPO / "docs" / "ARCHITECTURE.md").read_text(encoding="utf-8").count("\n")
    assert lines < 250, f"docs/ARCHITECTURE.md has {lines} lines (under 250): move detail to docs/contracts.md or docs/decisions/"
