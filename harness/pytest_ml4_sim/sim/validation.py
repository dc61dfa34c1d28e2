"""Request validation with vLLM 0.33's error bodies (reference vllm.md §4.6, §5, §6; errors.txt).

``validate_chat(body, ctx)`` returns a normalised request or raises :class:`ApiError`, whose ``body()`` is the
exact JSON vLLM sends.  Pydantic type errors use FastAPI's ``"Bad Request"`` style; vLLM's own validation errors
carry the ``(parameter=…[, value=…])`` suffix of ``VLLMValidationError``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pytest_ml4.evidence.tokenizer import REASONING_EFFORTS

ENGINE_DEAD_MESSAGE = "The server had an error while processing your request."


class ApiError(Exception):
    """An error response: HTTP status, OpenAI-style error object."""

    def __init__(self, status: int, message: str, err_type: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.err_type = err_type
        self.param = param

    def body(self) -> str:
        return json.dumps({"error": {"message": self.message, "type": self.err_type, "param": self.param,
                                     "code": self.status}}, ensure_ascii=False, separators=(",", ":"))


def vllm_validation(message: str, parameter: str, value: Any = None, with_value: bool = False) -> ApiError:
    """``VLLMValidationError`` -> 400 BadRequestError with the ``(parameter=…)`` suffix."""
    suffix = f" (parameter={parameter}, value={value})" if with_value else f" (parameter={parameter})"
    return ApiError(400, message + suffix, "BadRequestError", parameter)


def engine_dead() -> ApiError:
    return ApiError(500, ENGINE_DEAD_MESSAGE, "InternalServerError", None)


def grammar_terminated() -> ApiError:
    """A request the grammar terminated: HTTP 500 (recorded status; the body's wording is not recorded)."""
    return ApiError(500, "Internal Server Error", "InternalServerError", None)


class _StreamOptions(BaseModel):
    model_config = ConfigDict(extra="allow")
    include_usage: bool | None = False
    continuous_usage_stats: bool | None = False


class ChatRequest(BaseModel):
    """The typed subset of vLLM's ChatCompletionRequest the simulator looks at; unknown fields are allowed."""

    model_config = ConfigDict(extra="allow")
    messages: list[Any]
    model: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    min_tokens: int = 0
    n: int | None = 1
    seed: int | None = None
    stream: bool | None = False
    stream_options: _StreamOptions | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = True
    ignore_eos: bool = False
    include_reasoning: bool = True
    thinking_token_budget: int | None = None
    reasoning_effort: str | None = None
    chat_template: str | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    presence_penalty: float | None = 0.0
    frequency_penalty: float | None = 0.0
    stop: str | list[str] | None = None
    truncate_prompt_tokens: Annotated[int, Field(ge=-1)] | None = None
    truncation_side: Literal["left", "right"] | None = None


def _sanitize_input(value: Any) -> Any:
    # vLLM's validation handler summarises containers instead of echoing them.
    if isinstance(value, dict):
        return f"<dict of {len(value)} items>"
    if isinstance(value, list):
        return f"<list of {len(value)} items>"
    return value


def _pydantic_error(err: ValidationError) -> ApiError:
    errors = err.errors()
    rendered = []
    for e in errors:
        loc = ".".join(["body", *(str(x) for x in e["loc"])])
        rendered.append(repr({"type": e["type"], "loc": loc, "msg": e["msg"], "input": _sanitize_input(e["input"])}))
    n = len(errors)
    message = f"{n} validation error{'s' if n != 1 else ''}:\n  " + "\n  ".join(rendered)
    first_loc = ".".join(["body", *(str(x) for x in errors[0]["loc"])])
    return ApiError(400, message, "Bad Request", first_loc)


@dataclass
class Context:
    served_names: list[str]
    max_model_len: int
    mistral_tokenizer: bool = True
    #: ``reasoning_effort`` values this vLLM version accepts (pytest_ml4/data/vllm/versions.yaml).
    reasoning_efforts: tuple[str, ...] = REASONING_EFFORTS


def parse_chat(raw: bytes) -> tuple[dict[str, Any], ChatRequest]:
    """JSON + pydantic validation (FastAPI's request validation step)."""
    try:
        body = json.loads(raw or b"null")
    except json.JSONDecodeError as e:
        raise ApiError(400, f"1 validation error:\n  {{'type': 'json_invalid', 'loc': 'body.{e.pos}', "
                       f"'msg': 'JSON decode error', 'input': {{}}}}", "Bad Request", f"body.{e.pos}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "1 validation error:\n  {'type': 'model_attributes_type', 'loc': 'body', 'msg': "
                       "'Input should be a valid dictionary or object to extract fields from', 'input': "
                       f"{_sanitize_input(body)!r}}}", "Bad Request", "body")
    try:
        req = ChatRequest.model_validate(body)
    except ValidationError as e:
        raise _pydantic_error(e) from None
    return body, req


def check_request(req: ChatRequest, ctx: Context, raw: dict[str, Any] | None = None) -> Any:
    """vLLM's request-level checks; returns the resolved ``tool_choice``."""
    # vLLM tests the raw value's truthiness (`data.get("stream_options") and not data.get("stream")`).
    stream_options_given = bool(raw.get("stream_options")) if raw is not None else req.stream_options is not None
    if stream_options_given and not req.stream:
        raise vllm_validation("Stream options can only be defined when `stream=True`.", "stream_options")
    if req.tools is not None and len(req.tools) == 0:
        raise vllm_validation("`tools` must not be an empty array. Either provide at least one tool or omit the "
                              "field entirely.", "tools")
    tool_choice = req.tool_choice
    if tool_choice is not None and tool_choice != "none" and not req.tools:
        raise vllm_validation("When using `tool_choice`, `tools` must be set.", "tool_choice")
    if isinstance(tool_choice, str) and tool_choice not in ("none", "auto", "required"):
        raise vllm_validation(f"Invalid value for `tool_choice`: {tool_choice}! Only named tools, \"none\", "
                              "\"auto\" or \"required\" are supported.", "tool_choice")
    if isinstance(tool_choice, dict):
        name = (tool_choice.get("function") or {}).get("name")
        names = [(t.get("function") or {}).get("name") for t in req.tools or []]
        if name not in names:
            raise vllm_validation("The tool specified in `tool_choice` does not match any of the specified "
                                  "`tools`", "tool_choice")
    if tool_choice is None:
        tool_choice = "auto" if req.tools else "none"
    if req.model is not None and req.model not in ctx.served_names:
        raise ApiError(404, f"The model `{req.model}` does not exist. Valid aliases: {', '.join(ctx.served_names)}.",
                       "NotFoundError", "model")
    if ctx.mistral_tokenizer and (req.chat_template_kwargs is not None or req.chat_template is not None):
        raise vllm_validation("chat_template is not supported for Mistral tokenizers.", "chat_template")
    if req.reasoning_effort is not None and req.reasoning_effort not in ctx.reasoning_efforts:
        raise vllm_validation(f"reasoning_effort={req.reasoning_effort} is not supported by Mistral models. "
                              f"Supported values are: {list(ctx.reasoning_efforts)}.", "reasoning_effort")
    if req.temperature is not None and not 0 <= req.temperature <= 2:
        raise vllm_validation(f"temperature must be in [0, 2], got {req.temperature}.", "temperature",
                              req.temperature, with_value=True)
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise vllm_validation(f"top_p must be in (0, 1], got {req.top_p}.", "top_p", req.top_p, with_value=True)
    if req.min_tokens < 0:
        raise vllm_validation(f"min_tokens must be greater than or equal to 0, got {req.min_tokens}.",
                              "min_tokens", req.min_tokens, with_value=True)
    return tool_choice


def check_prompt_chars(text_len: int, ctx: Context, max_chars_per_token: int,
                       truncate_prompt_tokens: int | None = None) -> None:
    """0.33's character pre-check (``_text_len_check``, vllm.md §6.3): a prompt with more characters than
    ``max_model_len`` tokens could ever hold is refused before it is tokenised at all, unless the request asks
    for truncation (then the tokens are cut instead, :func:`truncate_prompt`)."""
    if truncate_prompt_tokens is not None:
        return
    max_input_chars = ctx.max_model_len * max_chars_per_token
    if text_len > max_input_chars:
        raise vllm_validation(
            f"This model's maximum context length is {ctx.max_model_len} tokens. However, your prompt contains "
            f"{text_len} characters (more than {max_input_chars} characters, which is the upper bound for "
            f"{ctx.max_model_len} input tokens). Please reduce the length of the input prompt.", "input_text",
            text_len, with_value=True)


#: The side a Mistral tokenizer truncates from when the request names none: vLLM asks the tokenizer
#: (``MistralTokenizer.truncation_side`` is its transformers tokenizer's), and transformers' default is "right".
#: The side decides which tokens remain, never whether the request is served.
DEFAULT_TRUNCATION_SIDE = "right"


def truncate_prompt(prompt_ids: list[int], req: ChatRequest, ctx: Context) -> list[int]:
    """vLLM 0.32's prompt truncation (``TokenizeParams`` in ``vllm/renderers/params.py``): ``truncate_prompt_tokens``
    N keeps N tokens of the rendered prompt, -1 keeps ``max_model_len - 1`` (one token of room for output); N over
    ``max_model_len`` is refused. Served where it cuts: a front that adds it to every request (a proxy's
    ``litellm_params``) turns vLLM's refusal of an over-long prompt into an answer to a prompt the client never
    sent."""
    keep = req.truncate_prompt_tokens
    if keep is None:
        return prompt_ids
    if keep > ctx.max_model_len:
        raise vllm_validation(f"truncate_prompt_tokens={keep} cannot be greater than max_model_len = "
                              f"{ctx.max_model_len}. Please request a smaller truncation size.",
                              "truncate_prompt_tokens", keep, with_value=True)
    if keep < 0:
        keep = max(0, ctx.max_model_len - 1)
    if keep >= len(prompt_ids):
        return prompt_ids
    side = req.truncation_side or DEFAULT_TRUNCATION_SIDE
    return prompt_ids[len(prompt_ids) - keep:] if side == "left" else prompt_ids[:keep]


def engine_prompt_too_long(prompt_tokens: int, max_model_len: int) -> ApiError:
    """The engine-side backstop for a prompt of exactly ``max_model_len`` tokens (vllm.md §6.3,
    ``vllm/v1/engine/input_processor.py``): a plain ``ValueError``, so a 400 without a ``param``."""
    return ApiError(400, f"The decoder prompt (length {prompt_tokens}) plus the number of requested output tokens "
                    f"(at least 1) is longer than the maximum model length of {max_model_len}. Make sure that "
                    "`max_model_len` is no smaller than the number of text tokens (prompt + requested output "
                    "tokens).", "BadRequestError", None)


def resolve_max_tokens(req: ChatRequest, prompt_tokens: int, ctx: Context) -> tuple[int, int | None]:
    """Effective max tokens (``max_completion_tokens`` wins, clamped to the context) and the requested value."""
    if prompt_tokens > ctx.max_model_len:
        # The renderer's token check (_token_len_check) refuses only prompts longer than the context.
        raise vllm_validation(
            f"This model's maximum context length is {ctx.max_model_len} tokens. However, your prompt contains "
            f"{prompt_tokens} input tokens, which exceeds this limit even without any output tokens. Please reduce "
            "the length of the input prompt.", "input_tokens", prompt_tokens, with_value=True)
    if prompt_tokens == ctx.max_model_len:
        raise engine_prompt_too_long(prompt_tokens, ctx.max_model_len)
    field, requested = ("max_completion_tokens", req.max_completion_tokens)
    if requested is None:
        field, requested = ("max_tokens", req.max_tokens)
    if requested is not None and requested > ctx.max_model_len:
        raise vllm_validation(f"{field}={requested} cannot be greater than max_model_len={ctx.max_model_len}. "
                              "Please request fewer output tokens.", field, requested, with_value=True)
    if requested is not None and requested < 1:
        raise vllm_validation(f"max_tokens must be at least 1, got {requested}.", "max_tokens", requested,
                              with_value=True)
    room = ctx.max_model_len - prompt_tokens
    effective = room if requested is None else min(requested, room)
    if req.min_tokens > effective:
        raise vllm_validation(f"min_tokens must be less than or equal to max_tokens={effective}, got "
                              f"{req.min_tokens}.", "min_tokens", req.min_tokens, with_value=True)
    return effective, requested
