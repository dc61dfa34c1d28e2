"""The ONE place where the embedded Dynamo deployment bridges public Dynamo 1.6.1 to the seed's image.

The seed's Dynamo targets run ``vllm-runtime:1.7.0-mistral-large-4-dev.1`` with ``DYN_PARSER_VERSION=2`` and the
``mistral`` tool/reasoning parsers, an image described as parsing Mistral Large 4's ``[TOOL_CALLS]name[ARGS]{...}``
and ``[THINK]...[/THINK]`` output. The newest public Dynamo (1.6.1, what ``scripts/install.d/50-dynamo.sh``
installs and ``--sim`` runs) does not (shared/reference/real-dynamo.md "Mistral parsing in 1.6.1"):

* its v1 ``mistral`` tool parser silently drops the v11 form (``content: null``, no ``tool_calls``) but parses the
  legacy ``[TOOL_CALLS][{"name": ..., "arguments": {...}}]`` form, parallel calls included;
* with ``DYN_PARSER_VERSION=2`` and the ``mistral`` parsers it never serves the model (every request 404);
* it splits ``[THINK]`` into ``reasoning_content`` only when the request carries ``reasoning_effort``; without it
  the tags stay in ``content``; and with ``reasoning_effort`` everything after ``[/THINK]`` that is a tool call is
  lost to the reasoning parser.

With the bridge ON (default; ``--ml4-no-dynamo-bridge`` turns it off) the simulated *model* adapts its output to
what 1.6.1 parses, and the frontend runs with the parser settings 1.6.1 serves, so the suites see the behaviour the
seed's image is described as having. With the bridge OFF the model emits the seed's form and the suites see what
1.6.1 does with it (tool calls dropped, ``[THINK]`` leaking without ``reasoning_effort``); the plugin then sets the
target's ``serving.dynamo_version`` to ``"1.6.1"`` so the suites can name that cause. Even OFF, the frontend does
not get ``DYN_PARSER_VERSION=2``: 1.6.1 would then serve nothing at all and no suite could run (that case is the
preflight rule's job).

Nothing outside this module decides between the two; the worker asks :func:`behaviour` once at start.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

#: The public Dynamo the embedded deployment runs.
PUBLIC_VERSION = "1.6.1"


@dataclass(frozen=True)
class Behaviour:
    """How the simulated model writes its output and how the frontend is configured."""

    bridged: bool
    #: ``legacy``: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`` (what 1.6.1 parses);
    #: ``v11``: ``[TOOL_CALLS]name[ARGS]{...}`` per call (Mistral Large 4's own form, the seed's).
    tool_form: str
    #: Without ``reasoning_effort`` 1.6.1 leaves ``[THINK]`` in content: bridged, the model does not think then.
    think_without_effort: bool
    #: With ``reasoning_effort`` 1.6.1's reasoning parser swallows a tool call after ``[/THINK]``: bridged, the
    #: model does not think before a tool call.
    think_before_tool_call: bool
    #: Environment for the frontend process (parser selection).
    frontend_env: dict[str, str] = field(default_factory=dict)


BRIDGED = Behaviour(bridged=True, tool_form="legacy", think_without_effort=False, think_before_tool_call=False)
UNBRIDGED = Behaviour(bridged=False, tool_form="v11", think_without_effort=True, think_before_tool_call=True)


def behaviour(bridge: bool) -> Behaviour:
    return BRIDGED if bridge else UNBRIDGED


#: ``tool_choice: required``/named reach the worker as ``guided_decoding.json``: an array of ``{"name": <enum>,
#: "parameters": {...}}`` (1.6.1's schema). Any engine under that grammar emits exactly such an array, whatever
#: the bridge says; emitting ``[TOOL_CALLS]`` there (outside the schema) makes 1.6.1 stream two finish chunks
#: (docs/decisions/embedded-deployment.md, "A guided tool_choice gets the schema's bare array").
GUIDED = "guided"
#: The arguments' key per JSON form.
ARGUMENT_KEYS = {"legacy": "arguments", GUIDED: "parameters"}


def tool_calls_text(calls: list[tuple[str, str]], form: str) -> list[str]:
    """The raw output text of tool calls ``[(name, arguments_json_text), ...]`` in ``form`` (``v11``, ``legacy``
    or :data:`GUIDED`), one string per segment; special tokens are separate segments so the caller can map them
    to their ids."""
    if form == "v11":
        out: list[str] = []
        for name, args in calls:
            out += ["[TOOL_CALLS]", name, "[ARGS]", args]
        return out
    key = ARGUMENT_KEYS[form]
    items = []
    for name, args in calls:
        try:
            parsed = json.loads(args)
        except ValueError:
            # Invalid arguments (a fault) stay invalid: spliced in as text, so the parser sees what was emitted.
            items.append('{"name": ' + json.dumps(name) + f', "{key}": ' + args + "}")
            continue
        items.append(json.dumps({"name": name, key: parsed}, ensure_ascii=False))
    array = "[" + ", ".join(items) + "]"
    # Under guided decoding the engine can only emit what the schema allows: the bare array, no special token.
    return [array] if form == GUIDED else ["[TOOL_CALLS]", array]
