"""A real LiteLLM proxy subprocess in front of an OpenAI-compatible backend (the simulator, in ``--sim`` runs).

The RTX PRO deployment of seed 000 serves vLLM behind a LiteLLM proxy (``drop_params: true``, alias ``ml4``);
open item 2 asks for retries so that an engine restart is not a client error. This module starts that proxy for
real, with the config generated from the target's proxy file (``serving.proxy.config``) pointed at the backend,
and either retry setting selectable:

* ``num_retries`` (router retries, ``litellm_settings``): the setting that really retries 5xx and connection errors;
  ``0`` is the only way to switch retries off (tooling.md §3.5);
* ``max_retries`` (the deployment's ``litellm_params``): only quick reconnects inside the provider client.

Works without pytest::

    from pytest_ml4.deploy.litellm import LiteLLMProxy, ProxySettings
    with LiteLLMProxy(ProxySettings.from_target(target, backend_base_url="http://127.0.0.1:9001/v1"),
                      workdir=Path("run/proxy")) as proxy:
        print(proxy.base_url)          # http://127.0.0.1:<port>/v1, key: the target's api_key_env

Secrets: the proxy's master key and the backend key are referenced in the generated config as
``os.environ/<VAR>`` (LiteLLM resolves them itself), so no key is written to the config, argv or a repr.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from pytest_ml4.deploy.launcher import LaunchError, ProcessLauncher
from pytest_ml4.locations import data_file
from pytest_ml4.targets import Target
from pytest_ml4.tools import tools_dir, venv_executable

LITELLM_VERSION = "1.108.7"
#: tooling.md §3.3: start-up took 10-29 s on 2 cores; "Allow >= 60 s for readiness in fixtures".
DEFAULT_START_TIMEOUT_S = 90.0
#: tooling.md §3.3: without these, ``import litellm`` tries to download the cost map and other files.
OFFLINE_ENV: dict[str, str] = {
    "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    "LITELLM_LOCAL_ANTHROPIC_BETA_HEADERS": "True",
    "LITELLM_LOCAL_AUTOROUTER_PRESETS": "True",
    "LITELLM_LOCAL_BLOG_POSTS": "True",
    "LITELLM_LOCAL_POLICY_TEMPLATES": "True",
    "LITELLM_TELEMETRY_DISABLED": "true",
    "LITELLM_DONT_SHOW_FEEDBACK_BOX": "true",
    "NO_PROXY": "127.0.0.1,localhost",
    "no_proxy": "127.0.0.1,localhost",
}
#: Response header carrying the router's retry count on success (tooling.md §3.5; absent on errors).
ATTEMPTED_RETRIES_HEADER = "x-litellm-attempted-retries"
#: Variable the generated config names for the master key / backend key when the target names none.
FALLBACK_KEY_ENV = "ML4_PROXY_KEY"


class ProxyError(LaunchError):
    """The proxy could not be configured, did not start, or died; the message carries its log tail."""


def litellm_venv() -> Path:
    """The LiteLLM venv installed by ``scripts/install.d/40-litellm.sh``."""
    return tools_dir() / f"litellm-{LITELLM_VERSION}"


def litellm_executable(required: bool = True) -> Path:
    return venv_executable(litellm_venv(), "litellm", f"LiteLLM {LITELLM_VERSION}", "40-litellm.sh", required)


@dataclass(frozen=True)
class ProxySettings:
    """What the generated config says: where the backend is, the alias, the two retry settings."""

    base_config: Path
    backend_base_url: str
    alias: str
    backend_model: str
    key_env: str
    num_retries: int = 2
    max_retries: int = 2
    extra_env: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def from_target(cls, target: Target, backend_base_url: str, *, num_retries: int | None = None,
                    max_retries: int | None = None) -> ProxySettings:
        """Settings from ``serving.proxy``; ``None`` keeps the target's retry values."""
        proxy = target.serving.proxy
        if proxy is None:
            raise ProxyError(f"target {target.name} has no serving.proxy section")
        backend_model = target.serving.engine_served_model_name or target.serving.served_model_name
        return cls(base_config=target.resolve(proxy.config), backend_base_url=backend_base_url.rstrip("/"),
                   alias=proxy.model_alias, backend_model=backend_model,
                   key_env=target.endpoint.api_key_env or FALLBACK_KEY_ENV,
                   num_retries=proxy.num_retries if num_retries is None else num_retries,
                   max_retries=proxy.max_retries if max_retries is None else max_retries)

    def with_retries(self, num_retries: int, max_retries: int | None = None) -> ProxySettings:
        return replace(self, num_retries=num_retries,
                       max_retries=self.max_retries if max_retries is None else max_retries)


