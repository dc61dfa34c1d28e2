"""Reusable assertions for the suites: each failure message names the deployment defect it points to.

* :mod:`.protocol` - control-token leaks, stream grammar, streamed vs non-streamed equality, error bodies;
* :mod:`.tools` - tool-call ids, arguments against the tool's JSON schema, ``tool_choice`` and finish rules;
* :mod:`.reasoning` - reasoning separation, reasoning-token accounting, reasoning share of the output.

They work on plain dicts (a non-streaming ``message``) and on :class:`pytest_ml4.probe.StreamResult`, without pytest.
"""
