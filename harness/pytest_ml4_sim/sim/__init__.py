"""The simulated vLLM 0.33 engine: what cannot run here (the model, the GPUs). Its processes are ``deploy/``'s:
``python -m pytest_ml4_sim.deploy.sim_cli`` serves it, :class:`pytest_ml4_sim.deploy.simulator.SimServer` starts that.

Modules: ``server`` (aiohttp app, endpoints, logs), ``validation`` (vLLM's error bodies), ``responder`` and
``toolgen`` (the deterministic model), ``tokenizer`` (Tekken v13/v15), ``wire`` (tokens -> SSE chunks / bodies),
``engine`` (scheduler + step loop), ``perfmodel`` (timing), ``promstats`` (/metrics), ``boot`` (boot lines and
start-up outcome), ``faults`` (``--fault`` registry).
"""
