"""From a response plan to vLLM 0.33 wire bytes: output tokens, SSE chunks and the non-streaming body.

The plan (responder) is turned into the raw token sequence a Mistral model emits
(``[THINK]…[/THINK]answer`` or ``[TOOL_CALLS]name[ARGS]{json}`` per call, then ``</s>``), split at Tekken token
boundaries.  The stream renderer then replays vLLM's Mistral parsers on groups of tokens (one group per engine
step; several tokens per group with speculative decoding):

* ``[THINK]``/``[/THINK]``/``[TOOL_CALLS]``/name/``[ARGS]`` tokens produce no delta;
* reasoning tokens -> ``{"reasoning": …}``, content tokens -> ``{"content": …}``;
* the first argument fragment of a call carries ``id``, ``type``, ``index`` and ``name``; the closing ``}`` of a
  call is held back and sent when the next call starts, or on the finish chunk (transcripts.txt, §4.5).

Chunk JSON is assembled from pre-rendered strings (no per-token pydantic): key order and null keys follow
``model_dump_json(exclude_unset=True, exclude_none=not choices)`` exactly as in the reference transcripts.
"""

from __future__ import annotations

import json
import random
import re
import string
from dataclasses import dataclass, field
from itertools import cycle, islice
from typing import Any

from pytest_ml4.evidence.tokenizer import SimTokenizer
from pytest_ml4_sim.sim.responder import Plan, load_data

# Token kinds.
MARK, REASON, CONTENT, TC_START, TC_NAME, ARGS_MARK, ARG, EOS = range(8)

_ALNUM = string.ascii_letters + string.digits


def _dumps(obj: Any) -> str:
    # Starlette/pydantic wire JSON: compact separators, UTF-8 (no \u escapes).
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))


@dataclass
class WireOptions:
    """Per-server rendering switches (parsers configured, faults, legacy reasoning field)."""

    reasoning_parser: bool = True
    tool_parser: bool = True
    reasoning_field: str = "reasoning"  # reasoning | reasoning_content | both
    invalid_tool_json: bool = False
    bad_tool_ids: bool = False
    reasoning_usage_missing: bool = False
    #: usage.completion_tokens reported as this many times the tokens returned (fault usage_overcount).
    usage_factor: float = 1.0
    #: vLLM <= 0.22 keeps ``"tool_calls": []`` in a non-streaming message without calls (vllm.md §1.1 notes).
    empty_tool_calls: bool = False
    #: Per request (``include_reasoning``): false drops the reasoning text; its tokens are still generated.
    include_reasoning: bool = True
    #: Per version (pytest_ml4/data/vllm/versions.yaml): null keys only some releases emit, and whether the finish
    #: chunk of a stop on EOS carries ``delta: {}`` (the last text in the chunk before it).
    kv_transfer_params: bool = True
    weight_versions: bool = True
    eos_finish_delta_empty: bool = False


@dataclass
class Limits:
    max_tokens: int
    min_tokens: int = 0
    ignore_eos: bool = False
    #: ``thinking_token_budget`` (0.33 request field): at most this many reasoning tokens.
    thinking_budget: int | None = None


@dataclass
class Output:
    """The tokens of one response and what they assemble to."""

    tokens: list[tuple[int, str, int]]
    finish: str  # "stop" | "length" (engine view, before tool-call resolution)
    held: dict[int, str] = field(default_factory=dict)  # call index -> closing text held back
    call_names: list[str] = field(default_factory=list)

    @property
    def completion_tokens(self) -> int:
        return len(self.tokens)


# --------------------------------------------------------------------------- token building
@dataclass
class _Fillers:
    reasoning: tuple[str, ...]
    content: tuple[str, ...]


_FILLER_CACHE: dict[int, _Fillers] = {}


def _fillers(tok: SimTokenizer) -> _Fillers:
    f = _FILLER_CACHE.get(id(tok))
    if f is None:
        data = load_data()
        f = _Fillers(tok.pieces(" " + data.reasoning_filler.strip()), tok.pieces(data.content_filler))
        _FILLER_CACHE[id(tok)] = f
    return f


