"""pytest glue for the logs concern: the engine-log reader fixtures and the ``--ml4-log-file`` option.

* ``ml4_logs`` (session): the :class:`~pytest_ml4.logs.LogReader` of the target's engine: the simulator's log file
  under ``--sim``, else the target's ``logs`` section (journald locally or over ssh via ``ssh_host_env``,
  Kubernetes), or the file given with ``--ml4-log-file`` (a saved journal/pod log, read instead).
* ``ml4_boot_log`` (function): a fresh :class:`~pytest_ml4.logs.LogView` of the lines since the engine's last boot.
* ``ml4_attach_log`` (function): attaches judged log lines to the test's report (Allure) and returns the text.
* ``ml4_session_start`` (session): epoch seconds when the session started, for "during the session" windows.
* ``log_reader_if_any(request)``: ``ml4_logs`` where the run has a log, else None (the log as a better witness).

The core lives in :mod:`pytest_ml4.logs`; nothing here decides a verdict.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from pytest_ml4.logs import (
    FileLogReader,
    LogEvent,
    LogReader,
    LogView,
    reader_for_target,
)
from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.target.model import Target

if TYPE_CHECKING:  # annotations only: the fixtures import what they start lazily
    from pytest_ml4_sim.deploy.launcher import Engine



def pytest_addoption(parser: pytest.Parser) -> None:
    group = ml4_group(parser)
    group.addoption("--ml4-log-file", dest="ml4_log_file", default=None, metavar="PATH",
                    help="read the engine log from this file instead of the target's journald/Kubernetes source "
                         "(e.g. a saved 'journalctl -u UNIT' or 'kubectl logs' output) (ini: ml4_log_file)")
    parser.addini("ml4_log_file", "engine log file to read instead of the target's log source", default=None)


@pytest.fixture(scope="session")
def ml4_logs(pytestconfig: pytest.Config, ml4_target: Target, ml4_sim: Engine | None) -> LogReader:
    """Reader of the engine log (simulator log file, journald, Kubernetes, or --ml4-log-file)."""
    path = pytestconfig.getoption("ml4_log_file") or pytestconfig.getini("ml4_log_file")
    if path:
        return FileLogReader(path)
    return reader_for_target(ml4_target, sim=ml4_sim)


_SESSION_START = pytest.StashKey[float]()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_SESSION_START] = time.time()


@pytest.fixture(scope="session")
def ml4_session_start(pytestconfig: pytest.Config) -> float:
    """When this pytest session started (epoch seconds): checks "during the session" read log lines from here."""
    return pytestconfig.stash.get(_SESSION_START, time.time())


def log_reader_if_any(request: pytest.FixtureRequest) -> LogReader | None:
    """The engine log reader where the run has one, else None (no log configured for a live target): for a check
    to which the log is a better witness, not a precondition."""
    try:
        return request.getfixturevalue("ml4_logs")
    except (Exception, pytest.skip.Exception):  # noqa: BLE001 - no log to read: the check names its cause otherwise
        return None


@pytest.fixture
def ml4_boot_log(ml4_logs: LogReader) -> LogView:
    """The engine's lines since its last boot, parsed into events (read afresh for each test)."""
    return LogView(ml4_logs.since_last_boot(), ml4_logs.describe())


def attach_log(view: LogView, events: Sequence[LogEvent], name: str = "judged log lines") -> str:
    """Attach the judged lines with a little context to the Allure report (secrets redacted: a real engine logs its
    ``--api-key`` among the non-default args); returns the attached text."""
    from pytest_ml4.report.attach import attach_text
    from pytest_ml4.report.redact import redact

    text = view.excerpt(events) if events else view.tail(30)
    header = f"source: {view.source}\n" + "".join(f"matched [{e.signature}]: {e.meaning}\n" for e in events[:5])
    body = redact(f"{header}\n{text}\n")
    attach_text(body, name)
    return body


@pytest.fixture
def ml4_attach_log() -> Callable[[LogView, Sequence[LogEvent], str], str]:
    """``ml4_attach_log(view, events, name)``: attach the judged excerpt to this test's report."""
    return attach_log


class _VerdictSummary:
    """Collects the ``ml4_verdict`` properties tests record and prints them after the run (pass or fail), so a
    run reports e.g. the KV pool size and the >= 256,000 verdict without digging into the report."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == "call":
            from pytest_ml4.report.redact import redact

            self.lines.extend(redact(str(v)) for k, v in report.user_properties if k == "ml4_verdict")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if self.lines:
            terminalreporter.section("ml4 verdicts")
            for line in self.lines:
                terminalreporter.write_line(line)


def pytest_configure(config: pytest.Config) -> None:
    _check_log_file(config)
    config.pluginmanager.register(_VerdictSummary(), "ml4-verdict-summary")


def _check_log_file(config: pytest.Config) -> None:
    """A log file that is not there stops the run with one line, before any check reads "no boot line" from it."""
    given = config.getoption("ml4_log_file")
    path = given or config.getini("ml4_log_file")
    if not path or Path(path).is_file():
        return
    what = "--ml4-log-file" if given else "ini ml4_log_file"
    problem = "is not a file" if Path(path).exists() else "does not exist"
    raise pytest.UsageError(f"{what} {path}: {problem}; give the engine's log (a file, or a saved 'journalctl -u "
                            "UNIT' / 'kubectl logs' output)")


def memory_header(target: Target) -> str:
    """One header line: what the simulator's memory model makes of the target (seed-calibrated or an estimate)."""
    from pytest_ml4.evidence.memory import plan_memory

    plan = plan_memory(target.hardware, target.engine, target.topology.tensor_parallel)
    basis = "estimate: no seed measured this hardware/KV dtype" if plan.estimate else "calibrated on seed 000"
    if plan.outcome in ("startup_refused", "no_kv_memory"):
        return f"ml4: memory model (sim): the engine will not start ({plan.outcome}); {basis}"
    line = (f"ml4: memory model (sim): KV pool {plan.kv_pool_tokens:,} tokens, {plan.max_concurrency:.2f}x at "
            f"{target.engine.max_model_len:,}, headroom {plan.headroom_gib:.2f} GiB/GPU")
    if plan.outcome == "oom_first_step":
        line += f"; dies on the first step of >= {plan.oom_step_tokens:,} tokens (FusedMoE workspace OOM)"
    return f"{line}; {basis}"


def pytest_report_header(config: pytest.Config) -> list[str]:
    from pytest_ml4.plugin.state import get_state

    state = get_state(config)
    if state.target is None or not state.use_sim:
        return []
    return [memory_header(state.target)]
