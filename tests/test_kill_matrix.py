"""The kill matrix (issue 14): every suite check fails under the fault it exists for, and passes without it.

``fixtures/killmatrix/<target>.yaml`` lists, for every test function in ``suites/``, the kills that must fail it
(simulator faults, target options, recorded bad logs and configs) with a regex the failure must match, or why it
has no killer (``measurement``, ``skipped`` on the target, ``pending``). Here:

* the matrix must name every test collected from ``suites/`` for the target, and nothing else (a new suite test
  without a killer fails the project's tests);
* one healthy ``--sim`` run per target and timing profile: every listed check passes (``skipped`` ones skip);
* one run per kill and profile, selecting the checks it must kill by node id: each must fail with its regex.

Each run is a pytest subprocess writing JUnit XML. ``tests/conftest.py`` prints the tally at the end of the
session: ``suite checks killed by a fault: N/M (measurements: K)``.
"""

from __future__ import annotations

import fnmatch
import json
import os
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from glob import iglob
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parent.parent
MATRIX_DIR = REPO / "fixtures" / "killmatrix"
TARGETS = sorted(p.stem for p in MATRIX_DIR.glob("*.yaml"))
RUN_TIMEOUT_S = 600
#: Which timing profiles run (``offline,fast,real`` by default): ``ML4_KILL_MATRIX_PROFILES=fast`` leaves out the perf,
#: KV and restart runs where CI time is short; the tally then counts only what ran.
PROFILES = tuple(p.strip() for p in os.environ.get("ML4_KILL_MATRIX_PROFILES", "offline,fast,real").split(",")
                 if p.strip())
#: The property each test here records for the session tally (tests/conftest.py reads it).
PROPERTY = "ml4_killmatrix"
VERDICT_KEYS = ("killed_by", "measurement", "skipped", "pending")


@dataclass(frozen=True)
class Kill:
    """One way of breaking the deployment, as pytest options for a ``--sim`` run."""

    name: str
    why: str
    args: tuple[str, ...]
    #: Kills of one group run in one subprocess: only for faults whose effects touch disjoint checks (each check
    #: is still judged by its own kill's regex), to keep the matrix's CI cost down.
    group: str


@dataclass(frozen=True)
class Expect:
    """A check's expected failure under one kill: the regex, and which parametrized instances it covers."""

    message: str
    only: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()

    def covers(self, node: str) -> bool:
        param = param_id(node)
        if param is None:
            return True
        return any(matches(param, p) for p in self.only) and not any(matches(param, p) for p in self.exclude)


@dataclass
class Check:
    key: str                                  # "suites/test_x.py::test_name"
    killed_by: dict[str, Expect] = field(default_factory=dict)
    measurement: str | None = None
    skipped: str | None = None
    pending: str | None = None
    pending_params: dict[str, str] = field(default_factory=dict)
    #: Parametrized instances that do not apply on this target (a preflight rule with no document of its kinds):
    #: the healthy run must show them skipped, with the reason given here.
    skipped_params: dict[str, str] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return next(k for k in VERDICT_KEYS if getattr(self, k))

    @property
    def gating(self) -> bool:
        return self.kind in ("killed_by", "pending")


@dataclass
class Matrix:
    target: str
    common_args: tuple[str, ...]
    profiles: dict[str, tuple[str, ...]]
    #: Profiles whose checks need no endpoint (preflight, config checks): run without ``--sim``, in seconds.
    offline: frozenset[str]
    profile_of: dict[str, str]
    kills: dict[str, Kill]
    checks: dict[str, Check]

    def profile(self, key: str) -> str:
        file = key.split("::", 1)[0]
        if file not in self.profile_of:
            raise MatrixError(f"{self.target}: profile_of names no timing profile for {file}")
        return self.profile_of[file]


class MatrixError(ValueError):
    """A malformed matrix file; the message names the file and the entry."""


def matches(name: str, pattern: str) -> bool:
    """``*`` is the only wildcard (parametrize ids hold brackets and dashes)."""
    escaped = "".join("[[]" if ch == "[" else "[]]" if ch == "]" else ch for ch in pattern)
    return fnmatch.fnmatchcase(name, escaped)


def function_key(node: str) -> str:
    return node.split("[", 1)[0]


def param_id(node: str) -> str | None:
    return node[node.index("[") + 1:-1] if "[" in node else None


def _expect(path: Path, key: str, kill: str, raw: Any) -> Expect:
    if isinstance(raw, str):
        return Expect(raw)
    if not isinstance(raw, dict) or "message" not in raw:
        raise MatrixError(f"{path.name}: {key}: killed_by.{kill} must be a regex or {{message, only, except}}")
    return Expect(str(raw["message"]), tuple(raw.get("only", ["*"])), tuple(raw.get("except", [])))


