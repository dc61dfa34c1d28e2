"""Shared fixtures for the plugin's own tests: pytester, and paths into the repository."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from pytest_ml4.runtime.installed import tools_dir

pytest_plugins = ["pytester"]

# pytester restores sys.modules after each test; httpx imports httpcore lazily on first use, so a first use
# inside a pytester test would leave later tests with a second copy whose exceptions httpx no longer maps.
httpx.HTTPTransport().close()

# Resolved before pytester moves HOME, so installed tools (aiperf, LiteLLM, the tokenizer cache) stay found in
# every pytester run and subprocess.
os.environ.setdefault("ML4_TOOLS", str(tools_dir()))

REPO = Path(__file__).resolve().parent.parent


def pytest_configure(config: pytest.Config) -> None:
    # `.ci/run` deselects these (`-m "not nightly"`): proofs too heavy for CI's 2 cores and 30 minutes, run by
    # `scripts/nightly.sh`. Each such test says in its docstring why it is nightly.
    config.addinivalue_line("markers", "nightly: a heavy proof run nightly (scripts/nightly.sh), not in .ci/run")
    config.stash[_GATE_SCOPE] = gate_scope(os.environ.get(GATE_ENV))


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    # `--dist loadfile`, except that each kill-matrix run is a work unit of its own (tests/xdist_scopes.py).
    from xdist_scopes import make_scheduler

    return make_scheduler(config, log)


@pytest.fixture
def repo_root() -> Path:
    return REPO


@pytest.fixture
def smoke_copy(pytester: pytest.Pytester) -> None:
    """``suites/test_smoke.py`` copied into the pytester folder, to run as ``suites/test_smoke.py`` there."""
    (pytester.path / "suites").mkdir()
    (pytester.path / "suites" / "test_smoke.py").write_text((REPO / "suites" / "test_smoke.py").read_text())


@pytest.fixture(scope="module")
def rtx_api_key() -> Iterator[str]:
    """A fresh API key in the RTX PRO target's key variable for one module (restored afterwards)."""
    from pytest_ml4.target.model import load_target

    var = load_target("rtxpro6000-tp8").endpoint.api_key_env or "LLM_API_KEY"
    old = os.environ.get(var)
    os.environ[var] = value = "sk-test-" + secrets.token_hex(12)
    yield value
    if old is None:
        os.environ.pop(var, None)
    else:
        os.environ[var] = old


# ---------------------------------------------------------------------------------------- kill-matrix tally
# tests/test_kill_matrix.py records its results as user properties; they reach the xdist controller with each
# report, so the tally is printed once for the whole session (and shows in .ci/run's output).
_KILL_RECORDS: list[dict] = []


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.when != "call":
        return
    import json

    for name, value in report.user_properties:
        if str(name).startswith("ml4_killmatrix"):
            _KILL_RECORDS.append(json.loads(value))


def _all(values: list[bool] | None) -> bool:
    return bool(values) and all(values)


@dataclass(frozen=True)
class TargetTally:
    """One target's line of the tally, and what the gate reads from it."""

    target: str
    line: str
    killed: int
    gating: int
    controls_passed: int
    controls_ran: int
    collateral: int
    #: Gating checks this session could not prove: pending ones, and those of a profile it left out.
    unrun: int = 0

    def gate_failures(self, ran_only: bool = False) -> list[str]:
        """Why this target does not pass the gate (empty: N = M, every control passed, no collateral).
        ``ran_only``: M counts only the checks of the profiles this session ran (CI's scope, the real profile being
        nightly), so a kill moved to nightly, or a check of a CI profile without its kill, still fails."""
        why = []
        required = self.gating - self.unrun if ran_only else self.gating
        if self.killed < required:
            scope = " of the profiles run here" if ran_only else ""
            why.append(f"{required - self.killed} of {required} checks{scope} not proven killed here")
        if self.controls_passed < self.controls_ran:
            why.append(f"{self.controls_ran - self.controls_passed} kill control(s) failed")
        if self.collateral:
            why.append(f"{self.collateral} collateral failure(s)")
        return why


def kill_tally(records: list[dict]) -> list[str]:
    """Per target: ``suite checks killed by a fault: N/M``, ``kill controls passed: K/K``, ``collateral failures: C``.

    A check counts as killed when every kill naming it failed it with its message, it passed the healthy run, and
    every such kill's control passed (the healthy run for kills without ``args``).
    """
    tallies, unproven = target_tallies(records)
    return [t.line for t in tallies] + [_no_matrix(t) for t in unproven]


def _no_matrix(target: str) -> str:
    return f"{target}: no kill matrix (fixtures/killmatrix/{target}.yaml): none of its checks is proven"


