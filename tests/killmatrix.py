"""The kill-matrix harness: matrix files, suite runs, and how a run is judged.

``tests/test_kill_matrix.py`` holds the tests; ``tests/test_kill_matrix_harness.py`` proves the harness itself.
Kept apart from the tests so the harness's tests can drive it on a doctored copy of ``suites/``.

A run is judged by each check's *verdict code* (``pytest_ml4.checks.codes``): the ``[code]`` leading the failure
message, raised from a function declared to raise it (``@fails_with``; the origin the plugin
records as the JUnit property ``ml4_verdict_origin``). An optional ``message:`` regex is matched against the failure
message only where the code alone cannot say which of several kills it was: the message of the exception the
check raised, without pytest's ``assert ...`` explanation. Never the traceback: it holds the check's source, so a
regex that matches a literal in the source would be satisfied by any failure after that line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from glob import iglob
from pathlib import Path
from typing import Any

from killmatrix_file import (
    VERDICT_KEYS,
    CheckEntry,
    ExpectEntry,
    KillEntry,
    MatrixError,
    matches,
    resolve,
)

from pytest_ml4.checks.codes import declared_origins, declared_places, origin_allowed
from pytest_ml4.locations import BUNDLED_TARGETS_DIR

REPO = Path(__file__).resolve().parent.parent
#: ``ML4_KILL_MATRIX_DIR``: another folder of matrices (the harness's own tests run the kill matrix on doctored
#: copies in a subprocess); the repository's by default.
MATRIX_DIR = Path(os.environ.get("ML4_KILL_MATRIX_DIR") or REPO / "fixtures" / "killmatrix")
#: Every target the project ships: a target without a matrix file fails ``test_matrix_names_every_suite_test``.
ALL_TARGETS = sorted(p.stem for p in BUNDLED_TARGETS_DIR.glob("*.yaml"))
TARGETS = [t for t in ALL_TARGETS if (MATRIX_DIR / f"{t}.yaml").is_file()]
#: The longest nightly run, gb300-disagg's recovery_slow (two rolling restarts of four pods that each serve 75 s
#: after deletion), passed 600 s; the limit only bounds a run that hangs.
RUN_TIMEOUT_S = 1500
#: How long a run past its limit gets after SIGTERM to end what it started (the plugin's session end stops its
#: deployment's process groups) before SIGKILL, which would leave those processes running.
STOP_GRACE_S = 60
#: How a not-judged check's skip reason starts (pytest_ml4.checks.verdict.NOT_JUDGED_PREFIX; kept literal so the
#: harness reads the JUnit XML as any reader of it would).
NOT_JUDGED = "not judged: "


@dataclass(frozen=True)
class Collateral:
    """A check of the run, not named by the kill, that the kill is allowed to move off its healthy outcome."""

    why: str
    #: The one outcome allowed (``failed``, ``skipped`` or ``not_judged``: a skip whose reason starts with
    #: ``not judged: ``); None: any of them.
    outcome: str | None = None

    def allows(self, outcome: Outcome) -> bool:
        if outcome.status == "error":
            return False          # a setup error is the harness's, never the kill's
        return outcome.kind != "passed" if self.outcome is None else outcome.kind == self.outcome


@dataclass(frozen=True)
class Kill:
    """One way of breaking the deployment, as pytest options for a ``--sim`` run.

    ``breaks`` (faults and the options that ARE the breakage: a recorded broken log or config, a broken setting)
    go to the kill's run only; ``args`` (conditions: no proxy, a shorter sweep, a threshold) go to the kill's run
    AND its control, which must pass the checks the kill names. A kill without ``args`` has the healthy run as
    its control.
    """

    name: str
    why: str
    breaks: tuple[str, ...]
    args: tuple[str, ...]
    #: Kills of one group run in one subprocess: only for faults whose effects touch disjoint checks (each check
    #: is still judged by its own kill's regex, so a wrong grouping fails the test), to keep CI cost down.
    group: str
    #: Checks of the run, not named by the kill, that it may move off their healthy outcome (fail, skip, leave not
    #: judged): check key -> why (and, optionally, the one outcome allowed).
    collateral: dict[str, Collateral] = field(default_factory=dict)
    #: Why the kill's runs are too heavy for CI (they run in scripts/nightly.sh); empty: they run in CI.
    nightly: str = ""

    @property
    def control(self) -> str:
        """The run that shows the kill's conditions alone pass its checks."""
        return "healthy" if not self.args else "control " + " ".join(self.args)