def render_config(settings: ProxySettings) -> dict[str, Any]:
    """The target's proxy config with the alias pointed at the backend and the chosen retry settings.

    Every other setting of the file (``drop_params``, ``max_input_tokens``, timeouts) is kept as written.
    """
    try:
        data = yaml.safe_load(settings.base_config.read_text())
    except FileNotFoundError:
        raise ProxyError(f"proxy config {settings.base_config} not found (serving.proxy.config)") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_list"), list):
        raise ProxyError(f"proxy config {settings.base_config} has no model_list")
    cfg = copy.deepcopy(data)
    entries = [m for m in cfg["model_list"] if isinstance(m, dict) and m.get("model_name") == settings.alias]
    if not entries:
        raise ProxyError(f"proxy config {settings.base_config} has no model_list entry named {settings.alias!r}")
    # Other routes to the alias's engine (another name, a "*" catch-all) follow it to the backend started here.
    engine_bases = {(m.get("litellm_params") or {}).get("api_base") for m in entries} - {None}
    entries += [m for m in cfg["model_list"] if isinstance(m, dict) and m not in entries
                and (m.get("litellm_params") or {}).get("api_base") in engine_bases]
    for entry in entries:
        params = entry.setdefault("litellm_params", {})
        # hosted_vllm/ is the provider the reference exercised; it passes vLLM extras such as min_tokens through.
        params["model"] = f"hosted_vllm/{settings.backend_model}"
        params["api_base"] = settings.backend_base_url
        params["api_key"] = f"os.environ/{settings.key_env}"
        params["max_retries"] = settings.max_retries
    cfg.setdefault("litellm_settings", {})
    cfg["litellm_settings"] = dict(cfg["litellm_settings"] or {}, num_retries=settings.num_retries)
    general = dict(cfg.get("general_settings") or {})
    general["master_key"] = f"os.environ/{settings.key_env}"
    cfg["general_settings"] = general
    return cfg


class LiteLLMProxy(ProcessLauncher):
    """One LiteLLM proxy process on a free loopback port; ``.base_url`` is what clients use. Its group is owned:
    ``stop()`` (or the session's end, whatever ended it) ends the proxy and what it forked."""

    name = "LiteLLM proxy"
    error = ProxyError
    default_timeout = DEFAULT_START_TIMEOUT_S
    poll_s = 0.25
    probe_timeout_s = 2.0

    def __init__(self, settings: ProxySettings, workdir: Path, *, env: Mapping[str, str] | None = None) -> None:
        self.workdir = Path(workdir)
        super().__init__(self.workdir / "litellm.log", cwd=self.workdir)
        self.settings = settings
        self._env = dict(env) if env is not None else None
        self.config_file = self.workdir / "litellm-config.yaml"
        self.executable: Path | None = None

    def __repr__(self) -> str:
        return (f"LiteLLMProxy(url={self.url if self.port else None!r}, pid={self.pid}, "
                f"num_retries={self.settings.num_retries}, max_retries={self.settings.max_retries})")

    @property
    def url(self) -> str:
        if not self.port:
            raise ProxyError("proxy not started")
        return super().url

    @property
    def health_url(self) -> str:
        return self.url + "/health/liveliness"

    @property
    def num_retries(self) -> int:
        return self.settings.num_retries

    def before_start(self) -> None:
        """The executable (not installed: one line naming the install step), the config, the key variable."""
        self.executable = litellm_executable()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(render_config(self.settings), sort_keys=False))
        if not self.child_env().get(self.settings.key_env):
            raise ProxyError(f"the proxy's key variable {self.settings.key_env} is not set")

    def argv(self) -> list[str]:
        return [str(self.executable), "--config", str(self.config_file), "--host", self.host, "--port", str(self.port)]

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ if self._env is None else self._env)
        env.update(OFFLINE_ENV)
        env.update(self.settings.extra_env)
        return env


