"""The simulated engine's Dynamo worker process: ``@dynamo_worker``, ``register_llm``, ``serve_endpoint``.

    python -m pytest_ml4_sim.deploy.dynamo_worker_cli --target PATH --role worker|prefill|decode --model-dir DIR
        [--log-file F] [--fault NAME[=VALUE]]... [--set section.field=value]... [--no-bridge] [--generation N] [--index K]

Runs inside the Dynamo venv (``scripts/install.d/50-dynamo.sh``) with the checkout on ``PYTHONPATH``; started by
:class:`pytest_ml4_sim.deploy.dynamo.DynamoWorker`. What it serves (:class:`pytest_ml4_sim.sim.dynamo_worker.Worker`) is
the simulated engine's; this module registers it with the real Dynamo runtime, serves it, and on SIGTERM
deregisters (``runtime.shutdown``) and drains.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
from typing import Any

from pytest_ml4.target.model import Target
from pytest_ml4_sim.deploy.sim_cli import target_and_faults
from pytest_ml4_sim.sim.dynamo_bridge import behaviour
from pytest_ml4_sim.sim.dynamo_worker import (
    COMPONENTS,
    NAMESPACE,
    Worker,
    runtime_config,
)
from pytest_ml4_sim.sim.faults import ActiveFaults
from pytest_ml4_sim.sim.logfmt import vllm_line
from pytest_ml4_sim.sim.server import LogWriter


def _write_atomically(path: str, text: str) -> None:
    """The handle polls this file: it must never see it half-written."""
    tmp = path + ".tmp"
    with open(tmp, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


async def serve(runtime: Any, args: argparse.Namespace, worker: Worker) -> None:
    from dynamo.llm import (
        KvEventPublisher,
        ModelInput,
        ModelType,
        WorkerType,
        register_llm,
    )

    t = worker.target
    role = args.role
    ep = runtime.endpoint(f"{NAMESPACE}.{COMPONENTS[role]}.generate")
    chat = ModelType.Chat | ModelType.Completions
    # A prefill worker exposes no OpenAI surface (1.6.1 refuses Chat on WorkerType.Prefill); each disagg role
    # names the other as what it needs, so the model is listed only while both exist (real-dynamo.md).
    kinds = {"worker": (WorkerType.Aggregated, chat, None),
             "prefill": (WorkerType.Prefill, ModelType.Prefill, [[WorkerType.Decode]]),
             "decode": (WorkerType.Decode, chat, [[WorkerType.Prefill]])}
    wtype, mtype, needs = kinds[role]
    worker.app.engine.start()
    ep.metrics.register_prometheus_expfmt_callback(worker.metrics_text)
    await register_llm(ModelInput.Tokens, mtype, ep, args.model_dir,
                       t.serving.served_model_name, worker_type=wtype, kv_cache_block_size=t.engine.block_size,
                       runtime_config=runtime_config(t, worker.app.faults), needs=needs)
    # Push mode (no zmq_endpoint): the engine's prefix-cache changes go out through publish_stored/removed.
    publisher = KvEventPublisher(ep, kv_block_size=t.engine.block_size)
    if not worker.app.faults.has("kv_events_off"):
        worker.publish_kv_events(publisher)
    loop = asyncio.get_running_loop()

    def on_sigterm() -> None:
        # Deregister at once (else the instance stays listed ~10 s and gets 503s), then drain in-flight streams
        # (serve_endpoint's graceful_shutdown).
        worker.draining = True
        worker.log.raw(f"INFO dynamo worker {role}: SIGTERM, deregistering and draining")
        runtime.shutdown()

    loop.add_signal_handler(signal.SIGTERM, on_sigterm)
    loop.add_signal_handler(signal.SIGINT, on_sigterm)
    runtime.set_health_status(True)
    if args.id_file:
        _write_atomically(args.id_file, str(ep.connection_id()))
    worker.log.raw(f"INFO dynamo worker {role} serving {t.serving.served_model_name} as {NAMESPACE}."
                   f"{COMPONENTS[role]}.generate (pid {os.getpid()}, bridge {'on' if worker.mode.bridged else 'off'})")
    await ep.serve_endpoint(worker.generate, graceful_shutdown=True)
    await worker.app.engine.stop()
    publisher.shutdown()
    worker.log.raw(f"INFO dynamo worker {role}: drained, exiting")


#: vLLM's refusal to start on a GPU another process still holds (vllm/v1/worker/utils.py ``request_memory``, the
#: text of 0.32+; recorded in fixtures/logs/rtxpro-startup-refused.log). The share still free is made up: an orphaned
#: EngineCore of the replaced pod holding the rest.
FREE_MEMORY_REFUSAL = ("ValueError: Free memory on device cuda:0 ({free:.2f}/{total:.2f} GiB) on startup is less than "
                       "desired GPU memory utilization ({util}, {wanted:.2f} GiB). Decrease GPU memory utilization or "
                       "reduce GPU memory used by other processes.")
ORPHAN_HELD_SHARE = 0.62


def refuses_boot(role: str, faults: ActiveFaults, generation: int) -> bool:
    """Fault ``prefill_crashloop=N``: a prefill worker booted by its pod's N-th replacement or later."""
    return role == "prefill" and faults.from_restart("prefill_crashloop", generation)


