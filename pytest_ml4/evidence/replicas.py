"""Every replica answers right: the functional probes sent to each worker of a Dynamo deployment (core, no pytest).

A deployment with one misconfigured worker of N (a rolling update half done, a pod with stale arguments, a node
with another image) passes every functional check the router happens to keep on the good ones. Here each worker
gets the suites' own probes (:data:`PROBES_FILE`: a tool call under each ``tool_choice``, parallel calls,
reasoning at an effort, a fixed length held by ``min_tokens``; streamed and not):

* **pinned** where the release honours the pin headers (``pins_workers`` of ``pytest_ml4/data/dynamo/versions.yaml``;
  the headers are :mod:`pytest_ml4.control.dynamo`'s): one route per worker when aggregated; disaggregated,
  ``max(P, D)`` routes each pinning a prefill worker (``x-dynamo-prefill-instance-id``) and a decode worker
  (``x-dynamo-worker-instance-id`` beside it: alone it is refused, fixtures/transcripts/dynamo-1.6.1/
  ml4-91_disagg_pin_headers.txt), so every worker of each role is on a route;
* **unpinned** otherwise: the probe set is sent again until every worker the frontend's ``/health`` lists has
  answered every probe, or the rounds run out.

Either way the worker that answered is read from the answer's ``nvext.worker_id``, never assumed from the pin: a
pin the deployment ignored shows as an answer from another worker. Judging is :mod:`pytest_ml4.checks.replicas`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
import yaml

from pytest_ml4.checks.chat import (
    Answer,
    ask,
    send_stream,
    stream_answer,
    streamed_nvext,
)
from pytest_ml4.client.endpoint import Endpoint, make_httpx
from pytest_ml4.control.dynamo import PIN_HEADER, PREFILL_PIN_HEADER, role_instance_ids
from pytest_ml4.datafile import Strict, load_yaml
from pytest_ml4.locations import data_file

PROBES_FILE = data_file("prompts", "replicas.yaml")
TOOLS_FILE = data_file("prompts", "tools.yaml")
REASONING_FILE = data_file("prompts", "reasoning.yaml")
#: Asks the frontend to name the workers that served each answer (dynamo.md §5 "Asserting routing from the client").
EVIDENCE = {"extra_fields": ["worker_id"]}
#: ``nvext.worker_id`` field per role.
ID_FIELDS = {"prefill": "prefill_worker_id", "decode": "decode_worker_id", "worker": "decode_worker_id"}


@dataclass(frozen=True)
class Probe:
    """One functional question: ``kind`` (``tool_choice``, ``parallel``, ``reasoning``, ``fixed_length``), the
    request, and what its verdict needs (``expect``)."""

    name: str
    kind: str
    body: dict[str, Any]
    stream: bool
    expect: dict[str, Any] = field(default_factory=dict)


def _named(tool: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": tool}}


class ReplicaProbes(Strict):
    """:data:`PROBES_FILE`: which of the suites' questions every worker is asked, and how often unpinned."""

    tool_choices: tuple[Literal["none", "auto", "required", "named"], ...]
    parallel: bool = False
    reasoning_effort: str
    fixed_length_tokens: int
    fixed_length_prompt: str
    unpinned_rounds_per_worker: int


@functools.cache
def replica_probes(path: Path = PROBES_FILE) -> ReplicaProbes:
    return load_yaml(path, ReplicaProbes)


