"""Stable verdict codes: the code travels beside the message, an undeclared code is refused where it is raised, and
each code is declared once, on the function that raises it."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys

import pytest

from pytest_ml4.checks import codes
from pytest_ml4.checks.codes import DeclarationError, declaration, registry


def _declare(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    monkeypatch.setattr(codes, "known_codes", lambda: {n: "test code" for n in names})


def judge_demo() -> None:
    codes.fail("demo.broken", "one and one are not three")


def judge_other_demo() -> None:
    codes.fail("demo.broken", "two and two are not five")


def test_a_violation_carries_its_code_message_and_the_function_that_raised_it(monkeypatch: pytest.MonkeyPatch) -> None:
    _declare(monkeypatch, "demo.broken")

    def judge_demo() -> None:
        codes.require(1 + 1 == 3, "demo.broken", lambda: "one and one are not three")

    with pytest.raises(AssertionError) as info:
        judge_demo()
    violation = info.value
    assert isinstance(violation, codes.Violation)
    assert (violation.code, violation.message) == ("demo.broken", "one and one are not three")
    assert str(violation) == "[demo.broken] one and one are not three"
    assert violation.origin == f"{__name__}.judge_demo"


def test_an_undeclared_code_is_a_programming_error_not_a_verdict(monkeypatch: pytest.MonkeyPatch) -> None:
    _declare(monkeypatch, "demo.broken")
    with pytest.raises(ValueError, match="'demo.typo' is not declared"):
        codes.fail("demo.typo", "x")


def test_a_holding_condition_raises_nothing_and_builds_no_message(monkeypatch: pytest.MonkeyPatch) -> None:
    _declare(monkeypatch, "demo.broken")
    codes.require(True, "demo.broken", lambda: pytest.fail("the message was built for a passing condition"))


def test_a_code_of_another_form_is_refused_where_it_is_declared() -> None:
    place = r"^tests/test_verdict_codes\.py:\d+: "
    with pytest.raises(DeclarationError, match=place + r"verdict code 'Demo\.Broken' is not <area>\.<property>"):
        declaration("Demo.Broken", "demo", judge_demo)
    with pytest.raises(DeclarationError, match=place + r"verdict code 'demo' is not"):
        declaration("demo", "demo", judge_demo)


def test_a_declaration_names_the_function_as_a_violation_names_its_origin(monkeypatch: pytest.MonkeyPatch) -> None:
    """The origin a declaration records is the one the violation records, so the code raised from the declared
    function is allowed and the same code raised from another function is not; a suite's function (imported by
    pytest as ``test_x``, by the registry as ``pytest_ml4.suites.test_x``) is matched by its file's name."""
    declared = declaration("demo.broken", "demo", judge_demo)
    assert declared.origin == f"*{__name__}.judge_demo"
    assert declared.place == f"tests/test_verdict_codes.py:{judge_demo.__code__.co_firstlineno}"
    from pytest_ml4.checks.chat import ask
    assert declaration("chat.request_failed", "", ask).origin == "pytest_ml4.checks.chat.ask"

    monkeypatch.setattr(codes, "_registry", lambda: registry([declared]))
    with pytest.raises(codes.Violation) as raised:
        judge_demo()
    assert codes.origin_allowed("demo.broken", raised.value.origin)
    with pytest.raises(codes.Violation) as elsewhere:
        judge_other_demo()
    assert not codes.origin_allowed("demo.broken", elsewhere.value.origin)
    assert not codes.origin_allowed("demo.undeclared", raised.value.origin)


def test_two_meanings_of_one_code_fail_with_one_line_naming_both_places() -> None:
    first, second = declaration("demo.broken", "one", judge_demo), declaration("demo.broken", "two", judge_other_demo)
    with pytest.raises(DeclarationError) as info:
        registry([first, second])
    message = str(info.value)
    assert "\n" not in message
    assert first.place in message and second.place in message and "'demo.broken' is declared twice" in message


def test_other_raisers_name_the_code_alone_and_one_without_a_meaning_is_refused() -> None:
    given, also = declaration("demo.broken", "demo", judge_demo), declaration("demo.broken", "", judge_other_demo)
    assert registry([also, given]) == {"demo.broken": codes.Code("demo", (also.origin, given.origin),
                                                                 (also.place, given.place))}
    with pytest.raises(DeclarationError, match=r"judge_other_demo fails with 'demo.broken', but no @fails_with gives"):
        registry([also])


def test_a_declaration_made_again_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """A suite module imported by pytest and again by the registry (or a copy of it) declares nothing twice."""
    monkeypatch.setattr(codes, "_DECLARED", {})
    for _ in range(2):
        codes.fails_with("demo.broken", "demo")(judge_demo)
    assert list(codes._DECLARED.values()) == [declaration("demo.broken", "demo", judge_demo)]
    copy = codes.Declaration("demo.broken", "demo", f"*{__name__}.judge_demo", "elsewhere/test_verdict_codes.py:1")
    assert list(registry([*codes._DECLARED.values(), copy])["demo.broken"].origins) == [copy.origin]


def test_the_registry_is_complete_without_running_a_test() -> None:
    """A fresh interpreter that imports only the codes module knows every code, its meaning and its raisers, as
    this session (which has imported the suites and checks in its own way) does."""
    script = ("import json; from pytest_ml4.checks import codes; "
              "print(json.dumps({c: [w, codes.declared_origins(c)] for c, w in codes.known_codes().items()}))")
    fresh = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    here = {code: [what, list(codes.declared_origins(code))] for code, what in codes.known_codes().items()}
    assert json.loads(fresh.stdout) == here


def _function_at(place: str) -> tuple[str, str]:
    """The name and source (signature and body, its decorators left out) of the function declared at ``place``."""
    from pytest_ml4.locations import PACKAGE_PARENT

    file, _, line = place.rpartition(":")
    source = (PACKAGE_PARENT / file).read_text(encoding="utf-8")
    [node] = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)
              and (n.decorator_list[0].lineno if n.decorator_list else n.lineno) == int(line)]
    return node.name, ast.get_source_segment(source, node) or ""


def test_every_code_is_raised_by_the_function_declared_to_raise_it() -> None:
    """A declaration stays on the function that raises its code: the function names the code, or raises the code
    a verdict or an argument carries (``verdict.code``, ``gate.code``: kv's log verdicts, perf's gate results),
    which the package or a suite then names. A raise moved to another function without its declaration fails here."""
    from pytest_ml4.locations import PACKAGE_DIR, suites_dir

    files = [*PACKAGE_DIR.rglob("*.py"), *(suites_dir() or PACKAGE_DIR).glob("*.py")]
    named = "\n".join(line for path in files for line in path.read_text(encoding="utf-8").splitlines()
                      if "@fails_with(" not in line)
    astray = []
    for code in codes.known_codes():
        for origin, place in zip(codes.declared_origins(code), codes.declared_places(code), strict=True):
            name, source = _function_at(place)
            assert origin.endswith(f".{name}"), f"{place}: declared for {origin}, but the function there is {name}"
            literal = re.compile(rf"""["']{re.escape(code)}["']""")
            carried = re.search(r"\.code\b", source) and literal.search(named)
            if not literal.search(source) and not carried:
                astray.append(f"{place}: {origin} is declared to raise {code} but does not")
    assert not astray, "\n".join(astray)
