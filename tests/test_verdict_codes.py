"""Stable verdict codes: the code travels beside the message, an undeclared code is refused where it is raised."""

from __future__ import annotations

import pytest

from pytest_ml4.checks import codes


def _declare(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    monkeypatch.setattr(codes, "known_codes", lambda: {n: "test code" for n in names})


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


def test_the_declared_codes_file_is_a_mapping_of_dotted_lowercase_names() -> None:
    for code, what in codes.known_codes().items():
        area, _, prop = code.partition(".")
        assert area and prop and code == code.lower(), f"{codes.CODES_FILE}: {code!r} is not <area>.<property>"
        assert what.strip(), f"{codes.CODES_FILE}: {code!r} says nothing of the property it stands for"


def test_every_declared_origin_names_a_function_that_exists() -> None:
    """A ``from:`` naming a function that was renamed or never existed would make every kill of its code fail with
    a misleading origin message: each one names a ``def`` in its module (a suite's module by its file name)."""
    import importlib
    import inspect
    from pathlib import Path

    suites = Path(__file__).resolve().parent.parent / "suites"
    for code in codes.known_codes():
        for origin in codes.declared_origins(code):
            module, _, function = origin.lstrip("*").rpartition(".")
            if module.startswith("test_"):
                source = (suites / f"{module}.py").read_text(encoding="utf-8")
            else:
                source = inspect.getsource(importlib.import_module(module))
            assert f"def {function}(" in source, f"{codes.CODES_FILE}: {code}: from {origin!r}: no such function"


def test_a_code_raised_elsewhere_than_declared_is_told_apart(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(codes, "_declarations", lambda: {"demo.broken": ("demo", ("pkg.mod.judge_*",)),
                                                         "demo.free": ("demo", ())})
    assert codes.origin_allowed("demo.broken", "pkg.mod.judge_demo")
    assert not codes.origin_allowed("demo.broken", "pkg.mod.ask")
    assert codes.origin_allowed("demo.free", "anything.at_all"), "a plain line declares no origin to judge"