def build_output(plan: Plan, tok: SimTokenizer, limits: Limits, opts: WireOptions) -> Output:
    """Tokenise the plan, pad for ``min_tokens``/``ignore_eos``, cut at ``max_tokens``, append ``</s>``."""
    args_texts = [_mangle(c.arguments) if opts.invalid_tool_json else c.arguments for c in plan.tool_calls]
    r_pieces = list(tok.pieces(plan.reasoning)) if plan.reasoning else []
    c_pieces = list(tok.pieces(plan.content)) if plan.content else []
    call_pieces = [(tok.pieces(c.name), tok.pieces(a)) for c, a in zip(plan.tool_calls, args_texts)]
    padded = limits.ignore_eos or limits.min_tokens > 0
    if plan.reasoning is not None:
        answer_len = len(c_pieces) + sum(2 + len(n) + len(a) for n, a in call_pieces)
        r_pieces = _natural_reasoning(plan, tok, r_pieces, answer_len, padded)
    budget = limits.thinking_budget
    if budget is not None:
        r_pieces = r_pieces[:max(budget, 0)]
    natural = (len(r_pieces) + 2 if plan.reasoning is not None else 0) + len(c_pieces) + sum(
        2 + len(n) + len(a) for n, a in call_pieces)

    wanted = limits.max_tokens if limits.ignore_eos else max(limits.min_tokens, 0)
    pad = max(0, min(wanted, limits.max_tokens) - natural)
    if pad:
        _pad(plan, tok, r_pieces, c_pieces, natural, pad, budget)

    r_kind = REASON if opts.reasoning_parser else CONTENT
    toks: list[tuple[int, str, int]] = []
    if plan.reasoning is not None:
        toks.append((MARK if opts.reasoning_parser else CONTENT, "[THINK]", -1))
        toks += [(r_kind, p, -1) for p in r_pieces]
        toks.append((MARK if opts.reasoning_parser else CONTENT, "[/THINK]", -1))
    toks += [(CONTENT, p, -1) for p in c_pieces]
    held: dict[int, str] = {}
    held_at: dict[int, int] = {}  # call index -> position of the token whose "}" is held
    for idx, (name_p, arg_p) in enumerate(call_pieces):
        if not opts.tool_parser:
            toks.append((CONTENT, "[TOOL_CALLS]", -1))
            toks += [(CONTENT, p, -1) for p in name_p]
            toks.append((CONTENT, "[ARGS]", -1))
            toks += [(CONTENT, p, -1) for p in arg_p]
            continue
        toks.append((TC_START, "[TOOL_CALLS]", idx))
        toks += [(TC_NAME, p, idx) for p in name_p]
        toks.append((ARGS_MARK, "[ARGS]", idx))
        pieces = list(arg_p)
        # The parser holds back the final "}" of a call until it knows the call is complete.
        if pieces and pieces[-1].endswith("}"):
            pieces[-1] = pieces[-1][:-1]
            held[idx] = "}"
        toks += [(ARG, p, idx) for p in pieces]
        held_at[idx] = len(toks) - 1

    if limits.ignore_eos or len(toks) + 1 > limits.max_tokens:
        finish = "length"
        toks = toks[: limits.max_tokens]
        # A call cut off before its last token never produced its closing brace.
        held = {i: t for i, t in held.items() if held_at[i] < len(toks)}
    else:
        finish = "stop"
        toks.append((EOS, "", -1))
    return Output(toks, finish, held, [c.name for c in plan.tool_calls] if opts.tool_parser else [])


def _natural_reasoning(plan: Plan, tok: SimTokenizer, r_pieces: list[str], answer_len: int,
                       padded: bool) -> list[str]:
    """The reasoning the model writes before it answers: ``reasoning_len`` tokens more than the effort's own
    reasoning for a model that thinks at length (a higher effort still thinks longer), and for an answer that is
    not padded to a fixed length, the reasoning lengthened or shortened so its share of the output moves by
    ``share_shift`` (a padded answer takes the shift through ``reasoning_share``)."""
    wanted = None if plan.reasoning_len is None else plan.reasoning_len + len(r_pieces)
    if wanted is None and plan.share_shift and not padded:
        total = len(r_pieces) + 2 + answer_len
        share = min(max(len(r_pieces) / total + plan.share_shift, 0.01), 0.98)
        wanted = max(1, round(share * (answer_len + 2) / (1 - share)))
    if wanted is None:
        return r_pieces
    if wanted <= len(r_pieces):
        return r_pieces[:wanted]
    return r_pieces + list(islice(cycle(_fillers(tok).reasoning), wanted - len(r_pieces)))


