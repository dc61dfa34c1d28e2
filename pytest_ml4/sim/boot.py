"""Boot log lines and start-up outcome of the simulated vLLM engine.

``boot_sequence(target, pid)`` returns the vLLM 0.33-format lines a real engine writes while it loads weights,
profiles memory and sizes the KV cache (reference vllm.md §9.2, §9.5, §9.7), plus whether the engine comes up,
refuses to start, or boots and then dies on its first large step.  The numbers come from the seed's memory model
(``pytest_ml4.memory.plan_memory``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pytest_ml4.memory import GIB, MemoryPlan, format_gib, plan_memory
from pytest_ml4.sim.logfmt import thousands, vllm_line
from pytest_ml4.targets import Target


@dataclass
class BootResult:
    """What the engine logs while booting and whether it then serves."""

    lines: list[str]
    alive: bool = True
    exit_message: str | None = None
    # The engine boots, answers /health, then dies with an OOM on its first large step: the first engine step
    # that schedules at least ``crash_min_step_tokens`` tokens (prefill + decode).  The server writes
    # ``crash_lines`` (e.g. the torch OOM traceback), the engine-death lines, and exits non-zero.
    crash_on_first_step: bool = False
    crash_min_step_tokens: int = 1
    crash_lines: list[str] = field(default_factory=list)
    kv_pool_tokens: int = 0
    num_gpu_blocks: int = 0
    max_concurrency: float = 0.0
    available_kv_gib: float = 0.0
    plan: MemoryPlan | None = None


_EXC_PREFIX = re.compile(r"^[A-Za-z_.]*(Error|Exception): ")


def _as_exception_line(message: str) -> str:
    return message if _EXC_PREFIX.match(message) else f"ValueError: {message}"


def boot_sequence(target: Target, pid: int) -> BootResult:
    """Lines of a healthy (or failing) boot for ``target``; ``pid`` is the simulator's process id."""
    eng = target.engine
    plan = plan_memory(target.hardware, eng, target.topology.tensor_parallel)

    def ec(fileinfo: str, lineno: int, msg: str, level: str = "INFO") -> str:
        return vllm_line("EngineCore", pid, level, fileinfo, lineno, msg)

    lines: list[str] = []
    if plan.outcome == "startup_refused":
        lines.append(ec("core.py", 1102, "EngineCore failed to start.", "ERROR"))
        lines.append(_as_exception_line(plan.message or "startup refused"))
        return BootResult(lines=lines, alive=False, exit_message=plan.message, plan=plan)
    lines += [
        ec("model_runner.py", 4120, f"Model loading took {plan.weights_gib:.2f} GiB memory and 41.237516 seconds"),
        ec("default_loader.py", 291, "Loading weights took 38.91 seconds"),
    ]
    if eng.kv_cache_dtype.startswith("fp8"):
        lines.append(ec("cache.py", 484, "Using fp8 data type to store kv cache. It reduces the GPU memory footprint "
                        "and boosts the performance. Meanwhile, it may cause accuracy drop without a proper "
                        "scaling factor"))
    if plan.outcome == "no_kv_memory":
        lines.append(ec("core.py", 1102, "EngineCore failed to start.", "ERROR"))
        lines.append(_as_exception_line(plan.message or "No available memory for the cache blocks."))
        return BootResult(lines=lines, alive=False, exit_message=plan.message, plan=plan)
    lines.append(ec("gpu_worker.py", 436, f"Available KV cache memory: {format_gib(plan.available_kv_gib * GIB)} GiB"))
    lines.append(ec("kv_cache_utils.py", 1310,
                    f"GPU KV cache size: {thousands(plan.kv_pool_tokens)} tokens, Maximum concurrency for "
                    f"{thousands(eng.max_model_len)} tokens per request: {plan.max_concurrency:.2f}x"))
    lines.append(ec("gpu_model_runner.py", 4630,
                    f"Graph capturing finished in 23 secs, took {plan.cuda_graphs_gib:.2f} GiB"))
    lines.append(ec("core.py", 262, "init engine (profile, create kv cache, warmup model) took 96.42 s"))
    crash = plan.outcome == "oom_first_step"
    crash_lines = []
    if crash:
        crash_lines = ["Traceback (most recent call last):",
                       ('  File "/usr/local/lib/python3.12/dist-packages/vllm/v1/engine/core.py", line 1047, in '
                        "run_engine_core"),
                       "    engine_core.run_busy_loop()",
                       _as_exception_line(plan.message or "CUDA out of memory.")]
    return BootResult(lines=lines, alive=True, crash_on_first_step=crash,
                      crash_min_step_tokens=plan.oom_step_tokens or 1, crash_lines=crash_lines,
                      kv_pool_tokens=plan.kv_pool_tokens, num_gpu_blocks=plan.num_gpu_blocks,
                      max_concurrency=plan.max_concurrency, available_kv_gib=plan.available_kv_gib, plan=plan)
