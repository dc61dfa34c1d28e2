"""Where things are: the data the package reads at run time, the targets directory, a target's relative paths.

The package carries its run-time tables, its bundled targets and its stored baselines under ``pytest_ml4/data/``
(read through :mod:`importlib.resources`, so an installed copy finds them as a checkout does); ``fixtures/`` in a
checkout holds only the recordings and data the project's own tests read. A platform team keeps its own targets in
its own repository: the targets directory is the one given (``--target-dir`` relative to the current directory,
ini ``ml4_target_dir`` relative to the ini file's folder), else the ``targets/`` folder of pytest's rootdir, else
the package's bundled targets. The suites the package carries are found through the import system
(:func:`suites_dir`), so a pip install, a wheel and an editable install find them alike. Works without pytest;
imports nothing of the project, so every module may import it.
"""

from __future__ import annotations

import importlib.util
from importlib import resources
from pathlib import Path

_PACKAGE = "pytest_ml4"
#: The checkout's ``suites/`` as the package ships it (``setup.py``'s ``package_dir``).
SUITES_PACKAGE = f"{_PACKAGE}.suites"


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


def suites_dir() -> Path | None:
    """The folder of the suites the imported package carries, or None when there is none.

    Asked of the import system, not derived from ``PACKAGE_DIR``: a pip install or a wheel puts them at
    ``pytest_ml4/suites``, but an editable install (``pip install -e``, what ``scripts/install.sh`` makes) leaves
    them at the checkout's ``suites/`` and maps the name there with its finder. A source tree imported through
    ``PYTHONPATH`` with no install at all has no such mapping: there ``setup.py`` sits beside the package and says
    ``suites/`` is the folder.
    """
    spec = importlib.util.find_spec(SUITES_PACKAGE)
    found = [Path(p) for p in (spec.submodule_search_locations or [])] if spec is not None else []
    if not found and (PACKAGE_PARENT / "setup.py").is_file():
        found = [PACKAGE_PARENT / "suites"]
    return next((p for p in found if p.is_dir()), None)


def data_file(*parts: str) -> Path:
    """A file of the package's run-time data, e.g. ``data_file("dynamo", "versions.yaml")``."""
    return DATA_DIR.joinpath(*parts)


def targets_dir(given: str | Path | None = None, rootdir: Path | None = None, relative_to: Path | None = None) -> Path:
    """The directory target names are looked up in: ``given`` (relative to ``relative_to``: the current directory
    for ``--target-dir``, the ini file's folder for ``ml4_target_dir``), else ``rootdir``'s ``targets/`` when it
    has one, else the bundled targets."""
    if given:
        path = Path(given)
        return path if path.is_absolute() or relative_to is None else relative_to / path
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
    :attr:`~pytest_ml4.target.model.Target.root`), else the project's own (also when no root is given)."""
    own = None if root is None else root / BASELINES_FOLDER
    return own if own is not None and own.is_dir() else DATA_DIR / BASELINES_FOLDER
