"""What the plugin modules share: the session state's stash key and option readers.

``plugin.py`` builds the state; ``plugin_*.py`` read it. Both import this module, neither imports the other, so
there is no import circle between ``plugin.py`` and ``plugin_restart.py`` (which both need ``int_opt``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:  # the class lives in plugin.py; only its name is needed here
    from pytest_ml4.plugin import Ml4State

STATE_KEY = pytest.StashKey["Ml4State"]()


def get_state(config: pytest.Config) -> Ml4State:
    """The session's ml4 state (built by ``plugin.py``'s ``pytest_configure``)."""
    return config.stash[STATE_KEY]


def opt(config: pytest.Config, name: str, ini: str | None = None) -> Any:
    """The option's value, else its ini twin's."""
    value = config.getoption(name)
    if value is None and ini is not None:
        value = config.getini(ini)
    return value


def int_opt(config: pytest.Config, name: str) -> int | None:
    """An int option whose ini twin has the same name (None when neither is set)."""
    value = config.getoption(name)
    if value is None:
        raw = config.getini(name)
        value = int(raw) if raw not in (None, "") else None
    return value
