"""The ``ml4`` option group and the one way to read an option: the only place the group is created.

Every plugin module adds its options through :func:`group`; every module reads them through :func:`opt` (the
command line, else its ini twin) or :func:`int_opt`. Not a pytest plugin itself (nothing to register), so the
plugin's core can import it before pytest loads the plugin modules, which are rewritten for assertions on import.
"""

from __future__ import annotations

from typing import Any

import pytest

GROUP = "ml4"
GROUP_TITLE = "pytest-ml4: Mistral Large 4 deployment acceptance"


def group(parser: pytest.Parser) -> pytest.OptionGroup:
    """The ``ml4`` option group (created by whichever module asks first, always with its title)."""
    return parser.getgroup(GROUP, GROUP_TITLE)


def opt(config: pytest.Config, name: str, ini: str | None = None) -> Any:
    """The option's value, else its ini twin's; an empty value (``""``, ``[]``) counts as unset."""
    value = config.getoption(name)
    if (value is None or value == []) and ini is not None:
        value = config.getini(ini)
    return value if value not in ("", []) else None


def int_opt(config: pytest.Config, name: str) -> int | None:
    """An int option whose ini twin has the same name (None when neither is set)."""
    value = opt(config, name, name)
    return int(value) if value is not None else None


