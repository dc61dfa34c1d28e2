"""Boot log lines and start-up outcome of the simulated vLLM engine.

``boot_sequence(target, pid)`` returns the vLLM 0.33-format lines a real engine writes while it loads weights,
profiles memory and sizes the KV cache (reference vllm.md §9.2, §9.5, §9.7), plus whether the engine comes up.
This first version sizes the KV pool with a simple per-GPU budget; the seed's memory model
(``pytest_ml4.memory``) replaces the arithmetic behind the same interface.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from pytest_ml4.sim.logfmt import gib, thousands, vllm_line
from pytest_ml4.targets import Target

GIB = 1 << 30
# Approximate NVFP4 Mistral Large 4 weight footprint across the TP group (estimate, replaced by the memory model).
_WEIGHTS_GIB_TOTAL = 360.0
# Activation/workspace reserve per GPU (estimate).
_ACTIVATION_GIB = 3.0
# KV bytes per token and GPU for an fp8 MLA cache, chosen so rtxpro6000-tp8 lands near the seed's
# "pool was sized 272,636 tokens" (seed 000).  bf16/auto caches take twice as much.
_KV_BYTES_PER_TOKEN_FP8 = 176 * 1024


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


def _kv_bytes_per_token(kv_cache_dtype: str) -> int:
    return _KV_BYTES_PER_TOKEN_FP8 if kv_cache_dtype.startswith(("fp8", "nvfp4")) else 2 * _KV_BYTES_PER_TOKEN_FP8


def boot_sequence(target: Target, pid: int) -> BootResult:
    """Lines of a healthy (or failing) boot for ``target``; ``pid`` is the simulator's process id."""
    eng = target.engine
    tp = target.topology.tensor_parallel
    def ec(fileinfo: str, lineno: int, msg: str, level: str = "INFO") -> str:
        return vllm_line("EngineCore", pid, level, fileinfo, lineno, msg)

    budget = target.hardware.memory_per_gpu_gib * eng.gpu_memory_utilization
    weights = _WEIGHTS_GIB_TOTAL / tp
    available = budget - weights - _ACTIVATION_GIB
    lines = [
        ec("model_runner.py", 4120, f"Model loading took {weights:.2f} GiB memory and 41.237516 seconds"),
        ec("default_loader.py", 291, "Loading weights took 38.91 seconds"),
    ]
    if eng.kv_cache_dtype.startswith("fp8"):
        lines.append(ec("cache.py", 484, "Using fp8 data type to store kv cache. It reduces the GPU memory footprint "
                        "and boosts the performance. Meanwhile, it may cause accuracy drop without a proper "
                        "scaling factor"))
    if available <= 0:
        msg = ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when initializing "
               "the engine (this flag also controls CPU memory reservation on the CPU backend, despite its name). "
               "See https://docs.vllm.ai/en/latest/configuration/conserving_memory/ for more details.")
        lines.append(ec("core.py", 1102, "EngineCore failed to start.", "ERROR"))
        lines.append(f"ValueError: {msg}")
        return BootResult(lines=lines, alive=False, exit_message=msg)
    avail_bytes = available * GIB
    pool = int(avail_bytes // _kv_bytes_per_token(eng.kv_cache_dtype))
    blocks = pool // eng.block_size
    pool = blocks * eng.block_size
    concurrency = pool / eng.max_model_len
    lines.append(ec("gpu_worker.py", 436, f"Available KV cache memory: {gib(avail_bytes)} GiB"))
    lines.append(ec("kv_cache_utils.py", 1310,
                    f"GPU KV cache size: {thousands(pool)} tokens, Maximum concurrency for "
                    f"{thousands(eng.max_model_len)} tokens per request: {concurrency:.2f}x"))
    lines.append(ec("gpu_model_runner.py", 4630, "Graph capturing finished in 23 secs, took 1.12 GiB"))
    lines.append(ec("core.py", 262, "init engine (profile, create kv cache, warmup model) took 96.42 s"))
    return BootResult(lines=lines, alive=True, kv_pool_tokens=pool, num_gpu_blocks=blocks,
                      max_concurrency=concurrency, available_kv_gib=round(available, 2))
