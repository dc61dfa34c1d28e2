"""Access at a glance: what each selected suite needs from the deployment, whether it is set and reachable.

Which suite needs which access is data (``pytest_ml4/data/access/needs.yaml``). For a target and the environment,
:func:`survey` says of each access the selected suites need: where it comes from (the variable or field), whether it
is set or missing, and (``probe=True``) whether a quick bounded probe reaches it (2 s to connect). Works without
pytest; ``ml4-preflight --target NAME --access`` prints it, the plugin's session header too, and the plugin ends a
check whose suite *needs* a missing access as not judged before any request.

Secrets: a key's variable is named, never its value; URLs are shown without credentials.
"""

from __future__ import annotations

import functools
import os
import shlex
import shutil
import subprocess
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from pydantic import Field

from pytest_ml4.client.urls import display_url
from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file
from pytest_ml4.runtime import processes
from pytest_ml4.stacks import stack_for
from pytest_ml4.target.model import Target

NEEDS_FILE = data_file("access", "needs.yaml")
FIELDS_FILE = data_file("access", "fields.yaml")
CONNECT_S = 2.0
ANSWER_S = 5.0
COMMAND_S = 8.0
SSH = ("ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={int(CONNECT_S)}")

PROVIDED, SET, MISSING, NOT_NEEDED = "provided", "set", "missing", "not needed"


class AccessSpec(Strict):
    """One access: what it is, where it comes from, how to provide it (one line, or per ``logs.kind`` /
    ``control.kind``), and whether the session's start already stops without it."""

    what: str
    from_: str = Field(alias="from")
    how: str | dict[str, str]
    at_start: bool = False


class SuiteAccess(Strict):
    """The accesses a suite needs (not judged without) and uses (when present)."""

    needs: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()


class NeedsTable(Strict):
    accesses: dict[str, AccessSpec]
    suites: dict[str, SuiteAccess]


@functools.cache
def needs_table() -> NeedsTable:
    return load_yaml(NEEDS_FILE, NeedsTable)


def suite_needs(suite: str) -> tuple[str, ...]:
    row = needs_table().suites.get(suite)
    return row.needs if row else ()


def suite_uses(suite: str) -> tuple[str, ...]:
    row = needs_table().suites.get(suite)
    return row.uses if row else ()


@dataclass(frozen=True)
class Access:
    """One access: its name, where it comes from, set or missing, reachable or not, which suites it enables."""

    name: str
    source: str
    status: str  # provided | set | missing
    reachable: bool | None = None  # None: not probed (missing, or nothing a quick probe can prove)
    detail: str = ""
    needed_by: tuple[str, ...] = ()
    used_by: tuple[str, ...] = ()
    how: str = field(default="", compare=False)

    @property
    def usable(self) -> bool:
        return self.status != MISSING and self.reachable is not False

    def line(self) -> str:
        state = self.status + {True: ", reachable", False: ", NOT reachable", None: ""}[self.reachable]
        enables = ", ".join([*self.needed_by, *(f"{s} (uses)" for s in self.used_by)]) or "no selected suite"
        fix = f"; {self.how}" if not self.usable and self.how else ""
        detail = f" ({self.detail})" if self.detail else ""
        return f"{self.name:<14} {self.source}: {state}{detail}; enables {enables}{fix}"

    def why_not_judged(self) -> str:
        """The reason a check needing this access ends not judged."""
        what = needs_table().accesses[self.name].what
        state = "is missing" if self.status == MISSING else "is not reachable"
        return (f"needs {self.name} ({what}): {self.source} {state}"
                f"{f' ({self.detail})' if self.detail else ''}; {self.how}")


@dataclass
class _Context:
    target: Target
    env: Mapping[str, str]
    endpoint_url: str | None
    key_var: str | None
    log_file: str | None
    probe: bool


def _var(ctx: _Context, var: str | None) -> str | None:
    return (ctx.env.get(var) or None) if var else None


def _http(url: str, headers: Mapping[str, str] | None = None) -> tuple[bool, str, httpx.Response | None]:
    try:
        resp = httpx.get(url, headers=dict(headers or {}), timeout=httpx.Timeout(ANSWER_S, connect=CONNECT_S))
    except httpx.HTTPError as err:
        return False, f"{display_url(url)}: {type(err).__name__}", None
    return resp.status_code < 500, f"{display_url(url)}: HTTP {resp.status_code}", resp


