"""No cause without evidence: a Dynamo versions row's cause is named in a tools failure only when the answer or
the engine log proves it; otherwise the failure says what came back and lists the possible causes."""

from __future__ import annotations

from typing import Any

import pytest

from pytest_ml4.checks import tools
from pytest_ml4.checks.chat import Answer, ChatSession
from pytest_ml4.checks.codes import Violation
from pytest_ml4.checks.tools import (
    ToolChat,
    load_tools,
    no_call_verdict,
    refusal_evidence,
)
from pytest_ml4.stacks.dynamo_versions import tool_call_drop_cause

ROW_CAUSE = tool_call_drop_cause("1.6.1", "mistral")
DROPS = "silently drops Mistral Large 4's"
V11 = '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}'
LEGACY = '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}}]'


def _answer(content: Any) -> Answer:
    return Answer(False, {"role": "assistant", "content": content}, "stop", None)


def test_the_rows_dropped_v11_form_is_named_only_when_the_content_shows_it() -> None:
    assert ROW_CAUSE is not None and DROPS in ROW_CAUSE
    shown = no_call_verdict("x", "auto", _answer("[THINK]the weather[/THINK]" + V11), None, ROW_CAUSE)
    assert shown.endswith(ROW_CAUSE) and "possible causes" not in shown, shown
    # Content null: what 1.6.1 answers, and what a model that said nothing answers: listed, not claimed.
    unknown = no_call_verdict("x", "auto", _answer(None), None, ROW_CAUSE)
    assert "the answer shows no cause; possible causes: (1) Dynamo 1.6.1's" in unknown, unknown
    assert "(2) the workers' tool-call parser is not `mistral`" in unknown and "content: 'None'" in unknown


@pytest.mark.parametrize("content", [V11, LEGACY], ids=["v11", "legacy"])
def test_markup_a_mistral_parser_never_leaves_names_the_parser_not_the_release(content: str) -> None:
    """Workers on --dyn-tool-call-parser hermes leave the call at the start of content; a `mistral` parser would
    have parsed it or (1.6.1, v11) dropped it whole: the release's cause is not claimed."""
    verdict = no_call_verdict("streamed", "auto", _answer(content), None, ROW_CAUSE)
    assert DROPS not in verdict and "the workers run another tool-call parser or none" in verdict, verdict


def test_a_declared_parser_other_than_mistral_is_its_own_evidence() -> None:
    cause = tool_call_drop_cause("1.6.1", "hermes")
    assert no_call_verdict("x", "required", _answer(LEGACY), cause, None).endswith(str(cause))


@pytest.mark.parametrize(("failure", "logged", "shown"), [
    ("non-streamed request failed: HTTP 400 BadRequestError: '{\"code\":400}'", (), "the 400 answer"),
    ("in-band error event after HTTP 200: '{\"message\": \"Invalid request\", \"code\": 400}'", (), "the 400 answer"),
    ("non-streamed request failed: HTTP 500 InternalServerError", ("uniqueItems",), "Unimplemented keys"),
    ("non-streamed request failed: HTTP 500 InternalServerError", (), None),
    ("streamed: the stream ended without [DONE]", (), None),
])
def test_a_refusal_is_shown_by_a_400_or_the_grammar_line(failure: str, logged: tuple[str, ...],
                                                        shown: str | None) -> None:
    evidence = refusal_evidence(failure, logged)
    assert (evidence is None) if shown is None else (shown in str(evidence)), evidence


@pytest.fixture
def chat_on_1_6_1(monkeypatch: pytest.MonkeyPatch) -> ToolChat:
    chat = ToolChat.__new__(ToolChat)
    chat.dynamo_version, chat.logs, chat.versions_root = "1.6.1", None, None
    monkeypatch.setattr(tools, "refused_keys_logged", lambda reader, since: ())
    return chat


def _failing_with(monkeypatch: pytest.MonkeyPatch, failure: str) -> None:
    def fail(self: ChatSession, body: dict[str, Any], stream: bool) -> Answer:
        raise AssertionError(failure)
    monkeypatch.setattr(ChatSession, "ask", fail)


def test_a_guided_request_failing_with_500_does_not_read_as_the_rows_refusal(
        chat_on_1_6_1: ToolChat, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: any failure of a guided request on 1.6.1 was reported as the uniqueItems refusal."""
    body = {"tool_choice": "required", "tools": load_tools(["set_alarm"])}
    _failing_with(monkeypatch, "non-streamed request failed: HTTP 500 InternalServerError: 'Internal server error'")
    with pytest.raises(AssertionError) as err:
        chat_on_1_6_1.ask(body, False)
    assert not isinstance(err.value, Violation), err.value
    text = str(err.value)
    assert text.startswith("non-streamed request failed: HTTP 500") and "not shown to be the grammar's refusal" in text
    assert "possible causes: (1) the Dynamo 1.6.1 passes" in text and "(2) the engine or the frontend failed" in text


def test_a_guided_request_refused_with_400_names_the_keyword_with_its_code(
        chat_on_1_6_1: ToolChat, monkeypatch: pytest.MonkeyPatch) -> None:
    body = {"tool_choice": "required", "tools": load_tools(["set_alarm"])}
    _failing_with(monkeypatch, "non-streamed request failed: HTTP 400 BadRequestError: '{\"code\":400}'")
    with pytest.raises(Violation) as err:
        chat_on_1_6_1.ask(body, False)
    assert err.value.code == "tools.guided_refused"
    assert "refuses the keyword `uniqueItems` (tool set_alarm; " in err.value.message
    assert err.value.message.endswith("(shown by the 400 answer)")
    # Not a guided choice, or no refused keyword: the failure passes through unchanged.
    _failing_with(monkeypatch, "HTTP 400 something else")
    with pytest.raises(AssertionError, match=r"^HTTP 400 something else$"):
        chat_on_1_6_1.ask({"tool_choice": "auto", "tools": load_tools(["set_alarm"])}, False)
