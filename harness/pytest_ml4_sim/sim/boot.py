"""Boot log lines and start-up outcome of the simulated vLLM engine, from the seed's GPU memory model.

``boot_sequence(target, pid)`` asks :func:`pytest_ml4.evidence.memory.plan_memory` what a real engine with the target's
flags does with its GPUs and returns the vLLM 0.33-format lines it would write while it loads weights, profiles
memory and sizes the KV cache (reference vllm.md §9.2, §9.5, §9.7), plus whether it then serves:

* ``ok``: ``Available KV cache memory`` and the one-line ``GPU KV cache size ... Maximum concurrency`` record;
* ``startup_refused``: the worker's traceback ending in vLLM's free-memory ``ValueError`` (seed 000, util 0.99);
* ``no_kv_memory``: the KV-planning ``ValueError`` (no cache blocks, or max_model_len does not fit);
* ``oom_first_step``: a normal boot, then on the first large step the seed's ``MemoryError`` with the
  ``FusedMoeRunner::getWorkspaceInfo`` frame (``crash_lines``; the server writes them and dies).

GPUs without symmetric memory (capability 12.0, RTX PRO) log the ``SymmMemCommunicator`` warning on every worker.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_ml4.evidence.memory import GIB, MemoryPlan, format_gib, plan_memory
from pytest_ml4.target.model import Target
from pytest_ml4_sim.sim.logfmt import thousands, vllm_line

_FP8_LINE = ("Using fp8 data type to store kv cache. It reduces the GPU memory footprint and boosts the performance. "
             "Meanwhile, it may cause accuracy drop without a proper scaling factor")


@dataclass
class BootResult:
    """What the engine logs while booting and whether it then serves."""

    lines: list[str]
    alive: bool = True
    exit_message: str | None = None
    # The engine boots, answers /health, then dies with an OOM on its first large step: the first engine step
    # that schedules at least ``crash_min_step_tokens`` tokens (prefill + decode).  The server writes
    # ``crash_lines`` (the seed's MemoryError traceback), the engine-death lines, and exits non-zero.
    crash_on_first_step: bool = False
    crash_min_step_tokens: int = 1
    crash_lines: list[str] = field(default_factory=list)
    kv_pool_tokens: int = 0
    num_gpu_blocks: int = 0
    max_concurrency: float = 0.0
    available_kv_gib: float = 0.0
    plan: MemoryPlan | None = None


class _Lines:
    """vLLM-format lines of the engine core and its tensor-parallel workers.

    The simulator is one process, so worker lines carry the same ``EngineCore`` prefix as the server's own engine
    lines (a real engine prints ``Worker_TP<rank>``); per-worker lines are still written once per rank.
    """

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.out: list[str] = []

    def core(self, fileinfo: str, lineno: int, msg: str, level: str = "INFO") -> None:
        self.out.append(vllm_line("EngineCore", self.pid, level, fileinfo, lineno, msg))

    def worker(self, rank: int, fileinfo: str, lineno: int, msg: str, level: str = "INFO") -> None:
        del rank  # one process: see the class docstring
        self.core(fileinfo, lineno, msg, level)

    def raw(self, *lines: str) -> None:
        self.out.extend(lines)


def _config_line(target: Target) -> str:
    e = target.engine
    spec = "None"
    if e.speculative:
        synthetic = ", synthetic_acceptance=True" if e.speculative.synthetic_acceptance else ""
        spec = (f"SpeculativeConfig(method='{e.speculative.method}', "
                f"num_spec_tokens={e.speculative.num_speculative_tokens}{synthetic})")
    return (f"Initializing a V1 LLM engine (v{e.version}) with config: model='{e.model_path}', "
            f"speculative_config={spec}, tokenizer='{e.model_path}', dtype=torch.{e.dtype}, "
            f"max_seq_len={e.max_model_len}, tensor_parallel_size={target.topology.tensor_parallel}, "
            f"kv_cache_dtype={e.kv_cache_dtype}, served_model_name="
            f"{target.serving.engine_served_model_name or target.serving.served_model_name}")


def _refusal(out: _Lines, plan: MemoryPlan) -> None:
    out.worker(0, "multiproc_executor.py", 771, "WorkerProc failed to start.", "ERROR")
    out.raw("Traceback (most recent call last):",
            '  File "/opt/vllm/vllm/v1/worker/gpu_worker.py", line 254, in init_device',
            "    self.requested_memory = request_memory(init_snapshot, self.cache_config)",
            '  File "/opt/vllm/vllm/v1/worker/utils.py", line 398, in request_memory',
            "    raise ValueError(",
            str(plan.message))


def _no_kv(out: _Lines, plan: MemoryPlan) -> None:
    out.raw("Traceback (most recent call last):",
            '  File "/opt/vllm/vllm/v1/core/kv_cache_planning.py", line 212, in check_enough_kv_cache_memory',
            "    raise ValueError(",
            str(plan.message))


def _oom_lines(plan: MemoryPlan) -> list[str]:
    """The seed's crash, after the server's "EngineCore encountered a fatal error.": the traceback ending in the
    MemoryError on the FusedMoE workspace and its C++ frame, as journald recorded it."""
    return ["Traceback (most recent call last):",
            '  File "/opt/vllm/vllm/v1/engine/core.py", line 1047, in run_engine_core',
            "    engine_core.run_busy_loop()",
            '  File "/opt/vllm/vllm/model_executor/layers/fused_moe/layer.py", line 2011, in forward_impl',
            "    return self.quant_method.apply(layer, x, router_logits)",
            str(plan.message),
            '  File "<unknown>", line 0, in FusedMoeRunner::getWorkspaceInfo(...)']


def boot_sequence(target: Target, pid: int) -> BootResult:
    """Lines of the boot (or failed boot) of ``target``'s engine; ``pid`` is the simulator's process id."""
    eng, hw, tp = target.engine, target.hardware, target.topology.tensor_parallel
    plan = plan_memory(hw, eng, tp)
    out = _Lines(pid)
    out.core("core.py", 93, _config_line(target))
    if not hw.symmetric_memory:
        for rank in range(tp):
            out.worker(rank, "symm_mem.py", 67, f"SymmMemCommunicator: Device capability {hw.compute_capability} "
                                                "not supported, communicator is not available.", "WARNING")
    if plan.outcome == "startup_refused":
        _refusal(out, plan)
        return BootResult(lines=out.out, alive=False, exit_message=plan.message, plan=plan)
    out.worker(0, "default_loader.py", 291, "Loading weights took 94.31 seconds")
    out.worker(0, "gpu_model_runner.py", 4120,
               f"Model loading took {format_gib(plan.weights_gib * GIB)} GiB memory and 101.406521 seconds")
    if eng.kv_cache_dtype.startswith("fp8"):
        out.core("cache.py", 484, _FP8_LINE)
    out.worker(0, "gpu_worker.py", 436, f"Available KV cache memory: {format_gib(plan.available_kv_gib * GIB)} GiB")
    if plan.outcome == "no_kv_memory":
        _no_kv(out, plan)
        return BootResult(lines=out.out, alive=False, exit_message=plan.message, plan=plan,
                          available_kv_gib=plan.available_kv_gib)
    out.core("kv_cache_utils.py", 1310,
             f"GPU KV cache size: {thousands(plan.kv_pool_tokens)} tokens, Maximum concurrency for "
             f"{thousands(eng.max_model_len)} tokens per request: {plan.max_concurrency:.2f}x")
    out.worker(0, "gpu_model_runner.py", 4630,
               f"Graph capturing finished in 32 secs, took {format_gib(plan.cuda_graphs_gib * GIB)} GiB")
    out.core("core.py", 262, "init engine (profile, create kv cache, warmup model) took 201.33 s")
    crash = plan.outcome == "oom_first_step"
    return BootResult(lines=out.out, alive=True, crash_on_first_step=crash,
                      crash_min_step_tokens=plan.oom_step_tokens or 1 if crash else 1,
                      crash_lines=_oom_lines(plan) if crash else [], kv_pool_tokens=plan.kv_pool_tokens,
                      num_gpu_blocks=plan.num_gpu_blocks, max_concurrency=plan.max_concurrency,
                      available_kv_gib=plan.available_kv_gib, plan=plan)