def _command(argv: list[str], says: str, expect: str | None = None) -> tuple[bool, str]:
    """Whether ``argv`` exits 0 with some output (``expect``: that output) within COMMAND_S; ``says``: what that
    proves."""
    if shutil.which(argv[0]) is None:
        return False, f"{argv[0]} not found on PATH"
    try:
        done = processes.run(argv, capture_output=True, text=True, timeout=COMMAND_S, check=False)
    except subprocess.TimeoutExpired:
        return False, f"`{shlex.join(argv)}` did not finish within {COMMAND_S:g} s"
    out = done.stdout.strip()
    if done.returncode == 0 and out and (expect is None or out == expect):
        return True, says
    last = (done.stderr or done.stdout).strip().splitlines()
    why = last[-1][:160] if last else "no output"
    return False, f"`{shlex.join(argv)}` exit {done.returncode}: {why}"


def _endpoint(ctx: _Context) -> tuple[str, str, bool | None, str]:
    ep = ctx.target.endpoint
    url = ctx.endpoint_url or _var(ctx, ep.url_env) or ep.default_url
    source = "--endpoint" if ctx.endpoint_url else ep.url_env
    if not url:
        return source, MISSING, None, ""
    if not ctx.probe:
        return source, SET, None, display_url(url)
    ok, detail, _ = _http(url.rstrip("/") + "/models", _auth(ctx))
    return source, SET, ok, detail


def _auth(ctx: _Context) -> dict[str, str]:
    key = _var(ctx, ctx.key_var)
    return {"Authorization": f"Bearer {key}"} if key else {}


def _api_key(ctx: _Context) -> tuple[str, str, bool | None, str]:
    from pytest_ml4.client.endpoint import key_refusal

    ep = ctx.target.endpoint
    if not ep.requires_api_key:
        return "endpoint.requires_api_key", NOT_NEEDED, None, "the target needs none"
    source = ctx.key_var or "endpoint.api_key_env"
    if not _var(ctx, ctx.key_var):
        return source, MISSING, None, ""
    url = ctx.endpoint_url or _var(ctx, ep.url_env) or ep.default_url
    if not (ctx.probe and url):
        return source, SET, None, ""
    _, detail, resp = _http(url.rstrip("/") + "/models", _auth(ctx))
    if resp is None:
        return source, SET, None, "endpoint not reachable, key not tried"
    refused = key_refusal(resp.status_code, resp.text)
    return source, SET, refused is None, "refused: " + detail if refused else "accepted"


def _urls(ctx: _Context, var: str | None) -> tuple[str, ...]:
    return tuple(u.strip() for u in (_var(ctx, var) or "").split(",") if u.strip())


def _probe_urls(ctx: _Context, urls: Iterable[str]) -> tuple[bool | None, str]:
    if not ctx.probe:
        return None, ""
    results = [_http(u) for u in urls]
    return all(ok for ok, _, _ in results), "; ".join(d for _, d, _ in results)


def _engine_metrics(ctx: _Context) -> tuple[str, str, bool | None, str]:
    var = ctx.target.endpoint.metrics_url_env
    if not var:
        return "endpoint.metrics_url_env", NOT_NEEDED, None, "not named: the endpoint's own /metrics"
    urls = _urls(ctx, var)
    if not urls:
        return var, MISSING, None, ""
    return var, SET, *_probe_urls(ctx, urls)


def _worker_metrics(ctx: _Context) -> tuple[str, str, bool | None, str]:
    roles = ctx.target.endpoint.worker_metrics_url_env
    if not roles:
        return "endpoint.worker_metrics_url_env", NOT_NEEDED, None, "not a Dynamo target: the engine's /metrics"
    source = ", ".join(f"{role}: {var}" for role, var in sorted(roles.items()))
    urls = [u for var in roles.values() for u in _urls(ctx, var)]
    unset = [var for var in roles.values() if not _urls(ctx, var)]
    if unset:
        return source, MISSING, None, f"unset: {', '.join(unset)}"
    return source, SET, *_probe_urls(ctx, urls)


