"""The simulated vLLM 0.33 engine: what cannot run here (the model, the GPUs). Its processes are ``deploy/``'s:
``python -m pytest_ml4.deploy.sim_cli`` serves it, :class:`pytest_ml4.deploy.simulator.SimServer` starts that.

Modules: ``server`` (aiohttp app, endpoints, logs), ``validation`` (vLLM's error bodies), ``responder`` and
``toolgen`` (the deterministic model), ``tokenizer`` (Tekken v13/v15), ``wire`` (tokens -> SSE chunks / bodies),
``engine`` (scheduler + step loop), ``perfmodel`` (timing), ``promstats`` (/metrics), ``boot`` (boot lines and
start-up outcome), ``faults`` (``--fault`` registry).

Target knobs read from ``sim.extra`` (all optional): ``reasoning_field`` (``reasoning`` | ``reasoning_content``
| ``both``: the vLLM >=0.16 / <=0.11 / 0.11.1-0.15 reasoning field), ``stats_interval_s`` (periodic stats log
line, default 10; 0 disables), ``seed`` (tool-call ids, error_rate and acceptance sampling), and the perf-model
parameters documented in ``perfmodel`` (``itl_slope``, ``spec_position_rates``, ``ref_isl``).
"""
