"""The plugin's one door to the embedded deployment (``--sim``), which is a distribution of its own.

``pytest-ml4-sim`` (``harness/``) holds the simulated engine and the launchers of the real LiteLLM proxy, Dynamo
frontend and workers and real vLLM. A platform team's live install carries none of it, so the plugin imports it
here, only when a run asks for the embedded deployment; without it such a run ends with one line saying what to
install. Type names come in under ``TYPE_CHECKING`` only.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

#: ``--sim-engine`` choices (the harness's ``deploy.embedded.ENGINES``; tests/test_plugin_options.py keeps them equal).
SIM_ENGINES = ("sim", "vllm")
INSTALL_HINT = "pip install 'pytest-ml4[sim]' ./harness from a checkout of pytest-ml4 (scripts/install.sh does it)"


def harness_module(name: str, needed_by: str = "--sim") -> ModuleType:
    """``pytest_ml4_sim.<name>``, or a usage error naming what needs it when the harness is not installed."""
    try:
        return importlib.import_module(f"pytest_ml4_sim.{name}")
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith("pytest_ml4_sim"):
            raise
        raise pytest.UsageError(f"{needed_by} needs the embedded deployment (pytest-ml4-sim), which is not "
                                f"installed here: {INSTALL_HINT}") from None