def _kube(ctx: _Context, namespace_env: str | None, namespace: str | None, verbs: tuple[tuple[str, str], ...]) -> \
        tuple[str, bool | None, str]:
    """(namespace or '', reachable, detail): the namespace and what a self access review says of the verbs."""
    ns = namespace or _var(ctx, namespace_env)
    if not ns:
        return "", None, f"unset: {namespace_env or 'namespace'}"
    if not ctx.probe:
        return ns, None, f"namespace {ns}"
    return ns, *_kube_rights(ns, verbs)


def _kube_rights(ns: str, verbs: tuple[tuple[str, str], ...]) -> tuple[bool | None, str]:
    try:
        from kubernetes import client as k8s

        from pytest_ml4.control.k8s_api import KubeConfigError, api_client

        api = k8s.AuthorizationV1Api(api_client())
    except (ImportError, KubeConfigError) as err:
        return False, str(err).splitlines()[0][:200]
    said = []
    for verb, resource in verbs:
        res, _, sub = resource.partition("/")
        review = k8s.V1SelfSubjectAccessReview(spec=k8s.V1SelfSubjectAccessReviewSpec(
            resource_attributes=k8s.V1ResourceAttributes(namespace=ns, verb=verb, resource=res,
                                                         subresource=sub or None)))
        try:
            allowed = api.create_self_subject_access_review(review, _request_timeout=(CONNECT_S, ANSWER_S)).status.allowed
        except Exception as err:  # noqa: BLE001 - any API or transport failure is "not reachable", said once
            return False, f"Kubernetes API: {type(err).__name__}: {str(err).splitlines()[0][:160]}"
        said.append(f"{verb} {resource}: {'allowed' if allowed else 'DENIED'}")
        if not allowed:
            return False, f"namespace {ns}: " + ", ".join(said)
    return True, f"namespace {ns}: " + ", ".join(said)


def _logs(ctx: _Context) -> tuple[str, str, bool | None, str]:
    logs = ctx.target.logs
    if ctx.log_file:
        exists = os.path.isfile(ctx.log_file)
        return "--ml4-log-file", SET if exists else MISSING, None, ctx.log_file
    if logs.kind == "file":
        path = str(ctx.target.resolve(logs.path)) if logs.path else ""
        return "logs.path", SET if path and os.path.isfile(path) else MISSING, None, path
    if logs.kind == "journald":
        host = _var(ctx, logs.ssh_host_env)
        where = f"journald unit {logs.unit} " + (f"over ssh ({logs.ssh_host_env})" if host else
                                                  f"on this machine ({logs.ssh_host_env or 'no ssh'} unset)")
        if not ctx.probe:
            return where, SET, None, ""
        argv = ["journalctl", "-u", str(logs.unit), "-n", "1", "-q", "--no-pager"]
        ok, detail = _command([*SSH, host, *argv] if host else argv, "the unit's journal has lines")
        return where, SET, ok, detail
    ctl = ctx.target.control   # a Kubernetes target names its DGD and namespace once, under control
    ns, ok, detail = _kube(ctx, ctl.namespace_env, ctl.namespace, (("list", "pods"), ("get", "pods/log")))
    return f"kubernetes pods/log of DGD {ctl.dgd}", SET if ns else MISSING, ok, detail


def _restart(ctx: _Context) -> tuple[str, str, bool | None, str]:
    ctl = ctx.target.control
    if ctl.kind == "kubernetes":
        ns, ok, detail = _kube(ctx, ctl.namespace_env, ctl.namespace, (("list", "pods"), ("delete", "pods")))
        return f"kubernetes delete pods of DGD {ctl.dgd}", SET if ns else MISSING, ok, detail
    host = _var(ctx, ctl.ssh_host_env)
    where = f"systemctl restart {ctl.unit} " + (f"over ssh ({ctl.ssh_host_env})" if host else
                                               f"on this machine ({ctl.ssh_host_env or 'no ssh'} unset)")
    if not ctx.probe:
        return where, SET, None, ""
    # The unit must be known where it runs; the right to restart it is proven only by a restart.
    argv = ["systemctl", "show", "-p", "LoadState", "--value", str(ctl.unit)]
    ok, detail = _command([*SSH, host, *argv] if host else argv, "the unit is loaded", expect="loaded")
    return where, SET, ok, detail + "; restart rights not probed (only a restart proves them)"


_PROBES: dict[str, Callable[[_Context], tuple[str, str, bool | None, str]]] = {
    "endpoint": _endpoint, "api_key": _api_key, "engine_metrics": _engine_metrics,
    "worker_metrics": _worker_metrics, "logs": _logs, "restart": _restart,
}