def probe_specs(model: str) -> list[Probe]:
    """The probes of :data:`PROBES_FILE`, each streamed and not (the fixed length streamed only). The tool sets are
    the tools suite's: required/named get the tools every release's guided-JSON grammar accepts."""
    from pytest_ml4.checks.tools import load_tools
    from pytest_ml4.stacks.dynamo_versions import within_every_release

    spec = replica_probes()
    tools_data = yaml.safe_load(TOOLS_FILE.read_text())
    reasoning_data = yaml.safe_load(REASONING_FILE.read_text())
    tool_defaults = dict(tools_data["defaults"])
    toolset = load_tools(tools_data["toolset"])
    guided_toolset = within_every_release(toolset)
    parallel_tools = load_tools(tools_data["parallel"]["tools"])
    reasoning_defaults = dict(reasoning_data["defaults"])
    choice = tools_data["tool_choice"]
    base: list[tuple[str, str, dict[str, Any], dict[str, Any]]] = []
    for tc in spec.tool_choices:
        tools = guided_toolset if tc in ("required", "named") else toolset
        wire_choice = _named(choice["expect_tool"]) if tc == "named" else tc
        base.append((f"tool_choice-{tc}", "tool_choice",
                     {**tool_defaults, "messages": _user(choice["prompt"]), "tools": list(tools),
                      "tool_choice": wire_choice},
                     {"tools": list(tools), "tool_choice": wire_choice,
                      "expect_tool": None if tc == "none" else choice["expect_tool"]}))
    if spec.parallel:
        par = tools_data["parallel"]
        base.append(("parallel", "parallel",
                     {**tool_defaults, "messages": _user(par["prompt"]), "tools": list(parallel_tools)},
                     {"tools": list(parallel_tools), "tool_choice": "auto", "expect_tool": par["expect_tool"],
                      "expect_calls": par["expect_calls"], "expect_values": par["expect_values"]}))
    effort = spec.reasoning_effort
    q = reasoning_data["question"]
    base.append((f"reasoning-{effort}", "reasoning",
                 {**reasoning_defaults, "messages": _user(q["prompt"]), "reasoning_effort": effort},
                 {"effort": effort, "expect_substring": q["expect_substring"]}))
    n = spec.fixed_length_tokens
    base.append((f"fixed_length-{n}", "fixed_length",
                 {"messages": _user(spec.fixed_length_prompt), "max_tokens": n, "min_tokens": n}, {"n": n}))
    out = []
    for name, kind, body, expect in base:
        for stream in (False, True):
            if kind == "fixed_length" and not stream:
                continue  # counted on the stream's usage, as suites/test_osl.py counts it
            out.append(Probe(f"{name}-{'stream' if stream else 'nonstream'}", kind,
                             {"model": model, **body, "nvext": EVIDENCE}, stream, expect))
    return out


def _user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


# ------------------------------------------------------------------------------------------------ workers and routes
@dataclass(frozen=True)
class WorkerRef:
    """One worker: its role (``worker`` when aggregated, ``prefill``/``decode``) and Dynamo instance id."""

    role: str
    instance_id: Any

    def __str__(self) -> str:
        return f"worker {self.instance_id}" if self.role == "worker" else f"{self.role} worker {self.instance_id}"


@dataclass(frozen=True)
class Route:
    """Where a probe set goes: the pin headers (none when unpinned) and the workers they name."""

    headers: tuple[tuple[str, str], ...] = ()
    pinned: tuple[WorkerRef, ...] = ()

    def __str__(self) -> str:
        return " + ".join(map(str, self.pinned)) if self.pinned else "unpinned"


def workers_by_role(health: Any, topology: str) -> dict[str, list[Any]]:
    """The worker instances ``/health`` lists, by role, in a stable order (aggregated: one role, ``worker``)."""
    roles = role_instance_ids(health)
    if topology != "disagg":
        return {"worker": sorted(roles["decode"] | roles["prefill"], key=str)}
    return {role: sorted(ids, key=str) for role, ids in roles.items()}


def pinned_routes(workers: Mapping[str, Sequence[Any]]) -> list[Route]:
    """Routes that put every listed worker on at least one pinned route (see the module docstring)."""
    if "worker" in workers:
        return [Route(((PIN_HEADER, str(w)),), (WorkerRef("worker", w),)) for w in workers["worker"]]
    prefill, decode = list(workers.get("prefill") or []), list(workers.get("decode") or [])
    if not prefill or not decode:
        return []
    return [Route(((PREFILL_PIN_HEADER, str(p)), (PIN_HEADER, str(d))),
                  (WorkerRef("prefill", p), WorkerRef("decode", d)))
            for p, d in ((prefill[i % len(prefill)], decode[i % len(decode)])
                         for i in range(max(len(prefill), len(decode))))]


