"""The scripted model: a vLLM logits processor that makes a random-weight model say what the simulator's
responder decides for the same conversation (one brain, two engines).

vLLM hands a logits processor the request's prompt token ids and its sampling parameters, not the chat request.
So the conversation is read back from the prompt (mistral-common's Tekken encoding: ``[SYSTEM_PROMPT]``,
``[AVAILABLE_TOOLS]``, ``[MODEL_SETTINGS]`` with the reasoning effort, ``[INST]``, ``[TOOL_CALLS]``,
``[TOOL_RESULTS]``), and ``tool_choice`` from the Lark grammar vLLM's Mistral parser attaches for tool requests.
:func:`pytest_ml4_sim.sim.responder.plan_response` plans the answer and :func:`pytest_ml4_sim.sim.wire.build_output`
turns it into tokens exactly as the simulator does (padding for ``min_tokens``/``ignore_eos``); every step then
forces the next of those tokens, EOS after the last. Detokenizing, both Mistral parsers, SSE framing, usage,
metrics and logs are real vLLM.

Load it with ``--logits-processors pytest_ml4_sim.realvllm.scripted:ScriptedModel`` and the checkout on
``PYTHONPATH``; it runs inside vLLM's venv, so outside :class:`ScriptedModel` it imports only the project's
own modules, mistral-common, pydantic and PyYAML (all of which that venv has).
"""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pytest_ml4.evidence.tokenizer import SPECIAL_TOKENS, SimTokenizer
from pytest_ml4_sim.sim import wire
from pytest_ml4_sim.sim.responder import plan_response

_SPECIAL_ID = {name: i for i, name in enumerate(SPECIAL_TOKENS)}
EOS_ID = _SPECIAL_ID["</s>"]
#: Milliseconds the scripted model takes at least per engine step (default 0: as fast as the CPU goes). The tiny
#: model decodes a few hundred tokens in a fraction of a second on CPU, faster than a loaded test client reads them,
#: so a check that acts in the middle of a stream (a worker SIGKILLed under it) would land after the answer was
#: complete; Mistral Large 4 on GPUs takes milliseconds a token. Set by the launcher from the tiny model's
#: ``serve.decode_pace_ms`` (pytest_ml4/data/vllm/tiny_model.yaml).
PACE_ENV = "ML4_SCRIPTED_PACE_MS"
#: Token kinds of :func:`pytest_ml4_sim.sim.wire.build_output` that are one control token each.
_KIND_TOKEN = {wire.TC_START: "[TOOL_CALLS]", wire.ARGS_MARK: "[ARGS]", wire.EOS: "</s>"}


# --------------------------------------------------------------------------- prompt -> request
@dataclass
class _Reader:
    """Rebuilds the chat request from a decoded prompt (a list of control-token names and text runs)."""

    messages: list[dict[str, Any]] = field(default_factory=list)
    tools: list[dict[str, Any]] = field(default_factory=list)
    effort: str | None = None

    def feed(self, parts: list[tuple[str | None, str]]) -> None:
        i = 0
        while i < len(parts):
            mark, _ = parts[i]
            if mark in _CLOSED:
                text = parts[i + 1][1] if i + 1 < len(parts) and parts[i + 1][0] is None else ""
                self._closed(mark, text)
                i += 2
            elif mark == "[TOOL_CALLS]":
                i = self._tool_call(parts, i + 1)
            elif mark is None:
                # Text after [/INST] (or after a tool call) is an earlier assistant turn.
                self.messages.append({"role": "assistant", "content": parts[i][1]})
                i += 1
            else:
                i += 1

    def _closed(self, mark: str, text: str) -> None:
        if mark == "[INST]":
            self.messages.append({"role": "user", "content": text})
        elif mark == "[SYSTEM_PROMPT]":
            self.messages.append({"role": "system", "content": text})
        elif mark == "[AVAILABLE_TOOLS]":
            self.tools = json.loads(text)
        elif mark == "[MODEL_SETTINGS]":
            self.effort = json.loads(text).get("reasoning_effort")
        elif mark == "[TOOL_RESULTS]":
            content = text.split("[TOOL_CONTENT]", 1)[-1]
            self.messages.append({"role": "tool", "content": content})

    def _tool_call(self, parts: list[tuple[str | None, str]], i: int) -> int:
        name = parts[i][1] if i < len(parts) and parts[i][0] is None else ""
        i += 1
        while i < len(parts) and parts[i][0] in ("[CALL_ID]",):
            i += 2
        args = ""
        if i < len(parts) and parts[i][0] == "[ARGS]":
            args = parts[i + 1][1] if i + 1 < len(parts) and parts[i + 1][0] is None else ""
            i += 2
        call = {"type": "function", "function": {"name": name, "arguments": args}}
        last = self.messages[-1] if self.messages else None
        if last is not None and last["role"] == "assistant" and "tool_calls" in last:
            last["tool_calls"].append(call)
        else:
            self.messages.append({"role": "assistant", "tool_calls": [call]})
        return i

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"messages": self.messages}
        if self.tools:
            out["tools"] = self.tools
        if self.effort is not None:
            out["reasoning_effort"] = self.effort
        return out