def survey(target: Target, suites: Iterable[str], *, env: Mapping[str, str] | None = None,
           endpoint_url: str | None = None, key_var: str | None = None, log_file: str | None = None,
           simulated: bool = False, probe: bool = True) -> list[Access]:
    """Each access the ``suites`` need or use, in the table's order (``simulated``: all provided by ``--sim``)."""
    table = needs_table()
    chosen = [s for s in suites if s in table.suites]
    ctx = _Context(target, os.environ if env is None else env, endpoint_url,
                   key_var or target.endpoint.api_key_env, log_file, probe)
    out = []
    for name, spec in table.accesses.items():
        needed = tuple(s for s in chosen if name in suite_needs(s))
        used = tuple(s for s in chosen if name in suite_uses(s))
        if not (needed or used):
            continue
        if simulated:
            out.append(Access(name, spec.from_, PROVIDED, None, "the embedded deployment, --sim", needed, used))
            continue
        source, status, reachable, detail = _PROBES[name](ctx)
        out.append(Access(name, source, status, reachable, detail, needed, used, _how(spec.how, target, name)))
    return out


def _how(how: str | dict[str, str], target: Target, name: str) -> str:
    """The fix for this target: logs and restart say it per kind (``logs.kind``, ``control.kind``)."""
    if isinstance(how, str):
        return how
    kind = target.logs.kind if name == "logs" else target.control.kind
    return how.get(kind, "")


def blocking(accesses: Iterable[Access], suite: str) -> Access | None:
    """The first access ``suite`` needs that is missing or not reachable, else None."""
    return next((a for a in accesses if suite in a.needed_by and not a.usable), None)


# -- target fields the loader leaves optional but a check needs ------------------------------------------------------

class FieldRow(Strict):
    """A check and the target fields any one of which it needs (``file``: naming a file that exists)."""

    suite: str
    check: str
    any_of: tuple[str, ...]
    why: str
    #: ``dynamo``: the row applies to Dynamo targets only.
    when: Literal["dynamo"] | None = None
    file: bool = False


class FieldsTable(Strict):
    fields: tuple[FieldRow, ...]


@functools.cache
def field_rows() -> tuple[FieldRow, ...]:
    return load_yaml(FIELDS_FILE, FieldsTable).fields


@dataclass(frozen=True)
class MissingField:
    """A target field a selected check needs and the target does not set: one line naming file, field and suite."""

    suite: str
    check: str
    fields: tuple[str, ...]
    target_file: str
    why: str
    problem: str = "not set"

    def line(self) -> str:
        field_names = " or ".join(self.fields)
        return (f"{self.target_file}: {field_names} {self.problem}; the {self.suite} suite's {self.check} needs it: "
                f"{self.why}")

    def matches(self, name: str, original: str) -> bool:
        return self.check in (name, original)


def field_value(target: Target, dotted: str) -> Any:
    """``perf.workloads.chat.capacity_rps`` read from the target (None when any part is unset)."""
    value: Any = target
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, Mapping) else getattr(value, part, None)
        if value is None:
            return None
    return value


def _row_problem(target: Target, row: FieldRow, given: frozenset[str]) -> str | None:
    """Why none of the row's fields serves (None when one does)."""
    problem = "not set"
    for name in row.any_of:
        if name in given:
            return None
        value = field_value(target, name)
        if value is None:
            continue
        if not row.file or target.resolve(str(value)).is_file():
            return None
        problem = f"names {target.resolve(str(value))}, which does not exist"
    return problem


def missing_fields(target: Target, suites: Iterable[str], given: Iterable[str] = ()) -> list[MissingField]:
    """The optional target fields the ``suites``' checks need and ``target`` lacks (``given``: fields an option
    supplies instead, e.g. ``perf.baseline`` from ``--perf-baseline``)."""
    chosen, supplied = set(suites), frozenset(given)
    stack = stack_for(target)
    out = []
    for row in field_rows():
        # ``when`` names a marker only some stacks serve (dynamo): the row is for those stacks' targets.
        if row.suite not in chosen or (row.when and row.when not in stack.markers):
            continue
        problem = _row_problem(target, row, supplied)
        if problem is not None:
            out.append(MissingField(row.suite, row.check, row.any_of, str(target.path or target.name), row.why,
                                    problem))
    return out