# ------------------------------------------------------------------------------------------------ replies
@dataclass
class Reply:
    """A probe's answer on a route, or why the request failed."""

    probe: Probe
    route: Route
    answer: Answer | None = None
    failure: str | None = None
    #: The answer's ``nvext`` (kept when a stream broke after its chunks named the workers).
    nvext: dict[str, Any] | None = None

    def answered_by(self, roles: Sequence[str]) -> tuple[WorkerRef, ...] | None:
        """The workers ``nvext.worker_id`` names for ``roles``; None when the answer carries no evidence."""
        ids = (self.nvext or {}).get("worker_id")
        if not isinstance(ids, dict):
            return None
        found = tuple(WorkerRef(r, ids.get(ID_FIELDS[r])) for r in roles if ids.get(ID_FIELDS[r]) is not None)
        return found or None


@dataclass
class Reach:
    """What the probes reached: the workers ``/health`` lists by role, and every reply."""

    workers: dict[str, list[Any]]
    replies: list[Reply]
    pinned: bool
    probes: list[Probe]
    #: Why no probe was sent (``/health`` unreadable or listing no worker), or None.
    unavailable: str | None = None

    @property
    def roles(self) -> list[str]:
        return list(self.workers)

    def listed(self) -> list[WorkerRef]:
        return [WorkerRef(role, i) for role, ids in self.workers.items() for i in ids]


Send = Callable[[Route, Probe], Reply]


def sender(endpoint: Endpoint, openai_client: Any) -> Send:
    """Sends one probe on one route through the suites' own :func:`~pytest_ml4.checks.chat.ask` (openai SDK when
    not streamed, the stream probe when streamed), with the route's pin headers."""
    def send(route: Route, probe: Probe) -> Reply:
        headers = dict(route.headers)
        oai = openai_client.with_options(default_headers=headers) if headers else openai_client
        nvext = None
        with make_httpx(endpoint) as http:
            http.headers.update(headers)
            try:
                if probe.stream:
                    result = send_stream(http, probe.body)
                    nvext = streamed_nvext(result)
                    answer = stream_answer(result)
                else:
                    answer = ask(oai, http, probe.body, False)
                    nvext = answer.nvext
            except AssertionError as err:
                return Reply(probe, route, failure=str(err).split("\nassert ", 1)[0], nvext=nvext)
        return Reply(probe, route, answer, nvext=nvext)
    return send


def covered(reach_replies: Sequence[Reply], roles: Sequence[str]) -> set[tuple[WorkerRef, str]]:
    """(worker, probe name) pairs some reply's evidence shows answered."""
    return {(w, r.probe.name) for r in reach_replies for w in (r.answered_by(roles) or ())}


def reach_every_worker(health: Any, topology: str, probes: list[Probe], send: Send, pins: bool,
                       rounds: int) -> Reach:
    """Send ``probes`` to every worker ``health`` lists: pinned (``pins``) or in up to ``rounds`` unpinned rounds
    per worker of the largest role, until the evidence shows every worker answered every probe."""
    workers = workers_by_role(health, topology)
    listed = [WorkerRef(role, i) for role, ids in workers.items() for i in ids]
    if not listed:
        return Reach(workers, [], pins, probes, unavailable=f"the frontend's /health lists no worker instance: "
                                                            f"{str(health)[:200]}")
    routes = pinned_routes(workers) if pins else []
    if pins and routes:
        # One thread per route: each worker answers its probes one at a time, the workers side by side.
        with ThreadPoolExecutor(len(routes)) as pool:
            per_route = list(pool.map(lambda route: [send(route, p) for p in probes], routes))
        return Reach(workers, [r for replies in per_route for r in replies], True, probes)
    replies: list[Reply] = []
    want = {(w, p.name) for w in listed for p in probes}
    for _ in range(rounds * max(len(ids) for ids in workers.values())):
        replies += [send(Route(), p) for p in probes]
        if want <= covered(replies, list(workers)):
            break
    return Reach(workers, replies, False, probes)


def read_health(endpoint: Endpoint) -> tuple[Any, str | None]:
    """The frontend's ``/health`` body, or None and why it could not be read."""
    try:
        with make_httpx(endpoint) as http:
            r = http.get(endpoint.root_url + "/health")
        if r.status_code != 200:
            return None, f"GET {endpoint.root_url}/health answered HTTP {r.status_code}"
        return r.json(), None
    except (httpx.HTTPError, ValueError) as err:
        return None, f"GET {endpoint.root_url}/health failed: {type(err).__name__}: {err}"
