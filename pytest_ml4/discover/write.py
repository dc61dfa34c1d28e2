"""``ml4-target new``: read a running deployment, write ``targets/NAME.yaml`` with each value's source beside it.

Works without pytest::

    from pytest_ml4.discover import NewTarget, new_target
    result = new_target(NewTarget(name="mine", endpoint="http://10.0.0.5:8000/v1", api_key_env="LLM_API_KEY",
                                  hardware="h200", gpus=8))
    result.path, result.undiscovered

The file is validated with the target loader before it is written; an existing file is kept unless ``force``.
"""

from __future__ import annotations

import datetime as dt
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from pytest_ml4.client.urls import display_url
from pytest_ml4.discover.dgd import from_dgd, read_dgd
from pytest_ml4.discover.draft import (
    Draft,
    check,
    drafted_stack,
    env_prefix,
    estimates,
    fields_table,
    from_hardware,
    from_health,
    from_log,
    from_metrics,
    from_models,
    served_card,
    target_from,
)
from pytest_ml4.discover.probe import DiscoverError, endpoint_for, probe
from pytest_ml4.discover.proxy import from_litellm
from pytest_ml4.logs import FileLogReader, LogView
from pytest_ml4.target.model import TargetError

#: The order of a target file's top-level keys (the bundled targets' order).
SECTION_ORDER = ("name", "description", "source", "hardware", "topology", "serving", "engine", "prefill_engine",
                 "endpoint", "logs", "control", "gates", "perf")


@dataclass(frozen=True)
class NewTarget:
    """What ``ml4-target new`` was asked (the command line's options)."""

    name: str
    endpoint: str
    hardware: str
    gpus: int
    api_key_env: str | None = None
    gpu: str | None = None
    gpu_memory_gib: float | None = None
    bandwidth_tb_s: float | None = None
    metrics_url: str | None = None
    litellm_config: str | None = None
    log_file: str | None = None
    unit: str | None = None
    ssh_host_env: str | None = None
    dgd: str | None = None
    namespace: str | None = None
    dynamo_version: str | None = None
    model: str | None = None
    out: str = "targets"
    force: bool = False


@dataclass(frozen=True)
class Written:
    path: Path
    #: One line per value that is an estimate (field: how to set it) and per page that could not be read.
    undiscovered: list[str]


def new_target(req: NewTarget, environ: dict[str, str] | None = None) -> Written:
    env = os.environ if environ is None else environ
    path = Path(req.out) / f"{req.name}.yaml"
    if path.exists() and not req.force:
        raise DiscoverError(f"{path} exists: pass --force to overwrite it")
    key = _api_key(req, env)
    draft = Draft()
    _from_flags(draft, req)
    view = _log_view(req.log_file) if req.log_file else None
    ep = endpoint_for(req.endpoint, key, req.metrics_url)
    shown = probe(ep, key_source=req.api_key_env)
    card = served_card(shown, req.model)
    from_models(draft, shown, card)
    from_metrics(draft, shown, card["id"])
    notes = list(shown.unread)
    if len(shown.models) > 1 and req.model is None:
        listed = ", ".join(str(c["id"]) for c in shown.models)
        notes.append(f"{shown.models_url} lists {listed}: described {card['id']} (pass --model NAME for another)")
    if req.dgd and req.namespace:  # the command line gives both or neither
        notes += from_dgd(draft, read_dgd(req.dgd, req.namespace), Path(req.out).resolve().parent)
    if req.litellm_config:
        notes += from_litellm(draft, req.litellm_config, shown, card["id"])
    notes += from_health(draft, shown)
    prefix = drafted_stack(draft).metric_prefix
    if shown.health is None and not (shown.metrics and any(n.startswith(prefix) for n in shown.metrics.names())):
        notes.append(f"{shown.metrics_url}: no {prefix}* families (behind a proxy: pass --metrics-url with the "
                     f"engine's /metrics)")
    if view is not None and not from_log(draft, view):
        notes.append(f"{view.source}: no vLLM 'non-default args' line")
    estimates(draft, req.name)
    draft.offer("perf.workloads", fields_table().perf_estimate["workloads"],
                "estimate: lenient placeholders for the goodput gates; set from your SLO document")
    data = _document(draft)
    try:
        check(data, str(path))
    except TargetError as err:
        raise DiscoverError(f"the target written from {shown.base_url} does not validate: {err}") from None
    unset = [f"{path}: not set: {how}" for path, how in fields_table().optional_unset.items()
             if path not in draft.values]
    undiscovered = _grouped(draft) + notes + unset
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(draft, _header(req, shown.base_url, undiscovered), data), encoding="utf-8")
    return Written(path, undiscovered)


def _grouped(draft: Draft) -> list[str]:
    """One line per reason: ``field, field: how to set them`` (the hardware rows share their spec sheet)."""
    by_reason: dict[str, list[str]] = {}
    for path, v in draft.estimated():
        by_reason.setdefault(v.source.removeprefix("estimate: "), []).append(path)
    return [f"{', '.join(paths)}: {reason}" for reason, paths in by_reason.items()]


