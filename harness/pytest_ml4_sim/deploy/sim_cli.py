"""``ml4-sim`` (``python -m pytest_ml4_sim.deploy.sim_cli``): the simulated vLLM 0.33 engine as a process, for a target.

    python -m pytest_ml4_sim.deploy.sim_cli --target rtxpro6000-tp8 --port 8000 [--host 127.0.0.1] [--log-file F]
                             [--fault NAME[=VALUE]]... [--set section.field=value]...

Faults come from ``--fault`` and from the target's ``sim.extra.faults`` list (so a faulty profile can be a
target file, or ``--ml4-set 'sim.extra.faults=[no_done]'`` on pytest).

The API key (when the target requires one) is read from the environment variable named by
``endpoint.api_key_env``, never from argv.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import os
import socket
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pytest_ml4.target.hardware import simulation_refusal
from pytest_ml4.target.model import (
    Target,
    TargetError,
    deep_merge,
    load_target,
    parse_override,
)
from pytest_ml4_sim.sim.faults import ActiveFaults, FaultError, describe

if TYPE_CHECKING:
    from pytest_ml4_sim.sim.server import SimConfig


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m pytest_ml4_sim.deploy.sim_cli", description="Embedded vLLM 0.33 simulator",
                                epilog="faults:\n" + describe(), formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", required=True, help="target name (targets/<name>.yaml) or path to a YAML file")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--log-file", default=None, help="append vLLM-format log lines here (default: stderr)")
    p.add_argument("--fault", action="append", default=[], metavar="NAME[=VALUE]", help="inject a named fault")
    p.add_argument("--set", action="append", default=[], metavar="section.field=value", dest="overrides",
                   help="override a target field (YAML value)")
    p.add_argument("--hold-file", default=None, help=argparse.SUPPRESS)  # SimServer.restart's standby start
    p.add_argument("--generation", type=int, default=0, help=argparse.SUPPRESS)  # restarts before this boot
    return p


def load_with_overrides(target: str, exprs: list[str]) -> Target:
    merged: dict[str, Any] = {}
    for expr in exprs:
        merged = deep_merge(merged, parse_override(expr))
    return load_target(target, overrides=merged or None, option="--set")


def target_faults(target: Target) -> list[str]:
    """Faults a target file asks for (``sim.extra.faults: [name, "name=value", ...]``), e.g. a broken profile
    kept as its own YAML; ``--fault`` adds to them."""
    raw = target.sim.extra.get("faults") or []
    if isinstance(raw, str):
        raw = [raw]
    if not isinstance(raw, list):
        raise FaultError(f"sim.extra.faults must be a list of fault names, got {raw!r}")
    return [str(f) for f in raw]


def api_key_for(target: Target) -> str | None:
    """The key from the environment, or None when the target needs none; raises SystemExit if it is missing."""
    ep = target.endpoint
    if not ep.requires_api_key:
        return None
    if not ep.api_key_env:
        raise SystemExit(f"error: target {target.name} requires an API key but names no endpoint.api_key_env")
    key = os.environ.get(ep.api_key_env)
    if not key:
        raise SystemExit(f"error: target {target.name} requires an API key: set the environment variable "
                         f"{ep.api_key_env}")
    return key


def port_in_use(host: str, port: int) -> str | None:
    """One line when ``host:port`` cannot be bound (checked before the boot lines, so it is the only line)."""
    if port == 0:
        return None
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as aiohttp binds: TIME_WAIT is no conflict
        try:
            probe.bind((host, port))
        except OSError as err:
            return (f"error: cannot listen on {host}:{port}: {err.strerror or err}; stop what listens there or "
                    f"pick another --port (0 picks a free one)")
    return None


def target_and_faults(args: argparse.Namespace) -> tuple[Target, ActiveFaults]:
    """The target (with ``--set`` overrides) and its faults from parsed CLI arguments; exits 2 after one error
    line. Shared with the Dynamo worker (:mod:`pytest_ml4_sim.deploy.dynamo_worker_cli`)."""
    try:
        target = load_with_overrides(args.target, args.overrides)
        refusal = simulation_refusal(target.hardware)
        if refusal:
            raise TargetError(f"target {target.name}: {refusal}")
        faults = ActiveFaults([*target_faults(target), *args.fault])
        if faults.has("only_worker") and not target.is_dynamo:
            raise FaultError(f"fault only_worker acts on one worker of a Dynamo deployment; target {target.name} "
                             f"runs one engine ({target.serving.stack})")
        return engine_launch(target, faults), faults
    except (TargetError, FaultError) as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def engine_launch(target: Target, faults: ActiveFaults) -> Target:
    """The target as the simulated engine really runs it: fault ``synthetic_acceptance`` turns DSpark's synthetic
    acceptance on in the engine's launch (every role: seed 002 sets it on both roles or neither), not in the
    target the suite reads."""
    if not faults.has("synthetic_acceptance"):
        return target
    roles = {role: eng for role, eng in (("engine", target.engine), ("prefill_engine", target.prefill_engine))
             if eng is not None}
    if any(eng.speculative is None for eng in roles.values()):
        raise FaultError(f"fault synthetic_acceptance: target {target.name} runs no speculative decoding")
    return target.model_copy(update={role: eng.model_copy(update={"speculative": eng.speculative.model_copy(
        update={"synthetic_acceptance": True})}) for role, eng in roles.items()})


async def hold_until_released(cfg: SimConfig, poll_s: float = 0.02) -> None:
    """Standby start: do the slow part (tokenizer) now, then wait until the hold file names a release time.

    ``SimServer.restart`` starts the next engine process this way while the old one still serves, then writes
    the release time (the old engine's stop + ``sim.restart_outage_s``) once the old one has exited: the outage
    clients see is the target's modelled figure, not however long Python takes to start on a busy machine.
    The hold file gets a ``.ready`` twin when the slow part is done. Nothing is logged before the release, so
    the engine log shows the boot after the old engine's shutdown, as a real restart does.
    """
    from pytest_ml4.evidence.tokenizer import get_tokenizer

    assert cfg.hold_file
    get_tokenizer(cfg.target.engine.tokenizer_version).max_chars_per_token  # noqa: B018 - warm the cached scan
    hold = Path(cfg.hold_file)
    Path(str(hold) + ".ready").write_text(str(os.getpid()))
    while not hold.exists():
        await asyncio.sleep(poll_s)
    release = float(hold.read_text().strip() or 0)
    await asyncio.sleep(max(0.0, release - time.time()))


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    target, faults = target_and_faults(args)
    key = api_key_for(target)
    # A standby restart (--hold-file) starts while the old engine still owns the port: it binds on release.
    busy = None if args.hold_file else port_in_use(args.host, args.port)
    if busy:
        print(busy, file=sys.stderr)
        return 2
    from pytest_ml4_sim.sim.server import (  # aiohttp imported only once arguments are valid
        SimConfig,
        serve,
    )

    async def hold_then_serve(cfg: SimConfig) -> int:
        if cfg.hold_file:
            await hold_until_released(cfg)
        return await serve(cfg)

    cfg = SimConfig(target=target, host=args.host, port=args.port, faults=faults, api_key=key,
                    log_file=args.log_file, hold_file=args.hold_file,
                    generation=args.generation)
    try:
        return asyncio.run(hold_then_serve(cfg))
    except OSError as err:
        if err.errno != errno.EADDRINUSE:
            raise
        # Taken between the check and the boot: still one line, not a traceback after the boot log.
        print(f"error: cannot listen on {args.host}:{args.port}: {err.strerror}; pick another --port", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
