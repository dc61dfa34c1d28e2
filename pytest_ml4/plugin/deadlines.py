"""Plugin glue for :mod:`pytest_ml4.client.transport`: the ``--ml4-deadlines`` option and bounded failure messages.

The deadlines themselves are applied by the clients the session fixtures build (``Endpoint.deadlines``); here
the option is checked at start-up, so a typo is one usage line, not a failure in every test.
"""

from __future__ import annotations

import pytest

from pytest_ml4.client.transport import DEADLINE_NAMES, parse_deadlines
from pytest_ml4.plugin.option_group import group as ml4_group
from pytest_ml4.plugin.option_group import opt
from pytest_ml4.plugin.state import STATE_KEY, session_deadlines

#: A failure message longer than this is cut in the middle (a 50 MB wrong answer quoted by a check must not
#: become 100 MB of console and Allure results); both ends stay, so the check's own words and the URL remain.
#: 16 KB: a preflight rule firing on a few dozen documents (one line each) must stay whole, a quoted answer not.
MESSAGE_LIMIT = 16 * 1024


def pytest_addoption(parser: pytest.Parser) -> None:
    group = ml4_group(parser)
    group.addoption("--ml4-deadlines", dest="ml4_deadlines", default=None, metavar="NAME=S[,NAME=S]",
                    help=f"per-request deadlines in seconds, NAME one of {', '.join(DEADLINE_NAMES)}; unset ones "
                         "are derived from the target (README: bad input) (ini: ml4_deadlines)")
    parser.addini("ml4_deadlines", "per-request deadlines, e.g. idle=30,overall=900 (see --ml4-deadlines)",
                  default="")


def pytest_configure(config: pytest.Config) -> None:
    try:
        parse_deadlines(opt(config, "ml4_deadlines", "ml4_deadlines"))
    except ValueError as err:
        raise pytest.UsageError(f"--ml4-deadlines: {err}") from None


def pytest_report_header(config: pytest.Config) -> list[str]:
    """The deadlines every request gets, so a user knows how long a stalled deployment can hold the gate."""
    state = config.stash.get(STATE_KEY, None)
    if state is None or state.target is None:
        return []
    return [f"ml4 deadlines per request: {session_deadlines(config, state.target).describe()} (--ml4-deadlines)"]


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> None:
    """Cut an oversized failure message before pytest and Allure render it."""
    if call.excinfo is not None:
        bound_message(call.excinfo.value)


def bound_message(exc: BaseException, limit: int = MESSAGE_LIMIT) -> None:
    text = str(exc)
    if len(text) <= limit or not exc.args:
        return
    half = limit // 2
    exc.args = (f"{text[:half]}\n... [message cut: {len(text):,} characters in all] ...\n{text[-half:]}",)
