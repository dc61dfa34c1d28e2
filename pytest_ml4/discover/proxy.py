"""``--litellm-config PATH``: the LiteLLM proxy in front of the engine, from the config it runs.

The endpoint is then the proxy: its ``/v1/models`` gives the alias clients use, the engine's own (at
``--metrics-url``'s server) the engine's served name; the retry settings come from the config file
(``litellm_settings.num_retries``, the alias entry's ``litellm_params.max_retries``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from pytest_ml4.discover.draft import Draft
from pytest_ml4.discover.probe import DiscoverError, Shown
from pytest_ml4.stacks import STACK_FIELD, litellm


def read_config(path: str) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise DiscoverError(f"--litellm-config {path}: cannot read it: {' '.join(str(err).split())}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_list"), list):
        raise DiscoverError(f"--litellm-config {path}: no model_list (not a LiteLLM proxy config)")
    return data


def from_litellm(draft: Draft, path: str, shown: Shown, alias: str) -> list[str]:
    """Stack, proxy section and the engine's served name; returns notes on what the config does not say."""
    config = read_config(path)
    draft.offer(STACK_FIELD, litellm.NAME, "flag --litellm-config")
    draft.offer("serving.proxy.kind", "litellm", "flag --litellm-config")
    draft.offer("serving.proxy.config", path, "flag --litellm-config")
    draft.offer("serving.proxy.model_alias", alias, f"discovered: {shown.models_url}")
    if shown.engine_models:
        draft.offer("serving.engine_served_model_name", shown.engine_models[0]["id"],
                    f"discovered: {shown.engine_models_url}")
    notes = []
    settings = config.get("litellm_settings") or {}
    if isinstance(settings.get("num_retries"), int):
        draft.offer("serving.proxy.num_retries", settings["num_retries"],
                    f"discovered: {path} litellm_settings.num_retries")
    else:
        notes.append(f"{path}: no litellm_settings.num_retries: LiteLLM's router does not retry (num_retries 0)")
    entry = next((m for m in config["model_list"] if isinstance(m, dict) and m.get("model_name") == alias), None)
    if entry is None:
        return [*notes, f"{path}: no model_list entry named {alias!r} (the alias {shown.models_url} lists)"]
    params = entry.get("litellm_params") or {}
    if isinstance(params.get("max_retries"), int):
        draft.offer("serving.proxy.max_retries", params["max_retries"],
                    f"discovered: {path} model_list[{alias}].litellm_params.max_retries")
    return notes
