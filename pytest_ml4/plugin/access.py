"""pytest glue for :mod:`pytest_ml4.target.access`: the accesses the selected suites need, in the session header, and a
check whose suite needs a missing access ends not judged at setup, before any request.

The header probes (2 s to connect; not under ``--collect-only``); the setup decision reads only set or missing, so
every xdist worker decides alike without probing. Under ``--sim`` the embedded deployment provides everything.
"""

from __future__ import annotations

import os

import pytest

from pytest_ml4.checks.verdict import NOT_JUDGED_PREFIX
from pytest_ml4.plugin.markexpr import MarkExpressionError, compile_markexpr
from pytest_ml4.plugin.state import STATE_KEY
from pytest_ml4.target.access import (
    Access,
    MissingField,
    blocking,
    missing_fields,
    needs_table,
    survey,
)

_SET_OR_MISSING = pytest.StashKey[list[Access]]()
_MISSING_FIELDS = pytest.StashKey[list[MissingField]]()


def selected_suites(markexpr: str | None) -> list[str]:
    """The suites a ``-m`` expression can select (each suite's checks carry its marker); all without one."""
    suites = list(needs_table().suites)
    if not (markexpr or "").strip():
        return suites
    try:
        selects = compile_markexpr(markexpr or "")
    except MarkExpressionError:  # pytest reports a bad -m itself; the header then lists every suite
        return suites
    return [s for s in suites if selects(s)]


def _survey(config: pytest.Config, suites: list[str], probe: bool) -> list[Access] | None:
    state = config.stash.get(STATE_KEY, None)
    if state is None or state.target is None:
        return None
    log_file = config.getoption("ml4_log_file", None) or config.getini("ml4_log_file") or None
    return survey(state.target, suites, env=os.environ, endpoint_url=config.getoption("ml4_endpoint", None),
                  key_var=config.getoption("ml4_api_key_env", None) or None, log_file=log_file,
                  simulated=state.use_sim, probe=probe)


def pytest_report_header(config: pytest.Config) -> list[str]:
    suites = selected_suites(config.getoption("markexpr", None))
    accesses = _survey(config, suites, probe=not config.option.collectonly)
    if not accesses:
        return []
    lines = [f"ml4 access for {', '.join(suites)} (ml4-preflight --target NAME --access):"]
    lines += [f"  {a.line()}" for a in accesses]
    lines += [f"ml4 target field: {f.line()} (not judged)" for f in _fields(config, suites)]
    return lines


def _fields(config: pytest.Config, suites: list[str]) -> list[MissingField]:
    state = config.stash.get(STATE_KEY, None)
    if state is None or state.target is None:
        return []
    given = ("perf.baseline",) if config.getoption("ml4_perf_baseline", None) else ()
    return missing_fields(state.target, suites, given)


def _suite(item: pytest.Item) -> str | None:
    table = needs_table().suites
    return next((m.name for m in item.iter_markers() if m.name in table), None)


def _why_not_judged(item: pytest.Item, suite: str) -> str | None:
    """The missing access or target field this check needs (set or missing only: every worker decides alike)."""
    fields = item.config.stash.get(_MISSING_FIELDS, None)
    if fields is None:
        fields = item.config.stash[_MISSING_FIELDS] = _fields(item.config, list(needs_table().suites))
    name, original = item.name, getattr(item, "originalname", item.name)
    field = next((f for f in fields if f.suite == suite and f.matches(name, original)), None)
    if field is not None:
        return field.line()
    accesses = item.config.stash.get(_SET_OR_MISSING, None)
    if accesses is None:
        at_start = {name for name, spec in needs_table().accesses.items() if spec.at_start}
        accesses = [a for a in _survey(item.config, list(needs_table().suites), probe=False) or []
                    if a.name not in at_start]  # the session's start stops on these itself (exit 4 or 3)
        item.config.stash[_SET_OR_MISSING] = accesses
    missing = blocking(accesses, suite)
    return missing.why_not_judged() if missing is not None else None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    suite = _suite(item)
    if suite is None or item.get_closest_marker("skip") is not None:  # does not apply: the skip says why
        return
    why = _why_not_judged(item, suite)
    if why is not None:
        raise pytest.skip.Exception(NOT_JUDGED_PREFIX + why, _use_item_location=True)