def _pad(plan: Plan, tok: SimTokenizer, r_pieces: list[str], c_pieces: list[str], natural: int, pad: int,
         budget: int | None = None) -> None:
    """Extend thinking and answer with filler so the output has ``natural + pad`` tokens; the thinking part
    gets the plan's reasoning share of the total (all of the padding before tool calls)."""
    fill = _fillers(tok)
    r_pad = 0
    if plan.reasoning is not None:
        if plan.tool_calls:
            r_pad = pad
        else:
            r_pad = min(pad, max(0, round(plan.reasoning_share * (natural + pad)) - 2 - len(r_pieces)))
        if budget is not None:
            r_pad = min(r_pad, max(budget - len(r_pieces), 0))
    r_pieces += list(islice(cycle(fill.reasoning), r_pad))
    c_pieces += list(islice(cycle(fill.content), pad - r_pad))


def _mangle(args: str) -> str:
    # Invalid JSON the way broken parsers produce it: a trailing comma before the closing brace.
    return args[:-1] + ",}" if args.endswith("}") else args + "}"


def tool_call_id(rng: random.Random, bad: bool = False) -> str:
    """Mistral's 9-char alphanumeric id (vllm.md §4.3); the fault gives vLLM's default-parser form."""
    if bad:
        return "chatcmpl-tool-" + "".join(rng.choice("0123456789abcdef") for _ in range(16))
    return "".join(rng.choice(_ALNUM) for _ in range(9))


# --------------------------------------------------------------------------- assembly
@dataclass
class Assembled:
    content: str | None
    reasoning: str | None
    tool_calls: list[dict[str, Any]]
    reasoning_tokens: int


def assemble(out: Output, ids: list[str], keep_parallel: bool, include_reasoning: bool = True) -> Assembled:
    """What the non-streaming response shows (all tokens parsed at once)."""
    content: list[str] = []
    reasoning: list[str] = []
    args: dict[int, list[str]] = {}
    n_reason = 0
    saw_reasoning = False
    for kind, text, idx in out.tokens:
        if kind == REASON:
            reasoning.append(text)
            n_reason += 1
            saw_reasoning = True
        elif kind == MARK and text == "[THINK]":
            saw_reasoning = True
        elif kind == CONTENT:
            content.append(text)
        elif kind == ARG:
            args.setdefault(idx, []).append(text)
    calls: list[dict[str, Any]] = []
    for idx in sorted(args):
        if idx > 0 and not keep_parallel:
            continue
        text = "".join(args[idx]) + out.held.get(idx, "")
        calls.append({"id": ids[idx], "type": "function",
                      "function": {"name": out.call_names[idx], "arguments": text}})
    r_text = "".join(reasoning) if saw_reasoning and include_reasoning else None
    c_text = "".join(content)
    # drop_whitespace_only_content_before_tools: whitespace before a tool call is not content.
    if calls and not c_text.strip():
        c_text = ""
    return Assembled(c_text or None, r_text or None, calls, n_reason)


