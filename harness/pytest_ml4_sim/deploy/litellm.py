"""A real LiteLLM proxy subprocess in front of an OpenAI-compatible backend (the simulator, in ``--sim`` runs).

The RTX PRO deployment of seed 000 serves vLLM behind a LiteLLM proxy (``drop_params: true``, alias ``ml4``);
open item 2 asks for retries so that an engine restart is not a client error. This module starts that proxy for
real, with the config generated from the target's proxy file (``serving.proxy.config``) pointed at the backend,
and either retry setting selectable:

* ``num_retries`` (router retries, ``litellm_settings``): the setting that really retries 5xx and connection errors;
  ``0`` is the only way to switch retries off (tooling.md §3.5);
* ``max_retries`` (the deployment's ``litellm_params``): only quick reconnects inside the provider client.

Works without pytest::

    from pytest_ml4_sim.deploy.litellm import LiteLLMProxy, ProxySettings
    with LiteLLMProxy(ProxySettings.from_target(target, backend_base_url="http://127.0.0.1:9001/v1"),
                      workdir=Path("run/proxy")) as proxy:
        print(proxy.base_url)          # http://127.0.0.1:<port>/v1, key: the target's api_key_env

Secrets: the proxy's master key and the backend key are referenced in the generated config as
``os.environ/<VAR>`` (LiteLLM resolves them itself), so no key is written to the config, argv or a repr.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import yaml

from pytest_ml4.runtime.installed import tools_dir, venv_executable
from pytest_ml4.stacks.litellm import (
    LITELLM_VERSION,
    ProxyConfigError,
    ProxySettings,
    render_config,
)
from pytest_ml4_sim.deploy.launcher import LaunchError, ProcessLauncher

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


class ProxyError(LaunchError, ProxyConfigError):
    """The proxy could not be configured, did not start, or died; the message carries its log tail."""


def litellm_venv() -> Path:
    """The LiteLLM venv installed by ``scripts/install.d/40-litellm.sh``."""
    return tools_dir() / f"litellm-{LITELLM_VERSION}"


def litellm_executable(required: bool = True) -> Path:
    return venv_executable(litellm_venv(), "litellm", f"LiteLLM {LITELLM_VERSION}", "40-litellm.sh", required)


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