@dataclass(frozen=True)
class Expect:
    """A check's expected failure under one kill: its verdict code, a message regex where the code alone cannot
    tell which kill it was, and which parametrized instances it covers."""

    code: str | None = None
    message: str | None = None
    only: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    #: Instances of one check that fail on different verdicts under the same kill (a streamed answer's grammar, a
    #: non-streamed one's content): one expectation per group of instances, each with its ``only``/``except``.
    parts: tuple[Expect, ...] = ()

    def for_node(self, node: str) -> Expect:
        """The expectation judging one instance (the part covering it, for a kill given as a list)."""
        return next((p for p in self.parts if p.covers(node)), self)

    def pattern(self, node: str) -> str | None:
        """The regex for one instance: ``<param>`` stands for its parametrize id (a preflight rule's name must
        then be the rule that fired, on its own broken config)."""
        return None if self.message is None else self.message.replace("<param>", re.escape(param_id(node) or ""))

    def covers(self, node: str) -> bool:
        if self.parts:
            return any(p.covers(node) for p in self.parts)
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

    def healthy_status(self, node: str) -> str:
        return "skipped" if self.healthy_skip(node) is not None else "passed"

    def healthy_skip(self, node: str) -> str | None:
        """The reason a healthy run must skip the instance with (the matrix's ``skipped``/``skipped_params``
        text, found in the skip's reason), or None: it must pass."""
        return self.skipped or self.skipped_params.get(param_id(node) or "")

    def uncovered(self, nodes: list[str]) -> list[str]:
        """Parametrized instances of a killed check that no kill selects and no ``pending_params`` or
        ``skipped_params`` entry explains: each instance is proven or says why it is not."""
        if self.kind != "killed_by":
            return []
        return [n for n in nodes if param_id(n) is not None
                and param_id(n) not in self.pending_params and param_id(n) not in self.skipped_params
                and not any(e.covers(n) for e in self.killed_by.values())]


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
    #: Profiles whose runs (healthy, kills, controls) are too heavy for CI on this target: profile -> why. They
    #: run in scripts/nightly.sh; CI's tally names their checks as not run.
    nightly: dict[str, str] = field(default_factory=dict)

    def profile(self, key: str) -> str:
        file = suite_file(key)
        if file not in self.profile_of:
            raise MatrixError(f"{self.target}: profile_of names no timing profile for {file}")
        return self.profile_of[file]

    def named(self, kills: list[Kill], profile: str) -> list[tuple[Check, str, Expect]]:
        """(check, kill, expectation) for every check of the profile that one of the kills names."""
        return [(c, k.name, c.killed_by[k.name]) for k in kills for c in self.checks.values()
                if k.name in c.killed_by and self.profile(c.key) == profile]


def function_key(node: str) -> str:
    return node.split("[", 1)[0]


def suite_file(key: str) -> str:
    return key.split("::", 1)[0]


def param_id(node: str) -> str | None:
    return node[node.index("[") + 1:-1] if "[" in node else None


# ------------------------------------------------------------------------------------------------ loading
def _expect(entry: ExpectEntry | list[ExpectEntry]) -> Expect:
    """The file's expectation (validated by :class:`killmatrix_file.ExpectEntry`) as the harness judges by it."""
    if isinstance(entry, list):
        return Expect(parts=tuple(_expect(part) for part in entry))
    return Expect(entry.code, entry.message, tuple(entry.only), tuple(entry.except_))


