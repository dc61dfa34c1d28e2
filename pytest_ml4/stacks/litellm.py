"""LiteLLM as a stack of the suite (``vllm+litellm``): its adapter (:func:`adapter`, its row of
``pytest_ml4/data/stacks/stacks.yaml``), the proxy config a target's ``serving.proxy`` generates, and what the router
does with a request whose backend is down (its retry window), read from the config and the version's constants.

Core (no simulator): the restart suite judges a live proxy with these; the embedded deployment's launcher
(``pytest_ml4_sim.deploy.litellm``) starts the real proxy from the same settings.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.stacks.base import RowStack, Stack

if TYPE_CHECKING:
    from pytest_ml4.target.model import Target

NAME = "vllm+litellm"

LITELLM_VERSION = "1.108.7"
#: Response header carrying the router's retry count on success (tooling.md §3.5; absent on errors).
ATTEMPTED_RETRIES_HEADER = "x-litellm-attempted-retries"
#: Variable the generated config names for the master key / backend key when the target names none.
FALLBACK_KEY_ENV = "ML4_PROXY_KEY"


@lru_cache(maxsize=1)
def adapter() -> Stack:
    """vLLM behind the LiteLLM proxy: all a row says (its engine is ``vllm``, reached going around the proxy)."""
    return RowStack.from_table(NAME)


class ProxyConfigError(Exception):
    """The proxy config cannot be generated from the target (no proxy section, no file, no alias entry)."""


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
            raise ProxyConfigError(f"target {target.name} has no serving.proxy section")
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
        raise ProxyConfigError(f"proxy config {settings.base_config} not found (serving.proxy.config)") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_list"), list):
        raise ProxyConfigError(f"proxy config {settings.base_config} has no model_list")
    cfg = copy.deepcopy(data)
    entries = [m for m in cfg["model_list"] if isinstance(m, dict) and m.get("model_name") == settings.alias]
    if not entries:
        raise ProxyConfigError(f"proxy config {settings.base_config} has no model_list entry named {settings.alias!r}")
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


class RetryConstants(Strict):
    """LiteLLM's retry constants of one release (its source's values, ``restart/litellm-retry.yaml``)."""

    initial_retry_delay_s: float
    max_retry_delay_s: float
    jitter_s: float
    router_retry_after_s: float = 0.0


class RetryTable(Strict):
    litellm: dict[str, RetryConstants]


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
        rows = load_yaml(table, RetryTable).litellm
        row = rows.get(version)
        if row is None:
            raise ProxyConfigError(f"{table}: no retry constants for LiteLLM {version} (known: {', '.join(rows)})")
        cfg = render_config(settings)
        router = cfg.get("router_settings") or {}
        timeouts = [m.get("litellm_params", {}).get("timeout") for m in cfg["model_list"]
                    if m.get("model_name") == settings.alias]
        return cls(version=version, num_retries=settings.num_retries,
                   initial_delay_s=row.initial_retry_delay_s, max_delay_s=row.max_retry_delay_s, jitter_s=row.jitter_s,
                   min_delay_s=float(router.get("retry_after", row.router_retry_after_s) or 0),
                   attempt_timeout_s=float(timeouts[0]) if timeouts and timeouts[0] is not None else None)
