"""What the plugin modules share: the session state's stash key and option readers.

``plugin.py`` builds the state; ``plugin_*.py`` read it. Both import this module, neither imports the other, so
there is no import circle between ``plugin.py`` and ``plugin_restart.py`` (which both need ``int_opt``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_ml4.guard import Deadlines, parse_deadlines

if TYPE_CHECKING:  # the class lives in plugin.py; only its name is needed here
    from pytest_ml4.plugin import Ml4State

STATE_KEY = pytest.StashKey["Ml4State"]()


def get_state(config: pytest.Config) -> Ml4State:
    """The session's ml4 state (built by ``plugin.py``'s ``pytest_configure``)."""
    return config.stash[STATE_KEY]


def simulator_answers(config: pytest.Config, endpoint: object) -> bool:
    """True when the project's simulated engine answers this run (``--sim`` with ``--sim-engine sim``): the only
    runs a simulator-made baseline may judge. Real vLLM or real ``dynamo.vllm`` under ``--sim`` is another engine,
    judged like a live deployment."""
    return bool(getattr(endpoint, "simulated", False)) and get_state(config).sim_engine == "sim"


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


def session_deadlines(config: pytest.Config, target: Any) -> Deadlines:
    """The target's derived deadlines with those the option or ini (``--ml4-deadlines``) sets."""
    return Deadlines.for_target(target).overriding(**parse_deadlines(opt(config, "ml4_deadlines", "ml4_deadlines")))