def _check(key: str, entry: CheckEntry) -> Check:
    return Check(key, {kill: _expect(e) for kill, e in entry.killed_by.items()}, entry.measurement, entry.skipped,
                 entry.pending, dict(entry.pending_params), dict(entry.skipped_params))


def _options(raw: list[str]) -> tuple[str, ...]:
    places = {"killmatrix": str(MATRIX_DIR), "fixtures": str(REPO / "fixtures"),
              "preflight": str(REPO / "fixtures" / "preflight")}
    args: list[str] = []
    for arg in raw:
        arg = arg.format(**places)
        if arg.startswith("--preflight-path=") and "*" in arg:   # one option per matching folder
            args += [f"--preflight-path={p}" for p in sorted(iglob(arg.split("=", 1)[1]))]
        else:
            args.append(arg)
    return tuple(args)


def _kill(name: str, entry: KillEntry) -> Kill:
    faults = tuple(a for f in entry.faults for a in ("--ml4-fault", f))
    return Kill(name, entry.why, faults + _options(entry.breaks), _options(entry.args), entry.group or name,
                {key: Collateral(c.why, c.outcome) for key, c in entry.collateral.items()}, entry.nightly)


def flattened(target: str, directory: Path = MATRIX_DIR) -> dict[str, Any]:
    """The target's matrix as one file without ``base`` would give it (its bases' entries merged in)."""
    m = resolve(target, directory)
    dump = {"mode": "json", "by_alias": True, "exclude_defaults": True}
    return {"target": target, "common_args": list(m.common_args),
            "profiles": {name: p.model_dump(**dump) for name, p in (m.profiles or {}).items()},
            "profile_of": dict(m.profile_of or {}),
            "kills": {name: k.model_dump(**dump) for name, (k, _) in m.kills.items()},
            "checks": {key: c.model_dump(**dump) for key, (c, _) in m.checks.items()}}


def load_matrix(target: str, directory: Path = MATRIX_DIR) -> Matrix:
    """The target's matrix (``<target>.yaml`` over its bases); a bad file is one :class:`MatrixError` line naming
    the file, the line and the field."""
    m = resolve(target, directory)
    assert m.profiles is not None and m.profile_of is not None      # resolve() refuses a matrix without them
    return Matrix(target, tuple(m.common_args), {name: tuple(p.args) for name, p in m.profiles.items()},
                  frozenset(name for name, p in m.profiles.items() if not p.sim), dict(m.profile_of),
                  {name: _kill(name, k) for name, (k, _) in m.kills.items()},
                  {key: _check(key, c) for key, (c, _) in m.checks.items()},
                  {name: p.nightly for name, p in m.profiles.items() if p.nightly})


# ------------------------------------------------------------------------------------------------ subprocess runs
_COLLECTED: dict[tuple[str, Path], list[str]] = {}


def env() -> dict[str, str]:
    out = dict(os.environ)
    out.pop("PYTEST_XDIST_WORKER", None)
    out.pop("PYTEST_ADDOPTS", None)
    return out


def collected(target: str, root: Path = REPO) -> list[str]:
    """Node ids of ``suites/`` for the target (one collection subprocess per target, root and session)."""
    if (target, root) not in _COLLECTED:
        out = subprocess.run([sys.executable, "-m", "pytest", "suites", "--target", target, "--collect-only", "-q",
                              "-p", "no:randomly", "-p", "no:cacheprovider"], cwd=root, capture_output=True,
                             text=True, timeout=300, env=env(), check=False)
        nodes = [line.strip() for line in out.stdout.splitlines() if line.startswith("suites/")]
        assert nodes, f"collecting suites/ for {target} found nothing:\n{out.stdout[-2000:]}\n{out.stderr[-2000:]}"
        _COLLECTED[(target, root)] = nodes
    return _COLLECTED[(target, root)]