def target_tallies(records: list[dict]) -> tuple[list[TargetTally], list[str]]:
    """The tally per target whose matrix the session read, and the targets without a matrix."""
    matrices = {r["target"]: r for r in records if "checks" in r}
    unproven = sorted({r["target"] for r in records if r.get("no_matrix")})
    healthy: dict[tuple[str, str], list[bool]] = {}
    kills: dict[tuple[str, str], list[bool]] = {}
    controls: dict[tuple[str, str], list[bool]] = {}
    #: The checks each kill was judged on in this session: a kill naming checks of several timing profiles (say a
    #: fast smoke check and a real perf check) is controlled, for the tally, on the profiles that ran.
    judged: dict[tuple[str, str], set[str]] = {}
    collateral: dict[str, int] = {}
    for r in records:
        if "healthy" in r:
            healthy.setdefault((r["target"], r["check"]), []).append(r["healthy"])
        elif "kill" in r and "ok" in r:
            kills.setdefault((r["target"], r["check"]), []).append(r["ok"])
            kills.setdefault((r["target"], "kill:" + r["kill"]), []).append(r["ok"])
            judged.setdefault((r["target"], r["kill"]), set()).add(r["check"])
        elif "control_ok" in r:
            controls.setdefault((r["target"], r["kill"]), []).append(r["control_ok"])
        elif "collateral_failures" in r:
            collateral[r["target"]] = collateral.get(r["target"], 0) + r["collateral_failures"]
    tallies = []
    for target, m in sorted(matrices.items()):
        def control_ok(kill: str, m: dict = m, target: str = target) -> bool:
            spec = m["kills"][kill]
            if spec["control"] == "healthy":
                ran = judged.get((target, kill)) or spec["checks"]
                return all(_all(healthy.get((target, c))) for c in ran)
            return _all(controls.get((target, kill)))
        ran = [k for k in m["kills"] if (target, "kill:" + k) in kills]
        gating = [c for c, kind in m["checks"].items() if kind in ("killed_by", "pending")]
        killed = [c for c in gating if m["checks"][c] == "killed_by" and _all(kills.get((target, c)))
                  and _all(healthy.get((target, c)))
                  and all(control_ok(k) for k, spec in m["kills"].items() if c in spec["checks"])]
        pending = sum(1 for c in gating if m["checks"][c] == "pending")
        measurements = sum(1 for kind in m["checks"].values() if kind == "measurement")
        # Checks whose healthy run this session left out (CI: the real profile, and profiles a matrix sends to
        # nightly): still counted in M, never in N, and named so the line does not read as a failure it is not.
        profile_of = m.get("profiles", {})
        not_run = [c for c in gating if m["checks"][c] != "pending" and c in profile_of
                   and (target, c) not in healthy]
        left_out = sorted({profile_of[c] for c in not_run})
        not_run_note = f", not run here: {len(not_run)} (profile {', '.join(left_out)})" if not_run else ""
        passed = sum(map(control_ok, ran))
        tallies.append(TargetTally(
            target, f"{target}: suite checks killed by a fault: {len(killed)}/{len(gating)}"
                    f" (pending {pending}, measurements {measurements}{not_run_note}),"
                    f" kill controls passed: {passed}/{len(ran)},"
                    f" collateral failures: {collateral.get(target, 0)}",
            len(killed), len(gating), passed, len(ran), collateral.get(target, 0), len(not_run) + pending))
    return tallies, unproven


# ---------------------------------------------------------------------------------------- kill-matrix gate
#: Which targets' tallies fail the session: ``all`` (default), ``off``, or a comma list of target names. A check
#: whose kill is nightly-only, or whose profile this session left out, counts as not proven (N < M). ``ran``: every
#: target, M counting only the checks of the profiles the session ran (what ``.ci/run`` sets while the ``real``
#: profile is nightly): a kill moved to nightly inside a CI profile still fails the session.
GATE_ENV = "ML4_KILL_MATRIX_GATE"
RAN_ONLY = "ran"


def gate_scope(value: str | None) -> frozenset[str] | None:
    """The targets the gate judges (None: all of them; empty: none), from :data:`GATE_ENV`."""
    value = (value or "all").strip()
    if value in ("all", RAN_ONLY):
        return None
    if value == "off":
        return frozenset()
    names = frozenset(v.strip() for v in value.split(",") if v.strip())
    from killmatrix import ALL_TARGETS

    unknown = sorted(names - set(ALL_TARGETS))
    if unknown or not names:
        raise pytest.UsageError(f"{GATE_ENV}={value!r}: give all, ran, off or target names among {ALL_TARGETS} "
                                f"(unknown: {unknown or 'none given'})")
    return names


def kill_gate(records: list[dict], scope: frozenset[str] | None, ran_only: bool = False) -> list[str]:
    """One line per target in scope whose tally does not hold (N < M, a failed control, collateral), or that has
    no matrix; empty when the session ran no kill matrix."""
    tallies, unproven = target_tallies(records)
    inside = (lambda t: True) if scope is None else (lambda t: t in scope)
    lines = [f"{t.target}: {', '.join(why)}" for t in tallies
             if inside(t.target) and (why := t.gate_failures(ran_only))]
    return lines + [_no_matrix(t) for t in unproven if inside(t)]


_GATE: dict[str, list[str]] = {}
_GATE_SCOPE = pytest.StashKey[frozenset[str] | None]()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """The gate: a session whose kill-matrix tally does not hold for a target in scope fails (exit 1)."""
    if hasattr(session.config, "workerinput") or _GATE_SCOPE not in session.config.stash:
        return   # an xdist worker: the controller holds every worker's records and judges them
    ran_only = (os.environ.get(GATE_ENV) or "").strip() == RAN_ONLY
    failures = kill_gate(_KILL_RECORDS, session.config.stash[_GATE_SCOPE], ran_only)
    _GATE["failures"] = failures
    if failures and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for line in kill_tally(_KILL_RECORDS):
        terminalreporter.write_line(line)
    failures = _GATE.get("failures")
    if failures:
        terminalreporter.write_line(f"kill-matrix gate ({GATE_ENV}={os.environ.get(GATE_ENV) or 'all'}) FAILS "
                                    f"the session: " + "; ".join(failures), red=True, bold=True)