_CLOSED = ("[INST]", "[SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[MODEL_SETTINGS]", "[TOOL_RESULTS]")


def split_prompt(ids: list[int], tok: SimTokenizer) -> list[tuple[str | None, str]]:
    """The prompt as ``(control token name, "")`` and ``(None, text)`` runs; closing tokens are dropped."""
    raw = tok._tok
    n_special = raw.num_special_tokens
    parts: list[tuple[str | None, str]] = []
    run: list[int] = []

    def flush() -> None:
        if run:
            parts.append((None, b"".join(raw.id_to_byte_piece(i) for i in run).decode("utf-8", "replace")))
            run.clear()

    for i in ids:
        if i >= n_special:
            run.append(i)
            continue
        flush()
        name = SPECIAL_TOKENS[i] if i < len(SPECIAL_TOKENS) else ""
        if name and not name.startswith("[/") and name not in ("<s>", "</s>"):
            parts.append((name, ""))
    flush()
    return parts


def request_from_prompt(ids: list[int], tok: SimTokenizer) -> dict[str, Any]:
    """The chat request (messages, tools, reasoning_effort) a Tekken-encoded prompt was made from."""
    reader = _Reader()
    reader.feed(split_prompt(ids, tok))
    return reader.body()


_NAMED = re.compile(r'<\[\d+\]> SAFE_WS\? "([^"]+)" <\[\d+\]>')


def tool_choice_from_grammar(grammar: str | None) -> Any:
    """``tool_choice`` as vLLM's Mistral parser encoded it in the Lark grammar (mistral-common's
    ``get_lark_from_jinja``: ``body: think? content`` for none, ``think? fcalls`` for required/named)."""
    if not grammar:
        return "auto"
    body = next((ln for ln in grammar.splitlines() if ln.startswith("body:")), "")
    if "fcalls" not in body:
        return "none"
    if "content |" in body:
        return "auto"
    named = _NAMED.search(grammar)
    return {"type": "function", "function": {"name": named.group(1)}} if named else "required"


def parallel_from_grammar(grammar: str | None) -> bool:
    """False when the grammar admits one tool call only (``parallel_tool_calls: false``: no ``(...)+``)."""
    fcalls = next((ln for ln in (grammar or "").splitlines() if ln.startswith("fcalls:")), "")
    return "<[" not in fcalls or fcalls.rstrip().endswith(")+")


# --------------------------------------------------------------------------- plan -> token ids
def script_ids(body: dict[str, Any], tool_choice: Any, limits: wire.Limits, tok: SimTokenizer,
               parallel: bool = True) -> list[int]:
    """The token ids the model emits for ``body``: the simulator's output for the same request. With
    ``parallel`` false only the first call is emitted: the grammar would reject a second ``[TOOL_CALLS]`` (the
    simulator, which has no grammar, drops the extra calls when it assembles the reply instead)."""
    plan = plan_response(body, tool_choice)
    if not parallel:
        plan.tool_calls = plan.tool_calls[:1]
    out = wire.build_output(plan, tok, limits, wire.WireOptions())
    ids: list[int] = []
    last_arg = {idx: pos for pos, (kind, _, idx) in enumerate(out.tokens) if kind == wire.ARG}
    for pos, (kind, piece, idx) in enumerate(out.tokens):
        if kind in _KIND_TOKEN:
            ids.append(_SPECIAL_ID[_KIND_TOKEN[kind]])
        elif kind == wire.MARK:
            ids.append(_SPECIAL_ID[piece])
        else:
            if kind == wire.ARG and last_arg.get(idx) == pos:
                piece += out.held.get(idx, "")  # the renderer holds the closing brace back; the model emits it
            ids += piece_ids(piece, tok)
    return ids


