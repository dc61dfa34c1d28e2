"""LiteLLM proxy rules: retries must be on so a single engine restart is not a client error."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from pytest_ml4.preflight.model import Finding, LintContext, LiteLLMConfig, Severity
from pytest_ml4.preflight.rules.registry import RULES, rule


def _retry_settings(cfg: LiteLLMConfig) -> tuple[list[tuple[str, Any]], list[tuple[str, Any]]]:
    """(num_retries settings, max_retries settings) as (where, value) pairs."""
    num: list[tuple[str, Any]] = []
    mx: list[tuple[str, Any]] = []
    for section in ("litellm_settings", "router_settings"):
        if "num_retries" in cfg.section(section):
            num.append((f"{section}.num_retries", cfg.section(section)["num_retries"]))
    for i, dep in enumerate(cfg.deployments()):
        params = dep.get("litellm_params") or {}
        alias = dep.get("model_name", i)
        if "num_retries" in params:
            num.append((f"model_list[{alias}].litellm_params.num_retries", params["num_retries"]))
        if "max_retries" in params:
            mx.append((f"model_list[{alias}].litellm_params.max_retries", params["max_retries"]))
    return num, mx


def _as_int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@rule("proxy-retries-off", Severity.ERROR,
      "LiteLLM proxy retries off: a single engine restart surfaces as a client error",
      "set litellm_settings.num_retries: 2 (router retries; max_retries alone neither enables nor disables them)",
      "seeds/000 open item 2: 'Proxy: max_retries 0 -> 2-3, so a single engine restart does not surface as a "
      "client error'; tooling.md §3.5: '\"No retries\" requires num_retries: 0', 'max_retries ... does not "
      "disable retries'", ("litellm",))
def check_retries(ctx: LintContext) -> Iterator[Finding]:
    r = RULES["proxy-retries-off"]
    for cfg in ctx.of(LiteLLMConfig):
        num, mx = _retry_settings(cfg)
        zero = [where for where, value in num if _as_int(value) == 0]
        if zero:
            yield r.finding(cfg, f"{', '.join(zero)} = 0")
            continue
        if not num:
            # Retries are on through LiteLLM's implicit default of 2, but the file does not say so; a config
            # with max_retries: 0 reads as "off" to a human and is exactly the seed's misunderstanding.
            hint = f" ({', '.join(f'{w} = {v}' for w, v in mx)} does not control them)" if mx else ""
            yield r.finding(cfg, f"num_retries not set, retries rely on LiteLLM's implicit default{hint}",
                            severity=Severity.WARNING)
            continue
        target = cfg.target
        want = target.serving.proxy.num_retries if target and target.serving.proxy else None
        have = _as_int(num[0][1])
        if want and have is not None and have != want:
            yield r.finding(cfg, f"{num[0][0]} = {have} but target {target.name} says {want}",  # type: ignore[union-attr]
                            severity=Severity.WARNING)
