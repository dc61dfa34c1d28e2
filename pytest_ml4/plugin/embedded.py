"""The plugin's one door to the embedded deployment (``--sim``), which is a distribution of its own.

``pytest-ml4-sim`` (``harness/``) holds the simulated engine and the launchers of the real LiteLLM proxy, Dynamo
frontend and workers and real vLLM. A platform team's live install carries none of it, so the plugin imports it
here and nowhere else (tests/test_harness_door.py), only when a run asks for the embedded deployment; without it
such a run ends with one line saying what to install. Each function below is the one thing a plugin module asks
of the harness. Type names come in under ``TYPE_CHECKING`` only.
"""

from __future__ import annotations

import importlib
import importlib.util
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from pytest_ml4_sim.deploy.dynamo import DynamoDeployment
    from pytest_ml4_sim.deploy.embedded import Deployment, Settings
    from pytest_ml4_sim.deploy.fake_k8s import FakeKubeAPI

    from pytest_ml4.target.model import Target

#: ``--sim-engine`` choices (the harness's ``deploy.embedded.ENGINES``; tests/test_plugin_options.py keeps them equal).
SIM_ENGINES = ("sim", "vllm")
INSTALL_HINT = "pip install 'pytest-ml4[sim]' ./harness from a checkout of pytest-ml4 (scripts/install.sh does it)"
HARNESS = "pytest_ml4_sim"
#: The options that only the embedded deployment reads: option dest -> (how the user wrote it, the values that ask
#: nothing of it: unset, or the bridge's default).
SIM_ONLY_OPTIONS: dict[str, tuple[str, tuple[Any, ...]]] = {
    "ml4_sim": ("--sim", (None,)),
    "ml4_sim_engine": ("--sim-engine", (None,)),
    "ml4_faults": ("--ml4-fault", (None, [])),
    "ml4_dynamo_bridge": ("--ml4-no-dynamo-bridge", (None, True)),
    "ml4_sim_timeout": ("--sim-start-timeout", (None,)),
    "ml4_proxy_retries": ("--ml4-proxy-retries", (None,)),
    "ml4_proxy_max_retries": ("--ml4-proxy-max-retries", (None,)),
}


class StartFailed(RuntimeError):
    """The embedded deployment did not start: the harness's one line (with the failing process's log tail)."""


def _not_installed(needed_by: str) -> pytest.UsageError:
    return pytest.UsageError(f"{needed_by} needs the embedded deployment (pytest-ml4-sim), which is not installed "
                             f"here: {INSTALL_HINT}")


def harness_module(name: str, needed_by: str = "--sim") -> ModuleType:
    """``pytest_ml4_sim.<name>``, or a usage error naming what needs it when the harness is not installed."""
    try:
        return importlib.import_module(f"pytest_ml4_sim.{name}")
    except ModuleNotFoundError as err:
        if not (err.name or "").startswith(HARNESS):
            raise
        raise _not_installed(needed_by) from None


def require_harness_for_options(config: pytest.Config, use_sim: bool) -> None:
    """On an install without the harness, the first ``--sim``-only option given (or ``--sim`` from the ini) is
    one usage error naming it, before anything else judges the options."""
    given = [flag for dest, (flag, unasked) in SIM_ONLY_OPTIONS.items() if config.getoption(dest, None) not in unasked]
    if use_sim and "--sim" not in given:
        given.insert(0, "--sim (ini ml4_sim)")
    if given and importlib.util.find_spec(HARNESS) is None:
        raise _not_installed(given[0])


@contextmanager
def _start_failures() -> Iterator[None]:
    """The harness's ``DeploymentFailed`` as :class:`StartFailed`: the plugin catches it without importing it."""
    failed = harness_module("deploy.embedded").DeploymentFailed
    try:
        yield
    except failed as err:
        raise StartFailed(str(err)) from None


def embedded_settings(**fields: Any) -> Settings:
    """The harness's ``deploy.embedded.Settings`` (how the deployment starts, beyond the target)."""
    return harness_module("deploy.embedded").Settings(**fields)


def start_embedded(target: Target, run_dir: Path, how: Settings) -> Deployment:
    """Start the deployment the target describes; :class:`StartFailed` (one line) when it does not."""
    with _start_failures():
        return harness_module("deploy.embedded").start(target, run_dir, how)


def attach_embedded(wire: Mapping[str, Any]) -> Deployment:
    """The xdist controller's deployment seen from a worker, from the description the controller sent."""
    embedded = harness_module("deploy.embedded")
    return embedded.attach(embedded.Description.from_wire(wire))


def start_own_dynamo(target: Target, log_file: Path, how: Settings) -> DynamoDeployment:
    """A simulated Dynamo deployment of this process's own (an xdist worker's restart suite); :class:`StartFailed`."""
    with _start_failures():
        return harness_module("deploy.embedded").start_own_dynamo(target, log_file, how)


def as_dynamo_deployment(engine: object) -> DynamoDeployment | None:
    """``engine`` when it is an embedded Dynamo deployment (simulated or real ``dynamo.vllm`` workers), else None."""
    return engine if isinstance(engine, harness_module("deploy.dynamo").DynamoDeployment) else None


def serve_fake_dynamo_api(deployment: DynamoDeployment, namespace: str, dgd: str) -> FakeKubeAPI:
    """The fake Kubernetes API serving ``deployment``'s processes as the pods of DGD ``dgd``, started."""
    return harness_module("deploy.fake_k8s").serve_dynamo(deployment, namespace, dgd)


def fake_kube_api() -> FakeKubeAPI:
    """An empty fake Kubernetes API (not started: a context manager)."""
    return harness_module("deploy.fake_k8s").FakeKubeAPI()


def tiny_model_overrides() -> dict[str, Any]:
    """The target fields ``--sim-engine vllm`` overrides to what the tiny CPU deployment really is."""
    return harness_module("deploy.real_vllm", "--sim-engine vllm").tiny_overrides()


def public_dynamo_version() -> str:
    """The public Dynamo release the embedded frontend runs (what ``--ml4-no-dynamo-bridge`` declares)."""
    return harness_module("sim.dynamo_bridge", "--ml4-no-dynamo-bridge").PUBLIC_VERSION


def real_vllm_scale_reason(nodeid: str) -> str | None:
    """Why the test ``nodeid`` needs Mistral Large 4's scale and skips on the tiny real-vLLM model, or None."""
    return harness_module("realvllm.model", "--sim-engine vllm").scale_check_reason(nodeid)
