"""The scripted model inside a real ``dynamo.vllm`` worker: the logits processor of :mod:`pytest_ml4_sim.realvllm.scripted`
with the channel Dynamo leaves open.

Through the Dynamo frontend nothing of the request but the prompt and the sampling parameters reaches vLLM
(``vllm_xargs`` is dropped, unknown request fields are refused with 400), and the prompt must stay what the suite
sent. The frontend renders the chat request with the model's Tekken template, so the prompt token ids carry the
conversation, the tools and ``[MODEL_SETTINGS]{"reasoning_effort": ...}`` (``none`` when the client sent no effort),
which :func:`pytest_ml4_sim.realvllm.scripted.request_from_prompt` reads back. ``tool_choice`` arrives as 1.6.1 turns it
into guided JSON (``structured_outputs.json``): an array of ``{"name", "parameters"}`` for ``required``, the bare
parameter schema of one tool for a named choice.

What the model emits is the simulator's answer for the same conversation, as Mistral Large 4 writes it (tool form
``[TOOL_CALLS]name[ARGS]{...}``, thinking before a tool call when its effort says so) unless ``ML4_SCRIPTED_OUTPUT``
(JSON set by the launcher from the declared Dynamo version's ``emulation`` in ``pytest_ml4/data/dynamo/versions.yaml``)
says how that version is emulated on 1.6.1. Under guided JSON
the model emits exactly the JSON the grammar admits: anything else is refused by the grammar (HTTP 500).

Load it with ``--logits-processors pytest_ml4_sim.realdynamo.scripted:DynamoScriptedModel``, the checkout on
``PYTHONPATH``; it runs inside the dynamo-vllm venv.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from pytest_ml4.evidence.tokenizer import SimTokenizer
from pytest_ml4.stacks.dynamo_versions import OWN_OUTPUT
from pytest_ml4_sim.realvllm.scripted import (
    EOS_ID,
    forcing_processor_class,
    request_from_prompt,
)
from pytest_ml4_sim.sim import wire
from pytest_ml4_sim.sim.dynamo_bridge import GUIDED, tool_calls_text
from pytest_ml4_sim.sim.dynamo_worker import reply_ids
from pytest_ml4_sim.sim.responder import plan_response

#: JSON ``{"tool_form": ..., "think_before_tool_call": ...}`` the launcher sets (``dynamo_versions.model_output``).
OUTPUT_ENV = "ML4_SCRIPTED_OUTPUT"


def tool_choice_from_schema(schema: Any, tools: list[dict[str, Any]]) -> Any:
    """``tool_choice`` from the guided-JSON schema 1.6.1 derives from it: none -> ``auto``; an array ->
    ``required``; one tool's parameter schema -> that tool named."""
    if isinstance(schema, str):
        schema = json.loads(schema)
    if not isinstance(schema, dict):
        return "auto"
    if schema.get("type") == "array":
        return "required"
    for tool in tools:
        fn = tool.get("function") or {}
        if fn.get("parameters") == schema:
            return {"type": "function", "function": {"name": fn.get("name")}}
    return "required"


def guided_text(calls: list[tuple[str, str]], choice: Any) -> str:
    """The JSON a guided request admits for ``calls`` ``[(name, arguments_json)]``: 1.6.1's array of
    ``{"name", "parameters"}`` for ``required``, the first call's bare arguments object for a named choice."""
    if isinstance(choice, dict):
        return calls[0][1] if calls else "{}"
    return tool_calls_text(calls, GUIDED)[0]


def script_ids(prompt_ids: list[int], schema: Any, limits: wire.Limits, tok: SimTokenizer,
               output: dict[str, Any]) -> list[int]:
    """The token ids the model emits for the conversation in ``prompt_ids`` under the guided ``schema`` (or None),
    written as ``output`` says (:func:`pytest_ml4.stacks.dynamo_versions.model_output`)."""
    body = request_from_prompt(prompt_ids, tok)
    choice = tool_choice_from_schema(schema, body.get("tools", []))
    if not output["think_before_tool_call"] and body.get("tools") and choice != "none":
        body["reasoning_effort"] = "none"
    plan = plan_response(body, choice)
    if schema is not None:
        # Under guided JSON the grammar admits the JSON alone (no control token, no thinking), then EOS.
        text = guided_text([(c.name, c.arguments) for c in plan.tool_calls], choice)
        return list(tok._tok.encode(text, bos=False, eos=False)) + [EOS_ID]
    out = wire.build_output(plan, tok, limits, wire.WireOptions())
    return reply_ids(out, tok, str(output["tool_form"]), limits.max_tokens).ids


def _script_for(processor: Any, params: Any) -> Callable[[list[int]], list[int]]:
    so = getattr(params, "structured_outputs", None)
    schema = getattr(so, "json", None) if so is not None else None
    limits = wire.Limits(max_tokens=int(params.max_tokens or 16), min_tokens=int(params.min_tokens or 0),
                         ignore_eos=bool(params.ignore_eos))
    output = {**OWN_OUTPUT, **json.loads(os.environ.get(OUTPUT_ENV) or "{}")}
    return lambda prompt_ids: script_ids(prompt_ids, schema, limits, processor.tok, output)


def _processor_class() -> type:
    return forcing_processor_class("DynamoScriptedModel", _script_for)


def __getattr__(name: str) -> Any:
    # Built lazily: the rest of the module imports (and is tested) without vLLM or torch.
    if name == "DynamoScriptedModel":
        cls = _processor_class()
        globals()[name] = cls
        return cls
    raise AttributeError(name)