def _api_key(req: NewTarget, env: Any) -> str | None:
    if not req.api_key_env:
        return None
    key = env.get(req.api_key_env)
    if not key:
        raise DiscoverError(f"--api-key-env {req.api_key_env}: the variable is not set (or empty)")
    return str(key)


def _log_view(log_file: str) -> LogView:
    if not Path(log_file).is_file():
        raise DiscoverError(f"--log-file {log_file}: no such file")
    # The whole file: every boot logs its arguments, so the last line is the running engine's (a window cut at
    # the last boot marker would lose it when the marker is the engine core's line, logged after it).
    return LogView(FileLogReader(log_file).read(), str(log_file))


def _from_flags(draft: Draft, req: NewTarget) -> None:
    today = dt.date.today().isoformat()
    # Credentials and query strings never reach the file (a key may travel as ?api_key=): the URL variable can
    # carry the full URL at run time.
    url = display_url(req.endpoint)
    draft.offer("name", req.name, "flag NAME")
    draft.offer("description", f"written by ml4-target new from {url} on {today}", "flag --endpoint")
    draft.offer("source", f"ml4-target new: what the deployment at {url} showed on {today}; estimates "
                          "marked in the file", "flag --endpoint")
    from_hardware(draft, req.hardware, req.gpus, req.gpu, req.gpu_memory_gib, req.bandwidth_tb_s)
    prefix = env_prefix(req.name)
    draft.offer("endpoint.url_env", f"{prefix}_URL", "set by ml4-target new: a URL there replaces default_url")
    draft.offer("endpoint.default_url", url, "flag --endpoint" if url == req.endpoint else
                f"flag --endpoint without its credentials or query: set {prefix}_URL to the full URL")
    if req.api_key_env:
        draft.offer("endpoint.api_key_env", req.api_key_env, "flag --api-key-env")
    else:
        draft.offer("endpoint.requires_api_key", False, "flag: no --api-key-env")
    if req.metrics_url:
        draft.offer("endpoint.metrics_url_env", f"{prefix}_METRICS_URL",
                    f"flag --metrics-url: set this variable to {display_url(req.metrics_url)} for a run")
    if req.dynamo_version:
        draft.offer("serving.dynamo_version", req.dynamo_version, "flag --dynamo-version")
    _access_flags(draft, req)


def _access_flags(draft: Draft, req: NewTarget) -> None:
    """Where logs are read and how the engine restarts, as the flags say (an explicit log file first)."""
    if req.log_file:
        draft.offer("logs.kind", "file", "flag --log-file")
        draft.offer("logs.path", str(Path(req.log_file).resolve()), "flag --log-file")
    if req.dgd:
        draft.offer("logs.kind", "kubernetes", "flag --dgd (the pods of control.dgd)")
        draft.offer("control.kind", "kubernetes", "flag --dgd")
        draft.offer("control.dgd", req.dgd, "flag --dgd")
        draft.offer("control.namespace", req.namespace, "flag --namespace")
    if req.unit:
        for section in ("logs", "control"):
            draft.offer(f"{section}.kind", "journald" if section == "logs" else "systemd", "flag --unit")
            draft.offer(f"{section}.unit", req.unit, "flag --unit")
            if req.ssh_host_env:
                draft.offer(f"{section}.ssh_host_env", req.ssh_host_env, "flag --ssh-host-env")


def _document(draft: Draft) -> dict[str, Any]:
    data = target_from(draft)
    return {k: data[k] for k in SECTION_ORDER if k in data}


# ------------------------------------------------------------------------------------------------ YAML
def _header(req: NewTarget, base_url: str, undiscovered: list[str]) -> list[str]:
    lines = [f"Target {req.name}, written by `ml4-target new` on {dt.date.today().isoformat()} from {base_url}.",
             "Each value says where it came from: 'discovered: <what the deployment showed>', 'flag --X', or",
             "'estimate: <how to set it>'. Validated with pytest_ml4.target.model.load_target when written."]
    if undiscovered:
        lines.append("Not discovered (check these before a gate run):")
        lines += [f"  - {u}" for u in undiscovered]
    return lines


def _flow(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, allow_unicode=True).strip()
    return text.removesuffix("\n...").removesuffix("...").strip()


def _nested(value: Any) -> bool:
    return isinstance(value, dict) and any(isinstance(v, dict) for v in value.values())


def render(draft: Draft, header: list[str], data: dict[str, Any]) -> str:
    """The YAML text: the header as comments, then each field with its source as a trailing comment."""
    out = [f"# {line}".rstrip() for line in header]
    _emit(data, draft, "", 0, out)
    return "\n".join(out) + "\n"


def _emit(node: dict[str, Any], draft: Draft, prefix: str, depth: int, out: list[str]) -> None:
    pad = "  " * depth
    for key, value in node.items():
        path = f"{prefix}{key}"
        known = draft.values.get(path)
        comment = f"  # {known.source}" if known is not None else ""
        if isinstance(value, dict) and (known is None or _nested(value)):
            out.append(f"{pad}{key}:{comment}")
            _emit(value, draft, path + ".", depth + 1, out)
        else:
            out.append(f"{pad}{key}: {_flow(value)}{comment}")
