"""One chat request, streamed or not, reduced to what the checks compare: :class:`Answer`.

Non-streamed requests go through the openai SDK (what users run); streamed ones through the stream probe over
httpx, so the grammar of every streamed answer is checked too. vLLM extras the SDK has no argument for
(``min_tokens``, ``chat_template_kwargs``, ...) travel in ``extra_body``, which puts them top-level on the wire.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import httpx
import openai

from pytest_ml4.checks.codes import fail, fails_with
from pytest_ml4.checks.protocol import (
    Assembled,
    assert_stream_clean,
    assert_stream_equals_non_stream,
)
from pytest_ml4.client.endpoint import explain_openai_error, quote_body
from pytest_ml4.client.stream_probe import StreamResult, probe_chat_stream
from pytest_ml4.report.redact import redact

if TYPE_CHECKING:
    from typing import Self

    from pytest_ml4.client.deployment import Deployment

#: Request fields the openai SDK's ``chat.completions.create`` takes as keyword arguments.
SDK_FIELDS = frozenset({"model", "messages", "tools", "tool_choice", "parallel_tool_calls", "max_tokens",
                        "max_completion_tokens", "temperature", "top_p", "reasoning_effort", "seed", "stop", "n",
                        "stream_options", "user"})


@dataclass
class Answer:
    """The assistant's answer in one shape for both modes (``message`` like a non-streamed ``choices[0].message``)."""

    stream: bool
    message: dict[str, Any]
    finish_reason: str | None
    usage: dict[str, Any] | None
    result: StreamResult | None = None
    #: Served through a LiteLLM proxy (its ``x-litellm-*`` response headers were present).
    via_litellm: bool = False
    #: Dynamo's ``nvext`` of the answer (worker ids, timing) when the request asked for it; None when absent.
    nvext: dict[str, Any] | None = None

    @property
    def where(self) -> str:
        return "streamed" if self.stream else "non-streamed"

    @property
    def tool_calls(self) -> list[dict[str, Any]]:
        return list(self.message.get("tool_calls") or [])

    @property
    def reasoning(self) -> str:
        r = self.message.get("reasoning")
        return (r if r is not None else self.message.get("reasoning_content")) or ""

    @property
    def content(self) -> str:
        return self.message.get("content") or ""

    def assembled(self) -> Assembled:
        return Assembled.from_message(self.message, self.finish_reason)


def sdk_kwargs(body: dict[str, Any]) -> dict[str, Any]:
    kwargs = {k: v for k, v in body.items() if k in SDK_FIELDS}
    extra = {k: v for k, v in body.items() if k not in SDK_FIELDS and k != "stream"}
    if extra:
        kwargs["extra_body"] = extra
    return kwargs


@fails_with("chat.request_failed", "a chat request was answered with an error")
@fails_with("chat.not_a_completion", "a non-streamed answer is not a chat completion")
def ask(openai_client: openai.OpenAI, http_client: httpx.Client, body: dict[str, Any], stream: bool,
        transcript_dir: Path | None = None, name: str = "chat") -> Answer:
    """Send ``body``; a failed request or a broken stream fails here with the reason."""
    if stream:
        result = send_stream(http_client, body)
        if transcript_dir is not None:
            save_transcript(transcript_dir, name, result)
        return stream_answer(result)
    try:
        raw = openai_client.chat.completions.with_raw_response.create(**sdk_kwargs(body))
        completion = raw.parse()
    except openai.APIError as err:
        fail("chat.request_failed", f"non-streamed request failed: {explain_openai_error(err)}")
    except ValueError:  # a 200 whose body is not JSON (truncated, an HTML page with a JSON content type)
        completion = None
    if not hasattr(completion, "model_dump"):
        # The SDK hands back a plain string for a non-JSON content type (a gateway's HTML page).
        fail("chat.not_a_completion", f"non-streamed answer is not a chat completion (HTTP {raw.status_code}, "
                                      f"content-type {raw.headers.get('content-type', 'none')}): {quote_body(raw.text)}")
    data = completion.model_dump()
    choice = data["choices"][0]
    return Answer(False, choice["message"], choice.get("finish_reason"), data.get("usage"),
                  via_litellm=served_by_litellm(raw.headers), nvext=data.get("nvext"))


def send_stream(http_client: httpx.Client, body: dict[str, Any]) -> StreamResult:
    """The streamed request as the checks send it (with the usage chunk), recorded by the stream probe."""
    return probe_chat_stream(http_client, {**body, "stream_options": {"include_usage": True}})