def log_boot_refusal(log_file: str | None, target: Target, role: str) -> None:
    """The lines a real worker's log ends with when vLLM refuses to start (in the recorded lines' shape), written
    once: the launcher sends this process's stderr to the same file."""
    engine = target.prefill_engine if role == "prefill" and target.prefill_engine else target.engine
    total = target.hardware.memory_per_gpu_gib
    refusal = FREE_MEMORY_REFUSAL.format(free=total * (1 - ORPHAN_HELD_SHARE), total=total,
                                         util=engine.gpu_memory_utilization,
                                         wanted=total * engine.gpu_memory_utilization)
    pid = os.getpid()
    log = LogWriter(log_file, pid)
    log.raw(vllm_line("Worker_TP0", pid, "ERROR", "multiproc_executor.py", 771, "WorkerProc failed to start."))
    log.raw(refusal)
    log.raw(vllm_line("EngineCore_DP0", pid, "ERROR", "core.py", 1102, "EngineCore failed to start."))


def never_registers(faults: ActiveFaults, generation: int) -> bool:
    """Fault ``restart_never_registers=N``: a worker booted by its pod's N-th replacement or later."""
    return faults.from_restart("restart_never_registers", generation)


def hang_unregistered(log_file: str | None, role: str) -> int:
    """Stay up without registering (as a worker stuck before its registration does) until SIGTERM or SIGINT."""
    LogWriter(log_file, os.getpid()).raw(f"INFO dynamo worker {role}: starting; registration does not complete")
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # sigwait needs them blocked
    signal.sigwait({signal.SIGTERM, signal.SIGINT})
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_ml4_sim.deploy.dynamo_worker_cli")
    p.add_argument("--target", required=True)
    p.add_argument("--role", required=True, choices=sorted(COMPONENTS))
    p.add_argument("--model-dir", required=True)
    p.add_argument("--log-file", default=None)
    p.add_argument("--id-file", default=None, help="write the worker's Dynamo instance id here once registered")
    p.add_argument("--fault", action="append", default=[])
    p.add_argument("--set", action="append", default=[], dest="overrides")
    p.add_argument("--no-bridge", action="store_true")
    p.add_argument("--generation", type=int, default=0, help="restarts of this worker's pod before this boot")
    p.add_argument("--index", type=int, default=0,
                   help="this worker's place among its role's workers in start order (fault only_worker)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    target, faults = target_and_faults(args)
    faults = faults.for_worker(args.index)
    if refuses_boot(args.role, faults, args.generation):
        log_boot_refusal(args.log_file, target, args.role)
        return 1
    if never_registers(faults, args.generation):
        return hang_unregistered(args.log_file, args.role)
    worker = Worker(target, args.role, faults, behaviour(not args.no_bridge), args.log_file, args.generation)
    if worker.app is None:
        return 1
    from dynamo.runtime import dynamo_worker

    @dynamo_worker()
    async def run(runtime: Any) -> None:
        await serve(runtime, args, worker)

    asyncio.run(run())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