def _check(path: Path, key: str, raw: dict[str, Any]) -> Check:
    given = [k for k in VERDICT_KEYS if raw.get(k)]
    if len(given) != 1:
        raise MatrixError(f"{path.name}: {key}: give exactly one of {', '.join(VERDICT_KEYS)} (got {given or 'none'})")
    killed = {kill: _expect(path, key, kill, v) for kill, v in (raw.get("killed_by") or {}).items()}
    return Check(key, killed, raw.get("measurement"), raw.get("skipped"), raw.get("pending"),
                 dict(raw.get("pending_params") or {}), dict(raw.get("skipped_params") or {}))


def _kill_args(spec: dict[str, Any]) -> tuple[str, ...]:
    places = {"killmatrix": str(MATRIX_DIR), "fixtures": str(REPO / "fixtures"),
              "preflight": str(REPO / "fixtures" / "preflight")}
    args = [a for f in spec.get("faults", []) for a in ("--ml4-fault", str(f))]
    for arg in spec.get("args", []):
        arg = str(arg).format(**places)
        if arg.startswith("--preflight-path=") and "*" in arg:   # one option per matching folder
            args += [f"--preflight-path={p}" for p in sorted(iglob(arg.split("=", 1)[1]))]
        else:
            args.append(arg)
    return tuple(args)


def load_matrix(target: str) -> Matrix:
    path = MATRIX_DIR / f"{target}.yaml"
    data = yaml.safe_load(path.read_text())
    if data.get("target") != target:
        raise MatrixError(f"{path.name}: target is {data.get('target')!r}, the file name says {target!r}")
    kills = {name: Kill(name, str(spec.get("why", "")), _kill_args(spec), str(spec.get("group", name)))
             for name, spec in data["kills"].items()}
    checks = {key: _check(path, key, raw or {}) for key, raw in data["checks"].items()}
    for c in checks.values():
        unknown = sorted(set(c.killed_by) - set(kills))
        if unknown:
            raise MatrixError(f"{path.name}: {c.key}: killed_by names undefined kills {unknown}")
    profiles, offline = {}, set()
    for name, spec in data["profiles"].items():
        spec = spec if isinstance(spec, dict) else {"args": spec}
        profiles[name] = tuple(map(str, spec.get("args") or []))
        if spec.get("sim", True) is False:
            offline.add(name)
    return Matrix(target, tuple(map(str, data.get("common_args", []))), profiles, frozenset(offline),
                  dict(data["profile_of"]), kills, checks)


# ------------------------------------------------------------------------------------------------ subprocess runs
_COLLECTED: dict[str, list[str]] = {}


def collected(target: str) -> list[str]:
    """Node ids of ``suites/`` for the target (one collection subprocess per target and session)."""
    if target not in _COLLECTED:
        out = subprocess.run([sys.executable, "-m", "pytest", "suites", "--target", target, "--collect-only", "-q",
                              "-p", "no:randomly", "-p", "no:cacheprovider"], cwd=REPO, capture_output=True,
                             text=True, timeout=300, env=_env(), check=False)
        nodes = [line.strip() for line in out.stdout.splitlines() if line.startswith("suites/")]
        assert nodes, f"collecting suites/ for {target} found nothing:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        _COLLECTED[target] = nodes
    return _COLLECTED[target]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


@dataclass
class Outcome:
    status: str      # passed | failed | skipped
    text: str