def stream_answer(result: StreamResult) -> Answer:
    """A recorded stream as an :class:`Answer`; a broken stream (grammar, error event, HTTP error) fails here."""
    assert_stream_clean(result, "streamed")
    return Answer(True, result.message(), result.finish_reason, result.usage, result,
                  via_litellm=served_by_litellm(result.headers), nvext=streamed_nvext(result))


def streamed_nvext(result: StreamResult) -> dict[str, Any] | None:
    """The ``nvext`` a Dynamo frontend puts on the chunks of a stream (the last chunk carrying one), or None."""
    found = [e.data["nvext"] for e in result.events if isinstance(e.data, dict) and isinstance(e.data.get("nvext"), dict)]
    return found[-1] if found else None


def served_by_litellm(headers: Any) -> bool:
    """LiteLLM marks every answer with ``x-litellm-*`` headers (tooling.md §3.5); vLLM and Dynamo do not."""
    return any(str(k).lower().startswith("x-litellm-") for k in headers)


@dataclass(frozen=True)
class BadRequest:
    """A request the suites' data says each stack refuses (or serves, where its row says so): the data's case
    name, the body as sent, streamed or not, and ``label``, how a failure names it."""

    case: str
    body: dict[str, Any]
    stream: bool
    label: str

    @property
    def what(self) -> str:
        return f"{self.label} ({'streamed' if self.stream else 'non-streamed'})"


def send_raw(http_client: httpx.Client, body: dict[str, Any], stream: bool) -> httpx.Response | StreamResult:
    """For requests expected to be refused: the raw response (non-streamed) or the probe's record (streamed)."""
    if stream:
        return probe_chat_stream(http_client, body)
    return http_client.post("chat/completions", json=body)


def save_transcript(directory: Path, name: str, result: StreamResult) -> Path:
    """Write the SSE transcript for the report (file name derived from the test id)."""
    directory.mkdir(parents=True, exist_ok=True)
    safe = re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:150]
    path = directory / f"{safe}.sse.txt"
    path.write_text(redact(result.to_transcript()))  # a run artifact: a key split across chunks is masked too
    attach(path, f"SSE transcript {name}")
    return path


class ChatSession:
    """Asks one test's questions. A streamed answer is compared with the same request non-streamed (remembered
    across tests, so each request is asked non-streamed once): the assembly must be identical."""

    _non_stream: ClassVar[dict[str, Answer]] = {}

    def __init__(self, oai: openai.OpenAI, http: httpx.Client, model: str, defaults: dict[str, Any],
                 transcript_dir: Path | None = None, name: str = "chat") -> None:
        self.oai, self.http, self.model, self.defaults = oai, http, model, dict(defaults)
        self.transcript_dir, self.name = transcript_dir, name
        self._asked = 0

    @classmethod
    def on_deployment(cls, ml4: Deployment, defaults: dict[str, Any], name: str) -> Self:
        """A session on the deployment's clients, its transcripts under the run folder, named after the check."""
        return cls(ml4.openai, ml4.http, ml4.model, defaults, ml4.run_dir / "transcripts", name)

    def body(self, messages: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
        return {"model": self.model, "messages": messages, **self.defaults, **fields}

    def ask(self, body: dict[str, Any], stream: bool) -> Answer:
        self._asked += 1  # numbered transcripts: a multi-turn test keeps every turn
        answer = ask(self.oai, self.http, body, stream, self.transcript_dir, f"{self.name}-{self._asked}")
        key = json.dumps(body, sort_keys=True)
        if not stream:
            self._non_stream[key] = answer
            return answer
        whole = self._non_stream.get(key) or ask(self.oai, self.http, body, False)
        self._non_stream[key] = whole
        assert_stream_equals_non_stream(answer.assembled(), whole.assembled(),
                                        lenient_tool_finish=answer.via_litellm or whole.via_litellm)
        return answer


def attach(path: Path, name: str | None = None) -> None:
    """Show a file in the Allure report (redacted, :func:`pytest_ml4.report.attach.attach_file`) when allure-pytest
    is collecting; a no-op otherwise, and never an error: a reporting aid must not fail a test."""
    try:
        from pytest_ml4.report.attach import attach_file

        attach_file(path, name)
    except Exception:  # noqa: BLE001, S110 - a reporting aid must never fail a test
        pass


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]
