"""pytest glue for the report concern: Allure results in the run folder, labels, redaction, summary, xdist safety.

What it does (the work itself lives in :mod:`pytest_ml4.report`):

* Allure results go to ``<run_dir>/allure-results`` when the user gave no ``--alluredir`` (ini ``ml4_allure``
  turns that off), and every file allure-pytest writes passes through the run's redactor.
* ``--clean-alluredir`` together with ``-n`` is refused: under xdist a replacement worker would wipe the other
  workers' results (tooling.md §2, bug 1).
* A test whose xdist worker crashed is written as a **broken** Allure result (allure-python#825).
* Labels: epic = target, feature = suite, story = check, severity = what a failure blocks; titles from docstrings.
* Reports (console, JUnit XML) are scrubbed of secrets: exception text, captured output, user properties, logs.
* At session end (controller only under xdist): ``environment.properties``, ``executor.json``,
  ``categories.json`` and the previous report's history into the results, ``summary.json`` into the run folder.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import allure_commons
import pytest

from pytest_ml4.checks.codes import Violation
from pytest_ml4.checks.verdict import (
    DOES_NOT_APPLY_PREFIX,
    EXIT_NOT_JUDGED,
    NOT_JUDGED_PREFIX,
    NotJudged,
)
from pytest_ml4.evidence.worker_engine import WorkerEngine
from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.report import labels as _labels
from pytest_ml4.report.attach import ExchangeRecorder
from pytest_ml4.report.categories import categorize, write_categories
from pytest_ml4.report.environment import (
    engine_version,
    environment_properties,
    executor_from_env,
    git_sha,
    package_version,
    write_environment,
    write_executor,
)
from pytest_ml4.report.history import (
    REPORT_DIRNAME,
    RESULTS_DIRNAME,
    previous_run,
    seed_history,
)
from pytest_ml4.report.redact import DEFAULT as REDACTOR
from pytest_ml4.report.redact import register_secret_env
from pytest_ml4.report.results import RedactingFileLogger, write_crash_result
from pytest_ml4.report.summary import (
    DOES_NOT_APPLY,
    NOT_JUDGED,
    CheckRecord,
    build_summary,
    verdict_lines_of,
    write_summary,
)

#: ``ml4`` (the bundle) depends on the first two, so a check using it is in the list through its fixture closure.
_CLIENT_FIXTURES = ("http_client", "openai_client", "async_openai_client")
#: One per process: the session clients are hooked once, recording is switched on per check.
RECORDER = ExchangeRecorder()
_LABELS_DIR = ".ml4-report"
_XDIST_CRASH_WHEN = "???"  # pytest-xdist's synthetic report for a crashed worker uses this phase name


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    pluginmanager.register(_AllureTakeover(), "ml4-allure-takeover")
    group = ml4_group(parser)
    group.addoption("--ml4-no-allure", dest="ml4_no_allure", action="store_true", default=None,
                    help="do not write Allure results into <run folder>/allure-results when --alluredir is not "
                         "given (ini: ml4_allure = false)")
    parser.addini("ml4_allure", "write Allure results under <run folder>/allure-results by default",
                  type="bool", default=True)
    group.addoption("--ml4-allow-not-judged", dest="ml4_allow_not_judged", action="store_true", default=None,
                    help=f"exit 0 although a check was not judged, for exploratory runs (default: such a run exits "
                         f"{EXIT_NOT_JUDGED}, never signed) (ini: ml4_allow_not_judged = true)")
    parser.addini("ml4_allow_not_judged", "a not-judged check leaves the exit status 0 (see --ml4-allow-not-judged)",
                  type="bool", default=False)


# ------------------------------------------------------------------------------------------------ configure
@pytest.hookimpl(tryfirst=True)
def pytest_cmdline_main(config: pytest.Config) -> None:
    # Runs before any pytest_configure, i.e. before allure-pytest could wipe the folder.
    clean = getattr(config.option, "clean_alluredir", False)
    xdist = getattr(config.option, "numprocesses", None) or getattr(config.option, "tx", None)
    if clean and xdist and not hasattr(config, "workerinput"):
        raise pytest.UsageError(
            "--clean-alluredir cannot be combined with -n/--tx: under pytest-xdist a restarted worker deletes the "
            "results the other workers wrote (allure-python is not xdist-aware). Each run already gets its own "
            "folder under the run directory; to reuse an --alluredir, empty it before starting pytest.")


class _ReportState:
    """Per-process bookkeeping: labels by node id, the checks seen (controller), the start time."""

    def __init__(self) -> None:
        self.started = time.time()
        self.labels: dict[str, dict[str, str]] = {}
        self.titles: dict[str, str] = {}
        self.suites: dict[str, str] = {}
        self.checks: dict[str, CheckRecord] = {}


_STATE = pytest.StashKey[_ReportState]()


def _ml4_state(config: pytest.Config) -> Any:
    from pytest_ml4.plugin.state import STATE_KEY

    return config.stash.get(STATE_KEY, None)


@pytest.hookimpl(trylast=True)
def pytest_configure(config: pytest.Config) -> None:
    # trylast: plugin.py's pytest_configure has built the ml4 state and allure-pytest has set up its logger.
    config.stash[_STATE] = _ReportState()
    state = _ml4_state(config)
    if state is not None and state.target is not None:
        register_secret_env(state.target.endpoint.api_key_env)
    register_secret_env(config.getoption("ml4_api_key_env", None))
    user_dir = config.stash.get(_USER_ALLUREDIR, None)
    if user_dir is not None:
        config.option.allure_report_dir = user_dir
        _register_allure(config, Path(user_dir), clean=_clean_requested(config))
    elif _wants_default_alluredir(config, state):
        results = state.ensure_run_dir() / RESULTS_DIRNAME
        config.option.allure_report_dir = str(results)
        _register_allure(config, results)
    if not hasattr(config, "workerinput"):
        config.pluginmanager.register(_ControllerHooks(config), "ml4-report-controller")


def _alluredir(config: pytest.Config) -> Path | None:
    """The Allure results folder of this run (user's --alluredir or ours), None when Allure is off."""
    value = getattr(config.option, "allure_report_dir", None)
    return Path(value) if value else None


def _wants_default_alluredir(config: pytest.Config, state: Any) -> bool:
    if state is None or state.target is None or _alluredir(config) is not None:
        return False
    if not config.pluginmanager.hasplugin("allure_pytest"):  # -p no:allure_pytest
        return False
    if config.option.collectonly or getattr(config.option, "help", False) or getattr(config.option, "version", 0):
        return False
    if config.getoption("ml4_no_allure") or not config.getini("ml4_allure"):
        return False
    return not hasattr(config, "workerinput") or state.run_dir is not None


class _AllureTakeover:
    """Hides the user's ``--alluredir`` from allure-pytest's own ``pytest_configure`` (tryfirst, every process).

    allure-pytest would register a plain file logger and, at cleanup, unregister it by the name it was given; the
    plugin must write through its redacting logger instead, and swapping allure's logger out made that cleanup fail
    (``AssertionError: one of name or plugin needs to be specified``, exit 1 after a green run). So the plugin
    registers the listener and the redacting logger itself (``_register_allure``), for the user's folder as for
    its default one, and restores the option afterwards for everything that reads it.
    """

    @pytest.hookimpl(tryfirst=True)
    def pytest_configure(self, config: pytest.Config) -> None:
        value = getattr(config.option, "allure_report_dir", None)
        if value and config.pluginmanager.hasplugin("allure_pytest"):
            config.stash[_USER_ALLUREDIR] = os.path.abspath(value)
            config.option.allure_report_dir = None


_USER_ALLUREDIR = pytest.StashKey[str]()


def _clean_requested(config: pytest.Config) -> bool:
    """allure-pytest's rule: ``--clean-alluredir`` empties the folder, except under ``--collect-only``."""
    return bool(getattr(config.option, "clean_alluredir", False)) and not config.option.collectonly


def _register_allure(config: pytest.Config, results: Path, clean: bool = False) -> None:
    """What allure-pytest's own pytest_configure does for ``--alluredir``, with the redacting file logger."""
    from allure_pytest.listener import AllureListener

    listener = AllureListener(config)
    config.pluginmanager.register(listener, "allure_listener")
    allure_commons.plugin_manager.register(listener)
    config.add_cleanup(lambda: allure_commons.plugin_manager.unregister(listener))
    file_logger = RedactingFileLogger(results, clean=clean, redactor=REDACTOR)
    allure_commons.plugin_manager.register(file_logger)
    config.add_cleanup(lambda: allure_commons.plugin_manager.unregister(file_logger))


@pytest.hookimpl(trylast=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    # Live logs and the --log-file go straight to their handlers, not through reports: filter them too.
    lp = session.config.pluginmanager.get_plugin("logging-plugin")
    for name in ("caplog_handler", "report_handler", "log_file_handler", "log_cli_handler"):
        handler = getattr(lp, name, None)
        if isinstance(handler, logging.Handler):
            handler.addFilter(_RedactFilter())


class _RedactFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        clean = REDACTOR.redact_text(message)
        if clean != message:
            record.msg, record.args = clean, None
        return True


# ------------------------------------------------------------------------------------------------ labels
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    state = _ml4_state(config)
    target = state.target.name if state is not None and state.target is not None else None
    rs = config.stash[_STATE]
    allure_on = config.pluginmanager.hasplugin("allure_pytest")  # its marker is unknown under -p no:allure_pytest
    for item in items:
        names = {m.name for m in item.iter_markers()}
        func = getattr(item, "function", None)
        original = getattr(item, "originalname", item.name)
        wanted = _labels.check_labels(target, names, item.path.name, original)
        present = {m.kwargs.get("label_type") for m in item.iter_markers("allure_label")}
        for key, value in wanted.items():
            if allure_on and key not in present:  # one style per label: never duplicate a decorator's label
                item.add_marker(pytest.mark.allure_label(value, label_type=key))
        title = _labels.check_title(func, original)
        if allure_on and func is not None and not hasattr(func, "__allure_display_name__"):
            # allure formats the title with the test's parameters; {param_id} shows which case this is.
            func.__allure_display_name__ = title + (" [{param_id}]" if hasattr(item, "callspec") else "")
        rs.labels[item.nodeid] = dict(wanted)
        rs.suites[item.nodeid] = _labels.suite_of(names, item.path.name).marker
        rs.titles[item.nodeid] = title + (f" [{item.callspec.id}]" if hasattr(item, "callspec") else "")
    _share_labels(config, rs)


def _share_labels(config: pytest.Config, rs: _ReportState) -> None:
    """xdist workers leave their label map in the run folder for the controller's crash results."""
    wi = getattr(config, "workerinput", None)
    state = _ml4_state(config)
    if wi is None or state is None or state.run_dir is None or state.collect_only:
        return
    folder = state.run_dir / _LABELS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f"labels-{wi['workerid']}.json.tmp"
    tmp.write_text(json.dumps({"labels": rs.labels, "titles": rs.titles, "suites": rs.suites}), encoding="utf-8")
    os.replace(tmp, folder / f"labels-{wi['workerid']}.json")


def _shared_labels(run_dir: Path | None, nodeid: str) -> tuple[dict[str, str], str | None, str]:
    """(labels, title, suite) of a node id from the workers' label maps (empty when none was written)."""
    if run_dir is None:
        return {}, None, "default"
    for path in sorted((run_dir / _LABELS_DIR).glob("labels-*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        if nodeid in data["labels"]:
            return data["labels"][nodeid], data["titles"].get(nodeid), data["suites"].get(nodeid, "default")
    return {}, None, "default"


# ------------------------------------------------------------------------------------------------ reports
@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    # Hook the endpoint's clients once, when they are made, without changing when they are made.
    value = yield
    if fixturedef.argname in _CLIENT_FIXTURES:
        RECORDER.install(value)
    return value


@pytest.fixture(autouse=True)
def _ml4_http_exchanges(request: pytest.FixtureRequest) -> Iterator[None]:
    """Records the HTTP exchanges of checks that use the endpoint's clients; a failing check gets them attached."""
    if any(name in request.fixturenames for name in _CLIENT_FIXTURES):
        RECORDER.start()
    yield
    RECORDER.stop()


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[None]:
    """A check that raised :class:`NotJudged` becomes a skip before any reporter (Allure, JUnit) sees it.

    pytest has no fourth outcome; the reason's prefix marks it, and the summary records it as ``not_judged``.
    """
    try:
        return (yield)
    except NotJudged as exc:
        # The item's location (as pytest's own skip marks use), not this hook's line, is what the summary shows.
        raise pytest.skip.Exception(str(exc), _use_item_location=True) from exc


def pytest_report_teststatus(report: pytest.TestReport, config: pytest.Config) -> tuple[str, str, str] | None:
    """A not-judged check is counted apart on pytest's exit line (``2 passed, 1 not_judged``), never as a skip."""
    if getattr(report, "ml4_status", None) == NOT_JUDGED:
        return NOT_JUDGED, "n", "NOT JUDGED"
    return None  # a check that does not apply stays a skip here (it never ran); the verdict lines count it apart


def _skip_reason(report: pytest.TestReport) -> str:
    """A skip's reason without the ``Skipped: `` pytest puts before skips reported at the item's location."""
    longrepr = report.longrepr
    if not (isinstance(longrepr, tuple) and len(longrepr) == 3):
        return ""
    return str(longrepr[2]).removeprefix("Skipped: ")


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[Any]) -> Iterator[None]:
    report = yield
    if report.when == "call" and report.failed and RECORDER.active:
        RECORDER.attach()  # the Allure test is still open here; the attachments are redacted
    rs = item.config.stash[_STATE]
    # Attributes on the report travel to the xdist controller with it (pytest serialises report.__dict__).
    report.ml4_suite = rs.suites.get(item.nodeid, "default")
    report.ml4_title = rs.titles.get(item.nodeid, item.name)
    if report.skipped and _skip_reason(report).startswith(NOT_JUDGED_PREFIX):
        report.ml4_status = NOT_JUDGED
    elif report.skipped and _skip_reason(report).startswith(DOES_NOT_APPLY_PREFIX):
        report.ml4_status = DOES_NOT_APPLY
    elif report.failed:
        exc = call.excinfo.value if call.excinfo is not None else None
        # allure-pytest's rule: assertion failures are "failed" (a verdict), anything else is "broken".
        verdict = isinstance(exc, (AssertionError, pytest.fail.Exception))
        report.ml4_status = "failed" if verdict else "broken"
        _record_violation(item, exc)
    _scrub_report(report)
    return report


def _record_violation(item: pytest.Item, exc: BaseException | None) -> None:
    """A verdict's code and the function that raised it, as JUnit properties (``ml4_verdict_code``,
    ``ml4_verdict_origin``): the kill matrix judges a kill by them, so a code raised from another function than
    the ones declared to raise it does not count (``pytest_ml4.checks.codes``). Set on the item: pytest's JUnit report
    writes the properties of the teardown report, built from the item's."""
    if isinstance(exc, Violation):
        item.user_properties += [("ml4_verdict_code", exc.code), ("ml4_verdict_origin", exc.origin)]


def _scrub_report(report: pytest.TestReport) -> None:
    """Redact exception text, captured output and user properties of a report (console and JUnit XML)."""
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        # A skip: pytest's summary needs the (path, line, reason) tuple, so only the reason is scrubbed.
        path, line, reason = report.longrepr
        report.longrepr = (path, line, REDACTOR.redact_text(str(reason)))
    elif report.longrepr is not None:
        text = str(report.longrepr)
        if REDACTOR.find_leaks(text):
            report.longrepr = REDACTOR.redact_text(text)
    report.sections = [(title, REDACTOR.redact_text(body)) for title, body in report.sections]
    if hasattr(report, "user_properties"):
        report.user_properties = [(k, REDACTOR(v)) for k, v in report.user_properties]


@pytest.hookimpl(tryfirst=True)
def pytest_collectreport(report: pytest.CollectReport) -> None:
    """A collection error is scrubbed before the terminal or an xdist worker's channel sees it."""
    if report.failed:
        _scrub_report(report)  # type: ignore[arg-type]


@pytest.hookimpl(tryfirst=True)
def pytest_warning_recorded(warning_message: Any) -> None:
    """A warning's text is scrubbed before the terminal's summary stores it: in a worker before xdist sends it to
    the controller, and again in the controller (a warning raised there, or one a worker's plugin left as is)."""
    message = warning_message.message
    text = str(message)
    clean = REDACTOR.redact_text(text)
    if clean != text:
        warning_message.message = type(message)(clean) if isinstance(message, Warning) else clean


class _ControllerHooks:
    """Hooks that only the controller (or a run without xdist) runs: it sees every report, writes the files."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.rs: _ReportState = config.stash[_STATE]
        self.summary: dict[str, Any] | None = None   # the summary.json written at session end

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when == _XDIST_CRASH_WHEN and "crashed while running" in str(report.longrepr):
            self._record_crash(report)
        _record_check(self.rs, report)

    def _record_crash(self, report: pytest.TestReport) -> None:
        state = _ml4_state(self.config)
        alluredir = _alluredir(self.config)
        message = REDACTOR.redact_text(str(report.longrepr))
        run_dir = state.run_dir if state is not None else None
        labels, title, suite = _shared_labels(run_dir, report.nodeid)
        report.ml4_title, report.ml4_suite = title, suite
        if alluredir:
            write_crash_result(Path(alluredir), report.nodeid, message, labels, title, report.duration)
        report.ml4_status = "broken"

    @pytest.hookimpl(wrapper=True)
    def pytest_sessionstart(self, session: pytest.Session) -> Iterator[None]:
        """pytest calls no ``pytest_sessionfinish`` when the start failed (the deployment did not start, Ctrl-C or
        SIGTERM while it started): the run folder gets its summary here, marked interrupted."""
        try:
            return (yield)
        except BaseException as exc:
            state = _ml4_state(self.config)
            if state is not None and state.target is not None and state.run_dir is not None:
                self._write_summary(_start_failure_status(exc), {}, interrupted=True)
            raise

    def _write_summary(self, exitstatus: int, versions: dict[str, str], interrupted: bool | None = None) -> None:
        state = _ml4_state(self.config)
        doc = build_summary(run_dir=state.run_dir, target=state.target.name, simulated=state.use_sim,
                            faults=state.faults, versions=versions, checks=list(self.rs.checks.values()),
                            started=self.rs.started, finished=time.time(), exit_status=int(exitstatus),
                            interrupted=interrupted)
        write_summary(state.run_dir, doc)
        self.summary = doc

    def _not_judged(self) -> list[CheckRecord]:
        return [c for c in self.rs.checks.values() if c.outcome == NOT_JUDGED]

    def _allowed(self) -> bool:
        return bool(self.config.getoption("ml4_allow_not_judged") or self.config.getini("ml4_allow_not_judged"))

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if self._not_judged() and exitstatus == pytest.ExitCode.OK and not self._allowed():
            # A check that could not judge is a gap in the evidence, not a pass; a failure (1) wins over it.
            session.exitstatus = exitstatus = EXIT_NOT_JUDGED
        state = _ml4_state(self.config)
        alluredir = _alluredir(self.config)
        run_dir = state.run_dir if state is not None and state.target is not None else None
        if run_dir is not None and state.collect_only:
            return  # nothing ran: no run folder, no summary (ml4-report latest would name an empty run)
        versions = _versions(state)
        if run_dir is not None:
            self._write_summary(exitstatus, versions)
        if alluredir is None:
            return
        target = state.target if state is not None else None
        write_environment(alluredir, environment_properties(
            target, simulated=bool(state and state.use_sim), engine=versions.get("engine_reported"),
            faults=tuple(state.faults) if state is not None else (),
            extra={ENVIRONMENT_KEYS[k]: v for k, v in versions.items() if k in ENVIRONMENT_KEYS}))
        executor = executor_from_env()
        if "buildOrder" not in executor and run_dir is not None:
            # Outside CI, number local runs by their position among the stored runs so the trend is ordered.
            executor["buildOrder"] = sum(1 for p in run_dir.parent.glob("*/summary.json"))
        write_executor(alluredir, executor)
        write_categories(alluredir)
        if run_dir is not None and not (alluredir / "history").is_dir():
            prev = previous_run(run_dir)
            seed_history(alluredir, prev / REPORT_DIRNAME if prev else None)

    def _summarize_not_judged(self, terminalreporter: Any) -> None:
        checks = self._not_judged()
        if not checks:
            return
        terminalreporter.section("not judged (the check ran, its evidence was missing: never a pass)", sep="-")
        for c in checks:
            terminalreporter.write_line(f"NOT JUDGED {c.nodeid}: {c.message.removeprefix(NOT_JUDGED_PREFIX)}")
        if self._allowed():
            terminalreporter.write_line(f"ml4: {len(checks)} check(s) not judged, allowed by --ml4-allow-not-judged "
                                        f"(ml4_allow_not_judged): an exploratory run, not a sign-off")

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self._summarize_not_judged(terminalreporter)
        self._report_location(terminalreporter)

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """The verdict at a glance, as the console's last lines (after pytest's own count line)."""
        terminal = config.pluginmanager.get_plugin("terminalreporter")
        if self.summary is None or terminal is None:
            return
        terminal.write_sep("=", "ml4 verdict")
        for line in verdict_lines_of(self.summary):
            terminal.write_line(line)

    def _report_location(self, terminalreporter: Any) -> None:
        alluredir = _alluredir(self.config)
        state = _ml4_state(self.config)
        if not alluredir or state is None or state.run_dir is None:
            return
        if Path(alluredir).resolve().parent == state.run_dir.resolve():
            terminalreporter.write_line(f"ml4 report: Allure results in {alluredir}; "
                                        f"HTML: ml4-report generate {state.run_dir}")


def _start_failure_status(exc: BaseException) -> int:
    """The exit status pytest gives a session whose start raised ``exc``."""
    if isinstance(exc, pytest.UsageError):
        return int(pytest.ExitCode.USAGE_ERROR)
    if isinstance(exc, pytest.exit.Exception) and exc.returncode is not None:
        return int(exc.returncode)
    if isinstance(exc, (KeyboardInterrupt, pytest.exit.Exception)):
        return int(pytest.ExitCode.INTERRUPTED)
    return int(pytest.ExitCode.INTERNAL_ERROR)


def _versions(state: Any) -> dict[str, str]:
    """Engine version as the endpoint reports it (``/version``), else as configured; suite and git versions."""
    out = {"suite": package_version("pytest-ml4"), "git_sha": git_sha(), "pytest": package_version("pytest")}
    if state is None or state.target is None:
        return out
    target = state.target
    urls = []
    info = state.description
    if info is not None:
        urls.append(info.url)
    else:
        for var in (target.endpoint.metrics_url_env, target.endpoint.url_env):
            if var and os.environ.get(var):
                urls.append(os.environ[var])
        if state.config.getoption("ml4_endpoint"):
            urls.insert(0, state.config.getoption("ml4_endpoint"))
    reported = engine_version(urls) if urls else None
    from pytest_ml4.stacks.dynamo_versions import target_row

    row = target_row(target)
    if row is not None:  # the behaviour the suites expect of the target's Dynamo release, and how it is known
        out["dynamo_behaviour"] = row.describe()
    dyn = info.dynamo if info is not None else None
    if dyn:  # a real dynamo.frontend served the run (pytest_ml4_sim.deploy.dynamo)
        out["dynamo_frontend"] = dyn["frontend"]["dynamo_version"]
        out["dynamo_frontend_command"] = " ".join(dyn["frontend"]["command"][1:])
        out["dynamo_bridge"] = "on" if dyn["bridge"] else "off"
        record = WorkerEngine.of(dyn)  # real dynamo.vllm workers: their versions, a reduction, the emulation
        out.update(record.report_versions() if record else {})
    out["engine"] = reported or target.engine.version
    if reported:
        out["engine_reported"] = reported
    return out


#: summary.json version keys also shown in the Allure environment, with their label there.
ENVIRONMENT_KEYS = {"dynamo_behaviour": "Dynamo behaviour", "dynamo_worker": "Dynamo worker",
                    "dynamo_worker_vllm": "Worker vLLM",
                    "deployment_reduced": "Deployment reduced", "dynamo_emulation": "Dynamo emulation",
                    "dynamo_disagg": "Disaggregated KV transfer"}


def _record_check(rs: _ReportState, report: pytest.TestReport) -> None:
    check = rs.checks.get(report.nodeid)
    if check is None:
        title = getattr(report, "ml4_title", None) or report.nodeid.rsplit("::", 1)[-1]
        check = CheckRecord(report.nodeid, title, getattr(report, "ml4_suite", None) or "default")
        rs.checks[report.nodeid] = check
    check.duration_s = round(check.duration_s + report.duration, 3)
    check.figures.update({name: value for name, value in report.user_properties
                          if isinstance(value, dict) and "conditions" in value})
    if report.skipped and check.outcome == "passed":
        check.outcome = getattr(report, "ml4_status", None) or "skipped"
        # Every skip keeps its reason: summary.json and the verdict lines show why a check did not count.
        check.message = REDACTOR.redact_text(_skip_reason(report))[:500]
    elif report.failed and check.outcome in ("passed", "skipped"):
        check.outcome = getattr(report, "ml4_status", "broken")
        crash = getattr(report.longrepr, "reprcrash", None)
        check.message = REDACTOR.redact_text(crash.message if crash else str(report.longrepr))[:500]
        check.categories = categorize(check.outcome, check.message)
