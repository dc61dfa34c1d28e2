"""Where things are: the data the package reads at run time, the targets directory, a target's relative paths.

The package carries its run-time tables, its bundled targets and its stored baselines under ``pytest_ml4/data/``
(read through :mod:`importlib.resources`, so an installed copy finds them as a checkout does); ``fixtures/`` in a
checkout holds only the recordings and data the project's own tests read. A platform team keeps its own targets in
its own repository: the targets directory is the one given (``--target-dir`` / ini ``ml4_target_dir``), else the
``targets/`` folder of pytest's rootdir, else the package's bundled targets. Works without pytest; imports nothing
of the project, so every module may import it.
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

_PACKAGE = "pytest_ml4"


def _package_dir() -> Path:
    root = resources.files(_PACKAGE)
    # pip installs the package as files (the processes it starts are given these paths), never as a zip.
    if not isinstance(root, Path):
        raise RuntimeError(f"{_PACKAGE} is not installed as files ({root!r}); install it with pip")
    return root


#: The installed package's folder and its parent: the folder a child Python process needs on ``PYTHONPATH``.
PACKAGE_DIR = _package_dir()
PACKAGE_PARENT = PACKAGE_DIR.parent
#: The package's data root; the bundled targets, baselines and traces sit here as in a team's repository.
DATA_DIR = PACKAGE_DIR / "data"
BUNDLED_TARGETS_DIR = DATA_DIR / "targets"
TARGETS_FOLDER = "targets"
BASELINES_FOLDER = "baselines"
#: The suites an installed copy carries (``suites/`` of the checkout, installed as ``pytest_ml4/suites``).
BUNDLED_SUITES_DIR = PACKAGE_DIR / "suites"


def data_file(*parts: str) -> Path:
    """A file of the package's run-time data, e.g. ``data_file("dynamo", "versions.yaml")``."""
    return DATA_DIR.joinpath(*parts)


def targets_dir(given: str | Path | None = None, rootdir: Path | None = None) -> Path:
    """The directory target names are looked up in: ``given`` (relative to ``rootdir``), else ``rootdir``'s
    ``targets/`` when it has one, else the bundled targets."""
    if given:
        path = Path(given)
        return path if path.is_absolute() or rootdir is None else rootdir / path
    if rootdir is not None and (rootdir / TARGETS_FOLDER).is_dir():
        return rootdir / TARGETS_FOLDER
    return BUNDLED_TARGETS_DIR


def target_root(target_file: Path) -> Path:
    """The folder a target's relative paths start from: the one holding the ``targets/`` folder the file is in
    (``targets/variants/x.yaml`` too), else the file's own folder."""
    folder = target_file.resolve().parent
    for parent in (folder, *folder.parents):
        if parent.name == TARGETS_FOLDER:
            return parent.parent
    return folder


def resolve_from(root: Path, relpath: str | Path) -> Path:
    """``relpath`` under ``root`` when it is there, else under the package's data (a team's copy of a bundled
    target keeps reaching the bundled LiteLLM config and trace); absolute paths as given. A path in neither place
    is returned under ``root``, so an error names the team's path."""
    path = Path(relpath)
    if path.is_absolute():
        return path
    for base in (root, DATA_DIR):
        if (base / path).exists():
            return base / path
    return root / path


def baselines_dir(root: Path | None = None) -> Path:
    """Stored baselines: a team's ``baselines/`` beside its ``targets/`` (under ``root``, a target's
    :attr:`~pytest_ml4.targets.Target.root`), else the project's own (also when no root is given)."""
    own = None if root is None else root / BASELINES_FOLDER
    return own if own is not None and own.is_dir() else DATA_DIR / BASELINES_FOLDER
