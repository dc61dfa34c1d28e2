"""The verdicts: every function a suite calls to judge the deployment, one module per concern, without pytest.

A verdict is named for what must hold, ``assert_<what must hold>(...)``: it raises a
:class:`~pytest_ml4.checks.codes.Violation` (an AssertionError) with a stable code declared on it (``@fails_with``)
(the kill matrix matches the code and the function that raised it) and a message naming the defect, or
:class:`~pytest_ml4.checks.verdict.NotJudged` where the evidence is missing; it returns the figure a report records,
if any. Where a verdict is reported even when it holds, its pure part is ``<what>_verdict(...)`` beside it. What is
judged (loads, scenarios, probes, gate results) is computed in the core modules.

* :mod:`.protocol` - control-token leaks, stream grammar, streamed vs non-streamed equality, error bodies;
* :mod:`.expected` - the per-stack answer to a request (status, error shape, message);
* :mod:`.chat` - one question, streamed or not, reduced to an :class:`~pytest_ml4.checks.chat.Answer`;
* :mod:`.tools` - tool-call ids, arguments against the tool's JSON schema, ``tool_choice`` and finish rules, the
  :class:`~pytest_ml4.checks.tools.ToolChat` that knows a stack's tool conventions, invalid tool requests;
* :mod:`.reasoning` - reasoning separation, reasoning-token accounting, efforts, reasoning share of the output;
* :mod:`.osl` - fixed output length (``min_tokens = max_tokens``) counted three ways, grammar kills, ``ignore_eos``;
* :mod:`.health` - the endpoint's health, Dynamo's registered workers, the engine behind a proxy;
* :mod:`.kv` - the KV pool, max concurrency, no OOM since boot, peak KV usage, spec-decode acceptance;
* :mod:`.restart` - in-flight streams, client errors and recovery across a restart, a worker crash;
* :mod:`.dynamo` - session affinity, prefix reuse, the prefill -> decode handoff;
* :mod:`.perf` - perf gate results; :mod:`.accuracy` - the BFCL accuracy gate.
"""