def read_junit(path: Path) -> dict[str, Outcome]:
    """JUnit XML -> node id (``suites/test_x.py::name[param]``) -> outcome."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        bad = case.find("failure")
        bad = case.find("error") if bad is None else bad
        if bad is not None:
            out[node] = Outcome("failed", (bad.get("message") or "") + "\n" + (bad.text or ""))
        elif case.find("skipped") is not None:
            out[node] = Outcome("skipped", case.find("skipped").get("message") or "")
        else:
            out[node] = Outcome("passed", "")
    return out


def run_suites(matrix: Matrix, nodes: list[str], profile: str, extra: tuple[str, ...], tmp: Path) -> dict[str, Outcome]:
    junit = tmp / "junit.xml"
    sim = [] if profile in matrix.offline else ["--sim"]
    cmd = [sys.executable, "-m", "pytest", *nodes, "--target", matrix.target, *sim, *matrix.common_args,
           *matrix.profiles[profile], *extra, "--ml4-reports", str(tmp / "reports"), f"--junitxml={junit}",
           "-p", "no:randomly", "-p", "no:cacheprovider", "-q"]
    # A failing run is the point of a kill: the exit status is read from the JUnit XML, not checked here.
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=RUN_TIMEOUT_S, env=_env(),
                          check=False)
    assert junit.is_file(), (f"the run wrote no JUnit XML (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-2000:]}")
    outcomes = read_junit(junit)
    missing = [n for n in nodes if n not in outcomes]
    assert not missing, f"selected but not reported: {missing[:5]}\n{proc.stdout[-2000:]}"
    return outcomes


# ------------------------------------------------------------------------------------------------ parametrization
def _kill_runs() -> list[Any]:
    params = []
    for target in TARGETS:
        m = load_matrix(target)
        for group in dict.fromkeys(k.group for k in m.kills.values()):
            kills = {k.name for k in m.kills.values() if k.group == group}
            profiles = sorted({m.profile(c.key) for c in m.checks.values() if kills & set(c.killed_by)})
            params += [pytest.param(target, group, p, id=f"{target}-{group}-{p}") for p in profiles if p in PROFILES]
    return params


def _healthy_runs() -> list[Any]:
    return [pytest.param(t, p, id=f"{t}-{p}") for t in TARGETS
            for p in sorted({load_matrix(t).profile(c.key) for c in load_matrix(t).checks.values() if not c.pending})
            if p in PROFILES]


def _nodes_of(target: str, check: Check, expect: Expect | None = None) -> list[str]:
    nodes = [n for n in collected(target) if function_key(n) == check.key]
    return [n for n in nodes if expect is None or expect.covers(n)]


# ------------------------------------------------------------------------------------------------ the tests
@pytest.mark.parametrize("target", TARGETS)
def test_matrix_names_every_suite_test(target: str, record_property: Any) -> None:
    """Caught when added: no suite test may go without a killer, a measurement reason or a pending reason."""
    m = load_matrix(target)
    functions = {function_key(n) for n in collected(target)}
    missing = sorted(functions - set(m.checks))
    stale = sorted(set(m.checks) - functions)
    assert not missing, f"{target}: suite tests with no entry in fixtures/killmatrix/{target}.yaml: {missing}"
    assert not stale, f"{target}: fixtures/killmatrix/{target}.yaml names tests suites/ no longer has: {stale}"
    unused = sorted(set(m.kills) - {k for c in m.checks.values() for k in c.killed_by})
    assert not unused, f"{target}: kills no check names: {unused}"
    for c in m.checks.values():
        for kill, expect in c.killed_by.items():
            assert _nodes_of(target, c, expect), f"{target}: {c.key} under {kill}: no collected instance selected"
    # A check with unproven parametrized instances (pending_params) counts as pending in the tally, not killed.
    kinds = {k: "pending" if c.pending_params else c.kind for k, c in m.checks.items()}
    record_property(PROPERTY, json.dumps({"target": target, "checks": kinds,
                                          "pending": {k: c.pending for k, c in m.checks.items() if c.pending}}))


@pytest.mark.parametrize(("target", "profile"), _healthy_runs())
def test_healthy_simulator_passes_every_check(target: str, profile: str, tmp_path: Path,
                                              record_property: Any) -> None:
    """Without a fault every listed check passes (the "passes without it" half of each pair)."""
    m = load_matrix(target)
    # Pending checks are unproven both ways: their healthy pass belongs to the proof still to come.
    checks = [c for c in m.checks.values() if m.profile(c.key) == profile and not c.pending]
    nodes = [n for c in checks for n in _nodes_of(target, c)]
    outcomes = run_suites(m, nodes, profile, (), tmp_path)
    bad = []
    for c in checks:
        def want(node: str, c: Check = c) -> str:
            return "skipped" if c.skipped or param_id(node) in c.skipped_params else "passed"
        # A pending parametrized instance (pending_params) is unproven both ways, like a pending check.
        wrong = [f"{n}: {outcomes[n].status} (want {want(n)}) {outcomes[n].text[:300]}" for n in _nodes_of(target, c)
                 if outcomes[n].status != want(n) and param_id(n) not in c.pending_params]
        bad += wrong
        record_property(f"{PROPERTY}:{c.key}", json.dumps({"target": target, "check": c.key, "healthy": not wrong}))
    assert not bad, f"{target} ({profile}): checks that do not behave on a healthy simulator:\n" + "\n".join(bad)


@pytest.mark.parametrize(("target", "group", "profile"), _kill_runs())
def test_kill_fails_the_checks_it_names(target: str, group: str, profile: str, tmp_path: Path,
                                        record_property: Any) -> None:
    """Under the kill (or its group), every check that names it fails, with a message matching its regex."""
    m = load_matrix(target)
    kills = [k for k in m.kills.values() if k.group == group]
    pairs = [(c, k.name, c.killed_by[k.name]) for k in kills for c in m.checks.values()
             if k.name in c.killed_by and m.profile(c.key) == profile]
    nodes = list(dict.fromkeys(n for c, _, e in pairs for n in _nodes_of(target, c, e)))
    outcomes = run_suites(m, nodes, profile, tuple(a for k in kills for a in k.args), tmp_path)
    problems = []
    for c, kill, e in pairs:
        wrong = []
        for n in _nodes_of(target, c, e):
            o = outcomes[n]
            if o.status != "failed":
                wrong.append(f"{n}: {o.status} under {kill} ({m.kills[kill].why})")
            elif not re.search(e.message, o.text):
                wrong.append(f"{n}: failed, but not naming the defect /{e.message}/: {o.text[:400]}")
        problems += wrong
        record_property(f"{PROPERTY}:{c.key}:{kill}",
                        json.dumps({"target": target, "check": c.key, "kill": kill, "ok": not wrong}))
    assert not problems, f"{target}: kill group {group!r} ({profile}):\n" + "\n".join(problems)