# --------------------------------------------------------------------------- stream rendering
class StreamRenderer:
    """Renders the chunks of one streamed response; ``step(n)`` consumes the next ``n`` tokens."""

    def __init__(self, out: Output, *, req_id: str, created: int, model: str, opts: WireOptions, ids: list[str],
                 keep_parallel: bool, include_usage: bool, continuous: bool, prompt_tokens: int,
                 fingerprint: str | None, reasoning_details: bool, finish_reason: str) -> None:
        self.out = out
        self.finish_reason = finish_reason
        self.opts = opts
        self.ids = ids
        self.keep_parallel = keep_parallel
        self.include_usage = include_usage
        self.continuous = include_usage and continuous
        self.prompt_tokens = prompt_tokens
        self.fingerprint = fingerprint
        self.reasoning_details = reasoning_details
        self.pos = 0
        self.header_sent: set[int] = set()
        self.pending_close: int | None = None
        self.reasoning_tokens = 0
        self._head = ('data: {"id":' + _dumps(req_id) + ',"object":"chat.completion.chunk","created":'
                      + str(created) + ',"model":' + _dumps(model) + ',"choices":')
        self._both = opts.reasoning_field == "both"
        #: Set by the server once the engine admitted the request (``--enable-prompt-tokens-details``).
        self.cached_tokens: int | None = None

    # -- pieces of chunk JSON
    def _usage_json(self, completion: int, final: bool) -> str:
        """Cumulative usage; the final usage chunk adds the details objects (nulls stripped by exclude_none)."""
        s = (f'{{"prompt_tokens":{self.prompt_tokens},"total_tokens":{self.prompt_tokens + completion},'
             f'"completion_tokens":{completion}')
        if final and self.cached_tokens is not None:
            s += f',"prompt_tokens_details":{{"cached_tokens":{self.cached_tokens}}}'
        if final and self.reasoning_details:
            s += f',"completion_tokens_details":{{"reasoning_tokens":{self._reported_reasoning()}}}'
        return s + "}"

    def _reported_reasoning(self) -> int:
        return 0 if self.opts.reasoning_usage_missing else self.reasoning_tokens

    def _delta_json(self, content: str | None, reasoning: str | None, tool_calls: list[str],
                    role: bool = False) -> str:
        parts: list[str] = []
        if role:
            parts.append('"role":"assistant"')
        if content is not None:
            parts.append('"content":' + _dumps(content))
        field_name = "reasoning_content" if self.opts.reasoning_field == "reasoning_content" else "reasoning"
        if reasoning is not None:
            parts.append(f'"{field_name}":' + _dumps(reasoning))
        if self._both:
            # 0.11.1-0.15: an after-validator assigns reasoning_content on every delta (exclude_unset keeps it).
            parts.append('"reasoning_content":' + (_dumps(reasoning) if reasoning is not None else "null"))
        if tool_calls:
            parts.append('"tool_calls":[' + ",".join(tool_calls) + "]")
        return "{" + ",".join(parts) + "}"

    def role_chunk(self) -> str:
        usage = ',"usage":' + self._usage_json(0, False) if self.continuous else ""
        return (self._head + '[{"index":0,"delta":' + self._delta_json("", None, [], role=True)
                + ',"logprobs":null,"finish_reason":null}]' + usage
                + ',"prompt_token_ids":null,"prompt_text":null}\n\n')

    def step(self, n: int) -> list[str]:
        """Chunks for the next ``n`` tokens (possibly none: markers only); the finish chunk when done."""
        end = min(self.pos + n, len(self.out.tokens))
        content: list[str] = []
        reasoning: list[str] = []
        calls: list[str] = []
        cur_idx: int | None = None
        cur_args: list[str] = []

        def flush_call() -> None:
            nonlocal cur_idx, cur_args
            if cur_idx is not None:
                calls.append(self._tool_delta(cur_idx, "".join(cur_args)))
            cur_idx, cur_args = None, []

        def release_close() -> None:
            # Append the held "}" of the pending call to that call's fragment in this delta.
            nonlocal cur_idx
            closing = self.pending_close
            self.pending_close = None
            if closing is not None and self._visible(closing):
                if cur_idx != closing:
                    flush_call()
                    cur_idx = closing
                cur_args.append(self.out.held[closing])

        for kind, text, idx in self.out.tokens[self.pos:end]:
            if kind == REASON:
                if self.opts.include_reasoning:
                    reasoning.append(text)
                self.reasoning_tokens += 1
            elif kind == CONTENT:
                content.append(text)
            elif kind == TC_START and self.pending_close is not None:
                # The next call starts: the previous call's held "}" is released now.
                release_close()
                flush_call()
            elif kind == ARG:
                if self._visible(idx):
                    if cur_idx != idx:
                        flush_call()
                        cur_idx = idx
                    cur_args.append(text)
                if idx in self.out.held:
                    self.pending_close = idx
        self.pos = end
        done = self.pos >= len(self.out.tokens)
        if done:
            release_close()
        flush_call()
        c = "".join(content) if content else None
        r = "".join(reasoning) if reasoning else None
        if not done:
            if c is None and r is None and not calls:
                return []
            return [self._choice_chunk(self._delta_json(c, r, calls), None)]
        if (self.opts.eos_finish_delta_empty and not calls and (c is not None or r is not None)
                and self.out.tokens and self.out.tokens[-1][0] == EOS):
            # The EOS token is a step of its own: its chunk only finishes.
            return [self._choice_chunk(self._delta_json(c, r, calls), None),
                    self._choice_chunk("{}", self.finish_reason)]
        return [self._choice_chunk(self._delta_json(c, r, calls), self.finish_reason)]

    def _visible(self, idx: int) -> bool:
        return idx == 0 or self.keep_parallel

    def _tool_delta(self, idx: int, args: str) -> str:
        fn_args = '"arguments":' + _dumps(args)
        if idx not in self.header_sent:
            self.header_sent.add(idx)
            return ('{"id":' + _dumps(self.ids[idx]) + ',"type":"function","index":' + str(idx)
                    + ',"function":{"name":' + _dumps(self.out.call_names[idx]) + "," + fn_args + "}}")
        return '{"index":' + str(idx) + ',"function":{' + fn_args + "}}"

    def _choice_chunk(self, delta: str, finish: str | None) -> str:
        usage = ""
        if self.continuous:
            usage = ',"usage":' + self._usage_json(self.pos, False)
        kv = ',"kv_transfer_params":null' if self.opts.kv_transfer_params else ""
        if finish is None:
            return (self._head + '[{"index":0,"delta":' + delta
                    + ',"logprobs":null,"finish_reason":null,"token_ids":null}]' + usage + kv + '}\n\n')
        fp = ""
        if self.fingerprint and not self.include_usage:
            fp = ',"system_fingerprint":' + _dumps(self.fingerprint)
        return (self._head + '[{"index":0,"delta":' + delta + ',"logprobs":null,"finish_reason":' + _dumps(finish)
                + ',"stop_reason":null,"token_ids":null' + (',"weight_versions":null' if self.opts.weight_versions
                                                              else "") + '}]' + usage + fp + kv + '}\n\n')

    def usage_chunk(self) -> str:
        fp = ',"system_fingerprint":' + _dumps(self.fingerprint) if self.fingerprint else ""
        completion = reported_completion(len(self.out.tokens), self.opts)
        return (self._head + '[],"usage":' + self._usage_json(completion, True)
                + fp + "}\n\n")

    @staticmethod
    def error_event(message: str, err_type: str, code: int) -> str:
        return ("data: " + _dumps({"error": {"message": message, "type": err_type, "param": None, "code": code}})
                + "\n\n")

    DONE = "data: [DONE]\n\n"