def piece_ids(piece: str, tok: SimTokenizer) -> list[int]:
    """Ids of one output piece: its vocabulary entry, or (for a character split over tokens) its encoding."""
    raw = tok._tok
    found = raw._tekken_token2id_nospecial.get(piece.encode("utf-8"))
    if found is not None:
        return [found + raw.num_special_tokens]
    return list(raw.encode(piece, bos=False, eos=False))


# --------------------------------------------------------------------------- the vLLM logits processor
#: Per request: ``(processor, SamplingParams) -> (prompt ids -> the ids to emit)``.
ScriptFor = Callable[[Any, Any], Callable[[list[int]], list[int]]]


def forcing_processor_class(name: str, script_for: ScriptFor) -> type:
    """A vLLM logits processor class that forces, token by token, the ids ``script_for`` plans for each request
    (EOS after the last); the processor has ``tok``, the model dir's Tekken tokenizer."""
    import torch
    from vllm.v1.sample.logits_processor import AdapterLogitsProcessor

    class Forcing(AdapterLogitsProcessor):
        def __init__(self, vllm_config: Any, device: Any, is_pin_memory: bool) -> None:
            super().__init__(vllm_config, device, is_pin_memory)
            model_dir = Path(vllm_config.model_config.tokenizer)
            config = json.loads((model_dir / "tekken.json").read_text())["config"]
            version = int(str(config.get("version", "v13")).lstrip("v"))
            self.tok = SimTokenizer(version, path=model_dir / "tekken.json")
            self.pace_s = float(os.environ.get(PACE_ENV) or 0) / 1000
            self.last_step = 0.0

        def is_argmax_invariant(self) -> bool:
            return False

        def new_req_logits_processor(self, params: Any) -> Any:
            plan = script_for(self, params)
            script: list[int] = []

            def force(prompt_ids: list[int], output_ids: list[int], logits: torch.Tensor) -> torch.Tensor:
                if not script:
                    script.extend(plan(list(prompt_ids)) or [EOS_ID])
                n = len(output_ids)
                token = script[n] if n < len(script) else EOS_ID
                logits.fill_(float("-inf"))
                logits[token] = 0.0
                return logits

            return force

        def apply(self, logits: torch.Tensor) -> torch.Tensor:
            # Once per engine step (not per request): the pace of a batch is the pace of one step.
            if self.req_info and self.pace_s:
                time.sleep(max(0.0, self.last_step + self.pace_s - time.monotonic()))
                self.last_step = time.monotonic()
            return super().apply(logits)

    Forcing.__name__ = Forcing.__qualname__ = name
    return Forcing


def _script_for(processor: Any, params: Any) -> Callable[[list[int]], list[int]]:
    """The plan of real vLLM's own server: tool_choice from the Lark grammar its Mistral parser attaches."""
    so = getattr(params, "structured_outputs", None)
    grammar = getattr(so, "grammar", None) if so is not None else None
    choice, parallel = tool_choice_from_grammar(grammar), parallel_from_grammar(grammar)
    limits = wire.Limits(max_tokens=int(params.max_tokens or 16), min_tokens=int(params.min_tokens or 0),
                         ignore_eos=bool(params.ignore_eos),
                         thinking_budget=getattr(params, "thinking_token_budget", None))
    return lambda prompt_ids: script_ids(request_from_prompt(prompt_ids, processor.tok), choice, limits,
                                         processor.tok, parallel)


def _processor_class() -> type:
    """Forces the scripted token at every step of every request (see the module docstring)."""
    return forcing_processor_class("ScriptedModel", _script_for)


def __getattr__(name: str) -> Any:
    # vLLM resolves ``module:ScriptedModel``; building the class lazily keeps the rest of the module importable
    # (and testable) without vLLM or torch.
    if name == "ScriptedModel":
        cls = _processor_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