@dataclass
class Outcome:
    #: passed | failed | skipped | error (an error outside the check's own call: fixture setup or teardown, a
    #: collection error; the harness's, never a verdict)
    status: str
    #: The failure's message (never its traceback) or the skip's reason.
    message: str
    #: The verdict code leading the failure message (``[area.property] ...``), if any.
    code: str | None = None
    #: ``module.function`` that raised the verdict (the plugin's JUnit property ``ml4_verdict_origin``), if any.
    origin: str | None = None

    @property
    def kind(self) -> str:
        """The status, with a not-judged skip told apart from a skip (``not_judged``)."""
        return "not_judged" if self.status == "skipped" and self.message.startswith(NOT_JUDGED) else self.status


#: ``[area.property]`` at the start of a failure message, after pytest's ``module.ExceptionName: `` prefix.
_LEADING_CODE = re.compile(r"^(?:[\w.]+: )?\[([a-z0-9_]+(?:\.[a-z0-9_]+)+)\]")


def leading_code(message: str) -> str | None:
    """The verdict code a failure message starts with (pytest writes ``module.Violation: [code] message``)."""
    found = _LEADING_CODE.match(message)
    return found.group(1) if found else None


#: pytest's explanation of a rewritten ``assert`` starts on the line after the message (or replaces it).
_EXPLANATION = re.compile(r"(?m)^assert ")


