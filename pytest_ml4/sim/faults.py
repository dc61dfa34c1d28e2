"""Named deployment defects the simulator can be started with (``--fault NAME[=VALUE]``).

Each fault imitates a real misconfiguration or bug of a vLLM deployment and names the check that should catch
it.  Adding a fault is one entry in ``_DEFINITIONS`` plus a ``faults.has("name")`` / ``faults.value("name")``
test where the simulator's behaviour changes.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


class FaultError(ValueError):
    """An unknown fault name or a bad value; the message lists the known faults."""


@dataclass(frozen=True)
class Fault:
    name: str
    description: str
    caught_by: str
    #: ``None``: a switch (no value allowed); otherwise the value used when ``NAME`` is given without ``=VALUE``.
    default: float | None = None
    takes_value: bool = False


@dataclass(frozen=True)
class FaultSpec:
    name: str
    value: float | None = None

    def __str__(self) -> str:
        return self.name if self.value is None else f"{self.name}={self.value:g}"


_DEFINITIONS: tuple[Fault, ...] = (
    Fault("reasoning_parser_off", "reasoning parser disabled: [THINK]...[/THINK] markers leak into content",
          "suites/test_reasoning.py (no control tokens in content, reasoning separated)"),
    Fault("tool_parser_off", "tool parser disabled: '[TOOL_CALLS]name[ARGS]{...}' is returned as text content",
          "suites/test_tools.py (tool_calls present, no control tokens in content)"),
    Fault("invalid_tool_json", "tool-call arguments are not valid JSON",
          "suites/test_tools.py (arguments parse as JSON and validate against the schema)"),
    Fault("bad_tool_ids", "tool-call ids are not Mistral's 9-char alphanumeric ids (chatcmpl-tool-<hex>)",
          "suites/test_tools.py (tool-call id format)"),
    Fault("reasoning_usage_missing", "usage.completion_tokens_details.reasoning_tokens is 0 despite reasoning",
          "suites/test_reasoning.py (reasoning token count agrees)"),
    Fault("no_done", "stream ends without 'data: [DONE]'", "suites/test_smoke.py (stream grammar)"),
    Fault("no_usage_chunk", "stream omits the usage chunk although include_usage was requested",
          "suites/test_smoke.py (stream grammar: usage chunk)"),
    Fault("midstream_error", "in-band 'data: {\"error\": ...}' event in the middle of a stream, then [DONE]",
          "suites/test_smoke.py (stream grammar: error events)"),
    Fault("slow_decode", "inter-token latency multiplied by K (default 3)", "suites/test_perf.py (ITL/decode gates)",
          default=3.0, takes_value=True),
    Fault("ttft_spike", "S seconds added to every time to first token (default 5)",
          "suites/test_perf.py (TTFT gates)", default=5.0, takes_value=True),
    Fault("error_rate", "fraction P of requests answered 500 with vLLM's engine error body (default 0.2)",
          "suites/test_perf.py (request error rate gate), suites/test_smoke.py (parallel burst)",
          default=0.2, takes_value=True),
)

FAULTS: dict[str, Fault] = {f.name: f for f in _DEFINITIONS}

# Issue 16 (accuracy gate): answer-level, applied in the responder so every serving stack shows it.
FAULTS["accuracy_drop"] = Fault(
    "accuracy_drop", "a deterministic fraction P of answers is wrong (a call's argument value altered, or a "
    "spurious call where none belongs; default 0.2)", "suites/test_accuracy.py (BFCL accuracy vs baseline)",
    default=0.2, takes_value=True)


def register(fault: Fault) -> None:
    """Add a fault from another module (later issues); names must be unique."""
    if fault.name in FAULTS:
        raise FaultError(f"fault '{fault.name}' is already registered")
    FAULTS[fault.name] = fault


def parse_fault(spec: str | FaultSpec) -> FaultSpec:
    """``"slow_decode=2"`` -> ``FaultSpec("slow_decode", 2.0)``; unknown names list the known ones."""
    if isinstance(spec, FaultSpec):
        spec = str(spec)
    name, sep, raw = spec.strip().partition("=")
    name = name.strip()
    fault = FAULTS.get(name)
    if fault is None:
        raise FaultError(f"unknown fault '{name}'; known faults: {', '.join(sorted(FAULTS))}")
    if not sep:
        return FaultSpec(name, fault.default if fault.takes_value else None)
    if not fault.takes_value:
        raise FaultError(f"fault '{name}' takes no value (got '{raw}')")
    try:
        value = float(raw)
    except ValueError:
        raise FaultError(f"fault '{name}' needs a number, got '{raw}'") from None
    return FaultSpec(name, value)


class ActiveFaults:
    """The faults one simulator runs with."""

    def __init__(self, specs: Iterable[str | FaultSpec] = ()) -> None:
        self.specs: tuple[FaultSpec, ...] = tuple(parse_fault(s) for s in specs)
        self._by_name = {s.name: s for s in self.specs}

    def has(self, name: str) -> bool:
        return name in self._by_name

    def value(self, name: str, default: float = 0.0) -> float:
        spec = self._by_name.get(name)
        return default if spec is None or spec.value is None else spec.value

    def __bool__(self) -> bool:
        return bool(self.specs)

    def __repr__(self) -> str:
        return f"ActiveFaults({', '.join(map(str, self.specs))})"


def describe() -> str:
    """A table of all faults for ``--help`` and docs."""
    width = max(len(n) for n in FAULTS)
    return "\n".join(f"{f.name.ljust(width)}  {f.description}  [caught by: {f.caught_by}]" for f in FAULTS.values())
