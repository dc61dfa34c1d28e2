"""The deployment interface without starting anything: what travels to xdist workers survives the trip, an attached
view owns nothing, and no module of the suite or of the embedded deployment but ``pytest_ml4/runtime/processes.py``
starts a process."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from pytest_ml4_sim import HARNESS_PARENT
from pytest_ml4_sim.deploy.embedded import Description, ProxyView, attach

import pytest_ml4

PKG = Path(pytest_ml4.__file__).parent
PACKAGES = (PKG, HARNESS_PARENT / "pytest_ml4_sim")
#: The calls that start a process; only pytest_ml4/runtime/processes.py may make them.
STARTERS = {("subprocess", "run"), ("subprocess", "Popen"), ("subprocess", "call"), ("subprocess", "check_call"),
            ("subprocess", "check_output"), ("os", "system"), ("os", "popen"), ("asyncio", "create_subprocess_exec"),
            ("asyncio", "create_subprocess_shell")}


def _description() -> Description:
    return Description(url="http://127.0.0.1:8000", base_url="http://127.0.0.1:8000/v1", log_file="/tmp/e.log",
                       pid=4242, dynamo={"frontend": {"pid": 1}}, worker_metrics_urls={"decode": ("http://w/m",)},
                       proxy=ProxyView("http://127.0.0.1:4000", "http://127.0.0.1:4000/v1", 4343, 2))


def test_a_description_survives_the_trip_to_an_xdist_worker() -> None:
    info = _description()
    wire = json.loads(json.dumps(info.to_wire()))  # execnet carries plain data only
    assert Description.from_wire(wire) == info
    assert info.front_url == "http://127.0.0.1:4000"


def test_an_attached_deployment_owns_nothing() -> None:
    deployment = attach(_description())
    assert not deployment.owned
    assert (deployment.engine.base_url, deployment.engine.pid) == ("http://127.0.0.1:8000/v1", 4242)
    assert deployment.engine.worker_metrics_urls == {"decode": ("http://w/m",)}
    assert deployment.proxy is not None and deployment.proxy.base_url == "http://127.0.0.1:4000/v1"
    deployment.stop()  # a worker's stop must not end the controller's processes: nothing to stop, no error
    assert deployment.engine is not None


def _process_starts(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and (node.func.value.id, node.func.attr) in STARTERS):
            found.append(f"{path}:{node.lineno} {node.func.value.id}.{node.func.attr}")
    return found


def test_only_runtime_processes_starts_a_process() -> None:
    allowed = PKG / "runtime" / "processes.py"
    assert _process_starts(allowed), f"{allowed} starts no process: the walk would find none anywhere"
    starts = [s for package in PACKAGES for p in sorted(package.rglob("*.py")) if p != allowed
              for s in _process_starts(p)]
    assert not starts, f"processes started outside pytest_ml4/runtime/processes.py: {starts}"
