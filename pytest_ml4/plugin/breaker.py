"""pytest glue for :mod:`pytest_ml4.client.breaker`: checks not started after the endpoint was judged gone are not judged.

* Before each check (setup, before any fixture sends a request): once the breaker is tripped, by this process or
  another xdist worker (the run folder's ``.endpoint-breaker.json``), the check ends not judged naming the first
  failure; the check that tripped it keeps its own failure.
* A check whose requests the breaker refused mid-way (another check tripped it meanwhile) is not judged either.
* A failure met by a client outside the guard (a plain ``httpx.get`` timing out) is told to the breaker too.
* Which markers send no request or take the endpoint away on purpose: ``pytest_ml4/data/plugin/breaker.yaml``.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any, Literal

import pytest

from pytest_ml4.checks.verdict import NOT_JUDGED_PREFIX, NotJudged
from pytest_ml4.client.breaker import EndpointHealth
from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.plugin.state import STATE_KEY

BREAKER_FILE = data_file("plugin", "breaker.yaml")


class BreakerMarkers(Strict):
    """Suite markers whose checks send no request (``no_endpoint``) and whose checks cause the outage they
    measure (``outage``): the breaker neither skips nor opens on them."""

    no_endpoint: frozenset[str]
    outage: frozenset[str]


@functools.cache
def breaker_markers() -> BreakerMarkers:
    return load_yaml(BREAKER_FILE, BreakerMarkers)


def _markers(kind: Literal["no_endpoint", "outage"]) -> frozenset[str]:
    return frozenset(getattr(breaker_markers(), kind))


def _health(config: pytest.Config) -> EndpointHealth | None:
    state = config.stash.get(STATE_KEY, None)
    if state is None or state.target is None or state.collect_only:
        return None
    return state.endpoint_health()


def _has(item: pytest.Item, kind: str) -> bool:
    return any(m.name in _markers(kind) for m in item.iter_markers())


def _not_sent(reason: str) -> pytest.skip.Exception:
    return pytest.skip.Exception(NOT_JUDGED_PREFIX + reason, _use_item_location=True)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    health = _health(item.config)
    if health is None or _has(item, "no_endpoint") or item.get_closest_marker("skip") is not None:
        return
    health.check = item.nodeid
    trip = health.trip()
    if trip is not None and trip.check != item.nodeid:
        raise _not_sent(trip.not_sent())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[Any]:
    """A check that takes the endpoint away on purpose (a restart) runs with the breaker paused."""
    health = _health(item.config)
    if health is None or not _has(item, "outage"):
        return (yield)
    with health.paused():
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> Iterator[Any]:
    try:
        return (yield)
    except (pytest.skip.Exception, NotJudged):
        raise
    except Exception as exc:
        health = _health(pyfuncitem.config)
        trip = health.observe(exc) if health is not None else None
        if trip is not None and trip.check != pyfuncitem.nodeid and health.refused(pyfuncitem.nodeid):
            raise _not_sent(f"{health.refused(pyfuncitem.nodeid)} request(s) {trip.not_sent()}") from exc
        raise


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """A fixture's request that met a gone endpoint outside the guard trips the breaker too."""
    if call.when == "setup" and call.excinfo is not None and isinstance(call.excinfo.value, Exception):
        health = _health(item.config)
        if health is not None and not _has(item, "no_endpoint"):
            health.observe(call.excinfo.value)


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        return
    health = _health(config)
    trip = health.trip() if health is not None else None
    if trip is not None:
        not_sent = sum(1 for r in terminalreporter.stats.get("not_judged", [])
                       if "not sent: endpoint" in str(getattr(r, "longrepr", "")))
        terminalreporter.write_line(f"ml4: the gate stopped early: {trip.describe()}; {not_sent} check(s) after it "
                                    f"not sent (not judged)", red=True, bold=True)