def attempted_retries(headers: Mapping[str, str]) -> int | None:
    """The router's retry count from a successful response's headers (None when absent, e.g. on errors)."""
    raw = headers.get(ATTEMPTED_RETRIES_HEADER)
    if raw is None:
        return None
    try:
        return int(raw)
    except ValueError:
        return None


# ----------------------------------------------------------------------------------------------- retry window
#: The router's backoff constants per LiteLLM version (read in the installed package; see the file's comments).
RETRY_TABLE = data_file("restart", "litellm-retry.yaml")


@dataclass(frozen=True)
class RetryWindow:
    """When the LiteLLM router re-sends a request whose backend is down, and so which outage it bridges.

    A request that reaches the proxy just as the engine goes away is answered by the first attempt made after the
    engine is back; it fails when the last attempt comes before that. ``bridged_s`` (jitter 0) is the outage
    every such request survives, ``bridged_max_s`` (full jitter) the longest one any can. A refused connection
    fails at once, so ``attempt_timeout_s`` only matters for a backend that accepts and hangs.
    """

    version: str
    num_retries: int
    initial_delay_s: float
    max_delay_s: float
    jitter_s: float
    min_delay_s: float = 0.0
    attempt_timeout_s: float | None = None

    def sleep_before(self, retry: int, jitter: float = 0.0) -> float:
        """Seconds the router sleeps before retry number ``retry`` (1-based), ``jitter`` in [0, 1]."""
        base = min(max(self.initial_delay_s * 2.0 ** (retry - 1), self.min_delay_s), self.max_delay_s)
        return base + self.jitter_s * jitter

    def attempts_at(self, jitter: float = 0.0) -> list[float]:
        """Offsets of every attempt from the first, for a backend that refuses connections."""
        out = [0.0]
        for k in range(1, self.num_retries + 1):
            out.append(out[-1] + self.sleep_before(k, jitter))
        return out

    @property
    def bridged_s(self) -> float:
        return self.attempts_at(0.0)[-1]

    @property
    def bridged_max_s(self) -> float:
        return self.attempts_at(1.0)[-1]

    def describe(self) -> str:
        offsets = ", ".join(f"+{t:.1f}" for t in self.attempts_at(0.0))
        return (f"LiteLLM {self.version} num_retries={self.num_retries}: attempts at {offsets} s (backoff "
                f"{self.initial_delay_s:g} s x 2^k, at most {self.max_delay_s:g} s, plus up to {self.jitter_s:g} s "
                f"jitter each), so it bridges an outage of {self.bridged_s:.1f} s for every request "
                f"({self.bridged_max_s:.1f} s at most)")

    @classmethod
    def from_settings(cls, settings: ProxySettings, version: str = LITELLM_VERSION,
                      table: Path = RETRY_TABLE) -> RetryWindow:
        """The window of the config ``settings`` generate (``router_settings.retry_after``, the model's timeout)."""
        rows = (yaml.safe_load(table.read_text()) or {}).get("litellm", {})
        row = rows.get(version)
        if row is None:
            raise ProxyError(f"{table}: no retry constants for LiteLLM {version} (known: {', '.join(rows)})")
        cfg = render_config(settings)
        router = cfg.get("router_settings") or {}
        timeouts = [m.get("litellm_params", {}).get("timeout") for m in cfg["model_list"]
                    if m.get("model_name") == settings.alias]
        return cls(version=version, num_retries=settings.num_retries,
                   initial_delay_s=float(row["initial_retry_delay_s"]), max_delay_s=float(row["max_retry_delay_s"]),
                   jitter_s=float(row["jitter_s"]),
                   min_delay_s=float(router.get("retry_after", row.get("router_retry_after_s", 0)) or 0),
                   attempt_timeout_s=float(timeouts[0]) if timeouts and timeouts[0] is not None else None)