def reported_completion(tokens: int, opts: WireOptions) -> int:
    """The completion_tokens usage reports for ``tokens`` returned (more under fault usage_overcount)."""
    return round(tokens * opts.usage_factor)


# --------------------------------------------------------------------------- non-streaming body
def message_json(asm: Assembled, content_override: str | None, reasoning_field: str,
                 empty_tool_calls: bool = False) -> dict[str, Any]:
    msg: dict[str, Any] = {"role": "assistant",
                           "content": content_override if content_override is not None else asm.content,
                           "refusal": None, "annotations": None, "audio": None, "function_call": None}
    if asm.tool_calls or empty_tool_calls:
        msg["tool_calls"] = asm.tool_calls
    if reasoning_field == "reasoning_content":
        msg["reasoning_content"] = asm.reasoning
    else:
        msg["reasoning"] = asm.reasoning
        if reasoning_field == "both":
            msg["reasoning_content"] = asm.reasoning
    return msg


def version_tuple(version: str) -> tuple[int, ...]:
    """``"0.22.1"`` -> ``(0, 22, 1)``; suffixes (``rc1``, ``+cu129``) are ignored."""
    m = re.match(r"\d+(?:\.\d+)*", version.strip())
    return tuple(int(x) for x in m.group(0).split(".")) if m else ()


def response_body(*, req_id: str, created: int, model: str, message: dict[str, Any], finish: str,
                  prompt_tokens: int, completion_tokens: int, reasoning_tokens: int | None,
                  fingerprint: str | None, cached_tokens: int | None = None, weight_versions: bool = True) -> str:
    prompt_details = None if cached_tokens is None else {"cached_tokens": cached_tokens,
                                                          "created_cache_tokens": None, "multimodal_tokens": None}
    usage: dict[str, Any] = {"prompt_tokens": prompt_tokens, "total_tokens": prompt_tokens + completion_tokens,
                             "completion_tokens": completion_tokens, "prompt_tokens_details": prompt_details,
                             "completion_tokens_details": (None if reasoning_tokens is None
                                                           else {"reasoning_tokens": reasoning_tokens})}
    body = {"id": req_id, "object": "chat.completion", "created": created, "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish,
                         "stop_reason": None, "token_ids": None, "routed_experts": None, "weight_versions": None}],
            "service_tier": None, "system_fingerprint": fingerprint, "usage": usage, "prompt_logprobs": None,
            "prompt_token_ids": None, "prompt_text": None, "kv_transfer_params": None, "ec_transfer_params": None,
            "metrics": None}
    if not weight_versions:
        del body["choices"][0]["weight_versions"]
    return _dumps(body)
