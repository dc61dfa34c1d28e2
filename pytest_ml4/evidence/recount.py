"""Token re-counts for usage checks: the deployment's own ``POST /tokenize`` where its stack serves one (vLLM,
its engine root; pytest_ml4/data/vllm/versions.yaml ``tokenize_endpoint``), else the local Tekken tokenizer.

The local fallback is mistral-common's bundled vocabulary relabelled, not the deployed checkpoint's
``tekken.json``: some words may split differently, so checks allow a relative slack for it and say so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import httpx

from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.evidence.tokenizer import get_tokenizer
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import Target

#: Relative slack a local re-count needs (the deployed vocabulary may split some words differently).
LOCAL_SLACK_FRACTION = 0.05


@dataclass
class TokenCounter:
    """Counts the tokens of output text the way the deployment does, or as close as it can."""

    tokenize_url: str | None
    tokenizer_version: int
    #: Set once /tokenize failed: every later count is local (and says so).
    _fell_back: str | None = field(default=None, init=False)

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self.tokenize_url and self._fell_back is None:
            try:
                r = httpx.post(self.tokenize_url, json={"prompt": text, "add_special_tokens": False}, timeout=30)
                if r.status_code == 200 and isinstance(r.json().get("count"), int):
                    return int(r.json()["count"])
                self._fell_back = f"POST {self.tokenize_url} answered HTTP {r.status_code}"
            except (httpx.HTTPError, ValueError) as err:
                self._fell_back = f"POST {self.tokenize_url} failed: {type(err).__name__}"
        return get_tokenizer(self.tokenizer_version).count(text)

    @property
    def local(self) -> bool:
        return not self.tokenize_url or self._fell_back is not None

    def slack(self, tokens: int, base: int) -> int:
        """Allowed difference for a re-count of ``tokens``: ``base`` (parser edges) plus the local slack."""
        return max(base, int(tokens * LOCAL_SLACK_FRACTION)) if self.local else base

    def describe(self) -> str:
        if not self.local:
            return f"re-counted by the deployment's POST {self.tokenize_url}"
        why = self._fell_back or "the stack serves no /tokenize"
        return (f"re-counted locally ({why}) with mistral-common's bundled Tekken, not the deployed checkpoint's "
                f"vocabulary, hence {LOCAL_SLACK_FRACTION:.0%} slack")


def counter_for(target: Target, endpoint: Endpoint) -> TokenCounter:
    """The counter for a target: vLLM-served stacks ask the engine's ``/tokenize`` (at the root its ``/metrics``
    is served from), Dynamo frontends serve none."""
    from pytest_ml4.stacks.vllm_versions import for_version

    url = None
    if stack_for(target).engine_tokenize and for_version(target.engine.version).tokenize_endpoint:
        metrics = endpoint.effective_metrics_url
        url = (metrics[: -len("/metrics")] if metrics.endswith("/metrics") else endpoint.root_url) + "/tokenize"
    return TokenCounter(url, target.engine.tokenizer_version)
