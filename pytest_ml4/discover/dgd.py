"""``--dgd NAME --namespace NS``: the DynamoGraphDeployment through the official Kubernetes client.

The object is parsed as ``ml4-preflight`` parses a DGD file (:func:`pytest_ml4.preflight.parsers.parse_dgd`): roles,
replicas, each worker's engine flags and image. The replicas it declares set the topology (``/health`` shows only
the workers registered at that moment); the worker flags set the engine; the image tag is the Dynamo release (one
in no versions table is listed: the suite then assumes the nearest lower known release).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from kubernetes import client as k8s_client
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError as Urllib3Error

from pytest_ml4.control.k8s_api import (
    DGD_GROUP,
    DGD_PLURAL,
    DGD_VERSION,
    KubeConfigError,
    api_client,
)
from pytest_ml4.discover.draft import Draft, arg_value, fields_table
from pytest_ml4.discover.probe import DiscoverError
from pytest_ml4.preflight.model import DgdComponent, DgdDocument, EngineArgs
from pytest_ml4.preflight.parsers import parse_dgd
from pytest_ml4.stacks.dynamo_versions import behaviour, image_version, row_for


def read_dgd(name: str, namespace: str, host: str | None = None) -> DgdDocument:
    """The DGD as the API server holds it; a :class:`DiscoverError` of one line when it cannot be read."""
    where = f"--dgd {name} --namespace {namespace}"
    try:
        api = k8s_client.CustomObjectsApi(api_client(host))
        obj = api.get_namespaced_custom_object(DGD_GROUP, DGD_VERSION, namespace, DGD_PLURAL, name)
    except KubeConfigError as err:
        raise DiscoverError(f"{where}: {err}") from None
    except ApiException as err:
        raise DiscoverError(f"{where}: the Kubernetes API answered HTTP {err.status} {err.reason}") from None
    except Urllib3Error as err:
        raise DiscoverError(f"{where}: the Kubernetes API is unreachable: {type(err).__name__}") from None
    return parse_dgd(obj, f"DGD {namespace}/{name}", [], 0)


def from_dgd(draft: Draft, doc: DgdDocument, root: Path | None = None) -> list[str]:
    """Topology, engine flags, router and release from the DGD; returns notes on what it could not give. ``root``:
    the team's folder (its ``dynamo/versions.yaml`` rows count too)."""
    src = f"discovered: {doc.path}"
    prefill, decode, agg = doc.by_role("prefill"), doc.by_role("decode"), doc.by_role("agg")
    if prefill or decode:
        draft.offer("topology.kind", "disagg", f"{src} (prefill and decode components)")
        draft.offer("topology.prefill_workers", _replicas(prefill), f"{src} prefill replicas")
        draft.offer("topology.decode_workers", _replicas(decode), f"{src} decode replicas")
    elif agg:
        draft.offer("topology.kind", "agg", f"{src} (aggregated workers)")
        draft.offer("topology.workers", _replicas(agg), f"{src} worker replicas")
    main = (decode or agg)[:1]
    for section, comps in (("engine", main), ("prefill_engine", prefill[:1])):
        if comps and comps[0].engine is not None:
            _engine(draft, section, comps[0].engine, f"{src} {comps[0].name} args")
    if main and main[0].engine is not None and main[0].engine.get("tensor-parallel-size"):
        draft.offer("topology.tensor_parallel", main[0].engine.get("tensor-parallel-size"),
                    f"{src} {main[0].name} --tensor-parallel-size")
    for comp in doc.by_role("frontend")[:1]:
        if comp.frontend is not None:
            for flag, path in fields_table().dgd_frontend_flags.items():
                if comp.frontend.args.get(flag) is not None:
                    draft.offer(path, comp.frontend.args.get(flag), f"{src} {comp.name} --{flag}")
    return _release(draft, main, src, root)


def _replicas(comps: list[DgdComponent]) -> int:
    return sum(c.replicas if c.replicas is not None else 1 for c in comps)


def _engine(draft: Draft, section: str, args: EngineArgs, src: str) -> None:
    table = fields_table()
    for flag, name in table.dgd_engine_flags.items():
        if args.has(flag):
            value: Any = args.get(flag)
            draft.offer(f"{section}.{name}", True if value is None else value, f"{src} (--{flag})")
    spec = args.speculative()
    if spec is not None:
        draft.offer(f"{section}.speculative", arg_value("speculative_config", spec), f"{src} (--speculative-config)")
    for name, value in table.dgd_engine_defaults.items():
        draft.offer(f"{section}.{name}", value, f"{src}: no flag for it, none runs")


def _release(draft: Draft, main: list[DgdComponent], src: str, root: Path | None) -> list[str]:
    tag = image_version(main[0].image if main else None)
    if tag is None:
        return [f"{src}: no worker image tag to read the Dynamo release from"]
    draft.offer("serving.dynamo_version", tag, f"{src} worker image tag")
    if behaviour(tag, root=root) is None:
        base = row_for(tag, root)
        return [f"serving.dynamo_version {tag}: in no versions table ({base.source})"]
    return []