def _last_e_block(text: str) -> str | None:
    """The last run of pytest's ``E`` lines (the final exception's text, never source lines), dedented."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in text.splitlines():
        if line == "E" or line.startswith("E "):
            current.append(line[1:])
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return textwrap.dedent("\n".join(blocks[-1])) if blocks else None


def failure_message(element: ET.Element) -> str:
    """The message of a JUnit ``<failure>``/``<error>``: the exception's text, without pytest's ``assert`` explanation.

    Read from pytest's ``E`` lines of the final exception (the element's ``message`` attribute when there are
    none). Never the rest of the traceback: it holds the check's source. The explanation repeats the asserted
    expression's values and the functions it called: not the check's verdict either.
    """
    message = _last_e_block(element.text or "") or element.get("message") or ""
    cut = _EXPLANATION.search(message)
    return message[:cut.start()].rstrip("\n") if cut else message


def read_junit(path: Path) -> dict[str, Outcome]:
    """JUnit XML -> node id (``suites/test_x.py::name[param]``) -> outcome."""
    out = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        node = case.get("classname", "").replace(".", "/") + ".py::" + case.get("name", "")
        bad = case.find("failure")
        bad = case.find("error") if bad is None else bad
        skipped = case.find("skipped")
        if bad is not None:
            # pytest writes <error> for what failed outside the test's call (setup, teardown, collection).
            status = "failed" if bad.tag == "failure" else "error"
            message = failure_message(bad)
            if status == "error":
                out[node] = Outcome(status, f"{bad.get('message')}: {message}")
            else:
                props = {p.get("name"): p.get("value") for p in case.iter("property")}
                out[node] = Outcome(status, message, leading_code(message), props.get("ml4_verdict_origin"))
        elif skipped is not None:
            out[node] = Outcome("skipped", skipped.get("message") or "")
        else:
            out[node] = Outcome("passed", "")
    return out


def suite_command(matrix: Matrix, nodes: list[str], profile: str, extra: tuple[str, ...], tmp: Path) -> list[str]:
    """The pytest command of one run: its nodes on the target, the profile's options, then ``extra``; JUnit XML
    goes to ``tmp/junit.xml``."""
    sim = [] if profile in matrix.offline else ["--sim"]
    return [sys.executable, "-m", "pytest", *nodes, "--target", matrix.target, *sim, *matrix.common_args,
            *matrix.profiles[profile], *extra, "--ml4-reports", str(tmp / "reports"),
            f"--junitxml={tmp / 'junit.xml'}", "-p", "no:randomly", "-p", "no:cacheprovider", "-q"]


def run_suites(matrix: Matrix, nodes: list[str], profile: str, extra: tuple[str, ...], tmp: Path,
               root: Path = REPO) -> dict[str, Outcome]:
    junit = tmp / "junit.xml"
    cmd = suite_command(matrix, nodes, profile, extra, tmp)
    # A failing run is the point of a kill: the exit status is read from the JUnit XML, not checked here.
    proc = run_bounded(cmd, root, RUN_TIMEOUT_S)
    assert junit.is_file(), (f"the run wrote no JUnit XML (rc {proc.returncode}):\n{proc.stdout[-3000:]}\n"
                             f"{proc.stderr[-2000:]}")
    outcomes = read_junit(junit)
    missing = [n for n in nodes if n not in outcomes]
    assert not missing, f"selected but not reported: {missing[:5]}\n{proc.stdout[-2000:]}"
    return outcomes


def run_bounded(cmd: list[str], cwd: Path, timeout_s: float,
                grace_s: float = STOP_GRACE_S) -> subprocess.CompletedProcess[str]:
    """Run a pytest subprocess; past ``timeout_s`` stop it with SIGTERM first, so that it ends the deployment it
    started (subprocess.run's timeout sends SIGKILL, which left a frontend and four workers running for the rest
    of a nightly run), and fail naming the limit."""
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env())
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.terminate()
        try:
            out, err = proc.communicate(timeout=grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        raise AssertionError(f"the run passed its {timeout_s:g} s limit and was stopped (SIGTERM, then "
                             f"{grace_s:g} s for its clean-up): {' '.join(cmd[3:5])} ...\n{out[-2000:]}\n"
                             f"{err[-1000:]}") from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def nodes_of(target: str, check: Check, expect: Expect | None = None, root: Path = REPO) -> list[str]:
    nodes = [n for n in collected(target, root) if function_key(n) == check.key]
    return [n for n in nodes if expect is None or expect.covers(n)]


# ------------------------------------------------------------------------------------------------ judging
@dataclass
class KillRun:
    """What one kill run selects: the checks its kills name, and the rest of their suite files (collateral)."""

    named: list[tuple[Check, str, Expect, str]]       # (check, kill, expectation, node)
    collateral: list[tuple[Check, str]]                # (check, node) that must behave as on a healthy run
    allowed: dict[str, Collateral]                     # collateral check key -> why the kill may move it
    #: Every selected node in the suites' own order: module fixtures (a restart scenario, a load) then run in the
    #: order a plain run of the suites has, whatever the kill names.
    nodes: list[str] = field(default_factory=list)


def plan_kill_run(m: Matrix, kills: list[Kill], profile: str, root: Path = REPO) -> KillRun:
    named = [(c, k, e, n) for c, k, e in m.named(kills, profile) for n in nodes_of(m.target, c, e, root)]
    taken = {n for *_, n in named}
    files = {suite_file(c.key) for c, *_ in named}
    collateral = [(c, n) for c in m.checks.values()
                  if suite_file(c.key) in files and not c.pending
                  for n in nodes_of(m.target, c, root=root)
                  if n not in taken and param_id(n) not in c.pending_params]
    allowed = {key: why for k in kills for key, why in k.collateral.items()}
    selected = {n for *_, n in named} | {n for _, n in collateral}
    return KillRun(named, collateral, allowed, [n for n in collected(m.target, root) if n in selected])


def judge_named(outcome: Outcome, node: str, kill: Kill, expect: Expect) -> str | None:
    """Why the named check did not fail as its kill requires, or None: the code it raised, the place it raised it
    from (a function declared to raise it), and the message where the matrix gives a regex."""
    expect = expect.for_node(node)
    if outcome.status != "failed":
        return f"{node}: {outcome.status} under {kill.name} ({kill.why})"
    if expect.code is not None:
        if outcome.code != expect.code:
            return (f"{node}: failed with code {outcome.code or 'none'}, not {expect.code}: "
                    f"{outcome.message[:400]}")
        if outcome.origin is None:
            return (f"{node}: [{expect.code}] is in the message but no verdict raised it (no recorded origin): "
                    f"{outcome.message[:300]}")
        if not origin_allowed(expect.code, outcome.origin):
            return (f"{node}: raised [{expect.code}] from {outcome.origin}, not from "
                    f"{', '.join(declared_origins(expect.code))} "
                    f"(declared at {', '.join(declared_places(expect.code))}): {outcome.message[:300]}")
    pattern = expect.pattern(node)
    if pattern is not None and not re.search(pattern, outcome.message):
        return f"{node}: failed, but its message does not name the defect /{pattern}/: {outcome.message[:400]}"
    return None


def judge_harness(outcome: Outcome, node: str) -> str | None:
    """An error outside the check's call (a fixture's setup or teardown, collection) is a harness error: never a
    kill, never a healthy outcome, never allowed as collateral."""
    if outcome.status == "error":
        return f"{node}: harness error, not a verdict of the check: {outcome.message[:400]}"
    return None


def allowance(key: str, allowed: dict[str, Collateral]) -> Collateral | None:
    """The collateral entry covering a check: its own key, else the first pattern (``suites/test_x.py::*``: a kill
    that breaks every check of a file, or every request, says so once) that matches it."""
    if key in allowed:
        return allowed[key]
    return next((c for pattern, c in allowed.items() if "*" in pattern and matches(key, pattern)), None)


def judge_collateral(outcome: Outcome, node: str, check: Check, allowed: dict[str, Collateral]) -> str | None:
    """A check of the run the kill does not name must behave as on a healthy run (pass, or skip with its reason):
    failing, skipping or ending not judged under the kill is collateral unless the matrix lists it with a reason
    (and, if stated, that very outcome)."""
    off = judge_harness(outcome, node) or judge_healthy(outcome, node, check)
    listed = allowance(check.key, allowed)
    if off is None or (listed is not None and listed.allows(outcome)):
        return None
    why = (f"listed for {listed.outcome} only" if listed is not None
           else "not named by the kill, not listed under its collateral")
    return f"collateral {outcome.kind} ({why}): {off}"


def collateral_problems(m: Matrix, plan: KillRun, outcomes: dict[str, Outcome]) -> list[str]:
    """Every node the run reported, in every suite file it ran, other than the checks the kills name, judged as
    collateral (pending checks and instances are unproven both ways and left out)."""
    named = {n for *_, n in plan.named}
    problems = []
    for node, outcome in outcomes.items():
        check = m.checks.get(function_key(node))
        if node in named or (check is not None and (check.pending or param_id(node) in check.pending_params)):
            continue
        if check is None:
            problems.append(f"{node}: reported by the run, but the matrix has no entry for it")
        elif (wrong := judge_collateral(outcome, node, check, plan.allowed)) is not None:
            problems.append(wrong)
    return problems


def judge_healthy(outcome: Outcome, node: str, check: Check) -> str | None:
    """Passed, or skipped with the reason the matrix gives (a not-judged skip never stands for a skip)."""
    if (harness := judge_harness(outcome, node)) is not None:
        return harness
    want = check.healthy_status(node)
    if outcome.status != want or outcome.kind == "not_judged":
        return f"{node}: {outcome.kind} (want {want}) {outcome.message[:300]}"
    reason = check.healthy_skip(node)
    if reason is not None and " ".join(reason.split()) not in " ".join(outcome.message.split()):
        return f"{node}: skipped, but not for the matrix's reason {reason!r}: {outcome.message[:300]}"
    return None
