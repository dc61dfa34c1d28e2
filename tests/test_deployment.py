"""The deployment bundle (pytest_ml4/client/deployment.py) outside pytest: what it hands a check, and what it
builds only on first use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pytest_ml4.client.deployment import Deployment
from pytest_ml4.client.endpoint import Endpoint, make_httpx, make_openai
from pytest_ml4.target.model import load_target


def _bundle(tmp_path: Path, **extra: Any) -> Deployment:
    endpoint = Endpoint("http://127.0.0.1:9/v1", model="served-name")   # nothing is sent
    return Deployment(load_target("rtxpro6000-tp8"), endpoint, make_httpx(endpoint), make_openai(endpoint), tmp_path,
                      **extra)


def test_each_async_client_is_new_and_announced(tmp_path: Path) -> None:
    made: list[Any] = []
    ml4 = _bundle(tmp_path, _on_new_client=made.append)
    first, second = ml4.async_openai(), ml4.async_openai()
    assert first is not second, "an async client belongs to one check's event loop"
    assert made == [first, second]
    assert ml4.model == "served-name" and str(first.base_url).rstrip("/") == "http://127.0.0.1:9/v1"


def test_the_log_and_the_counter_are_built_once_and_only_when_read(tmp_path: Path) -> None:
    calls: list[str] = []
    ml4 = _bundle(tmp_path, _logs=lambda: calls.append("logs"), _token_counter=lambda: calls.append("counter") or 7)
    assert calls == [], "nothing is fetched until a check reads it"
    assert ml4.logs is None and ml4.logs is None
    assert ml4.token_counter == 7 and ml4.token_counter == 7
    assert calls == ["logs", "counter"]
