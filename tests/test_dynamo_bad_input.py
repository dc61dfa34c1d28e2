"""Bad input around the embedded Dynamo deployment: Dynamo not installed -> one line naming the install step; a
worker that fails to start -> its command and log tail; a busy port -> another free one."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.dynamo import DynamoSim, DynamoStartError, FrontendProcess

from pytest_ml4.runtime.installed import ToolMissing, dynamo_python
from pytest_ml4.target.model import load_target

AGG = load_target("gb300-agg")


def test_dynamo_not_installed_is_one_line_naming_the_step(pytester: pytest.Pytester, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ML4_TOOLS", str(tmp_path / "empty-tools"))
    pytester.makepyfile("def test_x(ml4_endpoint): pass")
    result = pytester.runpytest("--target", "gb300-agg", "--sim")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    errors = [line for line in result.errlines if "Dynamo" in line]
    assert len(errors) == 1 and "scripts/install.d/50-dynamo.sh" in errors[0], result.errlines


def test_busy_frontend_port_is_replaced_by_a_free_one(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        fe = FrontendProcess(AGG, Path("python"), tmp_path / "fe.log", {}, tmp_path, port=port)
        fe.port = fe.choose_port()   # what spawn() does first
        assert fe.port != port and f"--http-port {fe.port}" in " ".join(fe.argv())


def test_worker_that_fails_to_boot_reports_command_and_log_tail(tmp_path: Path) -> None:
    try:
        dynamo_python()
    except ToolMissing as err:
        pytest.skip(str(err))
    # 0.3 of GPU memory leaves no room for the KV cache (memory model): the engine never comes up.
    dsim = DynamoSim(AGG, log_file=tmp_path / "engine.log", agg_workers=1,
                     overrides={"engine": {"gpu_memory_utilization": 0.3}})
    try:
        with pytest.raises(DynamoStartError) as exc:
            dsim.start(timeout=60)
    finally:
        dsim.stop()  # a start that unexpectedly succeeds must not leave processes behind
    text = str(exc.value)
    assert "Dynamo worker worker #0 exited with code 1" in text
    assert "command: " in text and "-m pytest_ml4_sim.deploy.dynamo_worker_cli" in text and "gpu_memory_utilization" in text
    assert "No available memory for the cache blocks" in text, text  # the boot log's refusal line
    assert not dsim.frontend.alive() and not any(w.alive() for w in dsim.workers)
