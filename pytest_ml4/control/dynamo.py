"""Client-side checks of a Dynamo deployment around restarts (core, no pytest; dynamo.md §3, §5).

* session affinity: turns of one ``x-dynamo-session-id`` stay on one worker even when KV routing alone would send
  a turn elsewhere. KV routing co-locates continuation turns that share a prefix by itself, so the check sends
  turns with distinct long prefixes and first caches the second turn's prefix on *another* worker (pinned with
  the phase's pin header); a session-less control request proves the router would follow that cache; only
  affinity then keeps the session's turn on its worker (reference/real-dynamo.md "KV routing"). Which phase the
  KV router places by prefix depends on the topology (:data:`ROUTED_PHASES`): the worker itself when aggregated,
  the prefill worker when disaggregated (the decode phase is placed by load; each phase has its own session
  binding, dynamo.md §5, so the decode worker must stay too);
* prefix reuse: the router's own figures (``usage.prompt_tokens_details.cached_tokens`` and
  ``nvext.timing.kv_hit_rate``, real-dynamo-1.6.1-transcripts/mocker/70_kv_routing.txt): a fresh prefix has
  nothing cached, its continuation has the previous turn's full KV blocks cached, and the hit rate agrees with
  cached blocks over prompt blocks;
* disaggregated handoff: a request is prefilled on one instance of the prefill component and decoded on another,
  both instances the frontend's ``/health`` lists;
* model visibility: with every prefill pod gone the model leaves ``/v1/models`` (its worker set is incomplete)
  and comes back once the replacements serve.

Workers are seen through ``nvext.worker_id`` (requested with ``"nvext": {"extra_fields": ["worker_id",
"timing"]}``).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from pytest_ml4.client.endpoint import Endpoint, make_httpx, quote_body
from pytest_ml4.control.base import Progress, models_listed
from pytest_ml4.control.k8s_restart import KubernetesController

if TYPE_CHECKING:
    from pytest_ml4.control.scenario import AffinitySpec, ConversationSpec

SESSION_HEADER = "x-dynamo-session-id"
#: Pins a request to one decode/aggregated worker (dynamo.md §5 header overrides; a bogus id answers 400).
PIN_HEADER = "x-dynamo-worker-instance-id"
#: Pins the prefill phase of a disaggregated request to one prefill worker (dynamo.md §5 header overrides).
PREFILL_PIN_HEADER = "x-dynamo-prefill-instance-id"
#: How often model visibility is polled while pods are replaced (the simulator restarts a worker in ~1-2 s).
VISIBILITY_POLL_S = 0.05
@dataclass(frozen=True)
class RoutedPhase:
    """The phase of a request the KV router places by cached prefix: whose worker id the affinity probe follows
    (``nvext.worker_id`` field), the ``/health`` instances it picks from and the header that pins it."""

    name: str
    id_field: str
    pin_header: str
    prefill_instances: bool
    #: Other ``nvext.worker_id`` fields a session must keep (each phase has its own binding, dynamo.md §5).
    also_bound: tuple[str, ...] = ()


#: Topology kind -> the phase the KV router places by prefix. Disaggregated: the prefill workers hold the prefix
#: cache the router scores. PIN_HEADER alone is refused there: real 1.6.1 turns it into nvext.backend_instance_id,
#: which the prefill phase resolves among prefill workers ("Remote prefill failed ... does not identify a known
#: worker" for a decode id) and the decode phase among decode workers, so every id answers HTTP 400 "Invalid
#: request" (fixtures/transcripts/dynamo-1.6.1/ml4-91_disagg_pin_headers.txt).
ROUTED_PHASES: dict[str, RoutedPhase] = {
    "disagg": RoutedPhase("prefill", "prefill_worker_id", PREFILL_PIN_HEADER, True, also_bound=("decode_worker_id",)),
}
AGGREGATED_PHASE = RoutedPhase("decode", "decode_worker_id", PIN_HEADER, False)


def routed_phase(topology: str) -> RoutedPhase:
    return ROUTED_PHASES.get(topology, AGGREGATED_PHASE)


@dataclass
class Turn:
    status: int
    content: str
    worker_id: dict[str, Any] | None
    prompt_tokens: int
    cached_tokens: int | None
    error: str | None = None
    kv_hit_rate: float | None = None
    label: str = ""

    def worker(self, field: str) -> Any:
        """One field of ``nvext.worker_id`` (``decode_worker_id``, ``prefill_worker_id``)."""
        return (self.worker_id or {}).get(field)

    @property
    def decode_worker(self) -> Any:
        return self.worker("decode_worker_id")

    @property
    def prefill_worker(self) -> Any:
        return self.worker("prefill_worker_id")

    def line(self) -> str:
        head = f"{self.label}: " if self.label else ""
        if self.error:
            return f"{head}HTTP {self.status}: {self.error}"
        return (f"{head}HTTP {self.status}, worker_id={self.worker_id}, prompt_tokens={self.prompt_tokens}, "
                f"cached_tokens={self.cached_tokens}, kv_hit_rate={self.kv_hit_rate}, "
                f"content={self.content[:60]!r}")


def chat_turn(http: httpx.Client, model: str, messages: list[dict[str, Any]], session: str | None,
              max_tokens: int, pin: Any = None, label: str = "", pin_header: str = PIN_HEADER) -> Turn:
    body = {"model": model, "messages": messages, "max_tokens": max_tokens,
            "nvext": {"extra_fields": ["worker_id", "timing"]}}
    headers = {SESSION_HEADER: session} if session else {}
    if pin is not None:
        headers[pin_header] = str(pin)
    r = http.post("chat/completions", json=body, headers=headers)
    if r.status_code != 200:
        return Turn(r.status_code, "", None, 0, None, quote_body(r.text), label=label)
    data = r.json()
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    nvext = data.get("nvext") or {}
    hit = (nvext.get("timing") or {}).get("kv_hit_rate")
    return Turn(r.status_code, data["choices"][0]["message"].get("content") or "", nvext.get("worker_id"),
                int(usage.get("prompt_tokens") or 0), details.get("cached_tokens"),
                kv_hit_rate=None if hit is None else float(hit), label=label)


def fresh_session() -> str:
    return f"ml4-{uuid.uuid4().hex[:12]}"


def run_conversation(endpoint: Endpoint, spec: ConversationSpec, session: str | None = None,
                     http: httpx.Client | None = None) -> list[Turn]:
    """The conversation of ``spec`` (a system prompt and user turns), each answer fed back, one session id.

    The system prompt starts with a fresh nonce so that its first turn meets a cold cache (block hashes chain from
    the first block: nothing of an earlier run's prompt can match)."""
    session = session or fresh_session()
    system = f"[conversation {uuid.uuid4().hex[:12]}] {spec.system}"
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}]
    turns: list[Turn] = []
    with _client(endpoint, http) as client:
        for i, t in enumerate(spec.turns):
            messages.append({"role": "user", "content": t.prompt})
            turn = chat_turn(client, endpoint.model, messages, session, spec.max_tokens, label=f"turn {i + 1}")
            turns.append(turn)
            if turn.error:
                break
            messages.append({"role": "assistant", "content": turn.content})
    return turns


class _Borrowed:
    """A caller's client used as a context manager without closing it."""

    def __init__(self, http: httpx.Client) -> None:
        self.http = http

    def __enter__(self) -> httpx.Client:
        return self.http

    def __exit__(self, *exc: object) -> None:
        return None


def _client(endpoint: Endpoint, http: httpx.Client | None) -> Any:
    return _Borrowed(http) if http is not None else make_httpx(endpoint)


def _generate_instances(health: Any) -> list[dict[str, Any]]:
    """The instances a frontend ``/health`` body lists on their ``generate`` endpoint: one per worker (real Dynamo
    lists each worker once per endpoint it serves, e.g. also ``worker_kv_query_source_*``)."""
    instances = health.get("instances") if isinstance(health, dict) else None
    return [i for i in instances or [] if isinstance(i, dict) and i.get("endpoint", "generate") == "generate"]


def worker_instance_ids(health: Any) -> set[Any]:
    """Every worker instance of a ``/health`` body (all roles)."""
    return {i.get("instance_id") for i in _generate_instances(health)}


def role_instance_ids(health: Any) -> dict[str, set[Any]]:
    """The worker instances of a ``/health`` body by disaggregation role: ``prefill`` (the prefill component) and
    ``decode`` (every other generate instance: the decode workers of a disaggregated deployment)."""
    roles: dict[str, set[Any]] = {"prefill": set(), "decode": set()}
    for i in _generate_instances(health):
        roles["prefill" if "prefill" in str(i.get("component", "")) else "decode"].add(i.get("instance_id"))
    return roles


def phase_instance_ids(health: Any, phase: RoutedPhase) -> list[Any]:
    """The workers of a ``/health`` body that serve ``phase`` (prefill component or not), in a stable order."""
    return sorted({i.get("instance_id") for i in _generate_instances(health)
                   if ("prefill" in str(i.get("component", ""))) == phase.prefill_instances}, key=str)


@dataclass
class AffinityRun:
    turns: list[Turn]
    session_worker: Any = None
    other_worker: Any = None
    not_applicable: str | None = None
    phase: RoutedPhase = AGGREGATED_PHASE


def run_affinity_probe(endpoint: Endpoint, spec: AffinitySpec, http: httpx.Client | None = None,
                       topology: str = "agg") -> AffinityRun:
    """Turns of one session whose second prefix is cached on another worker of the KV-routed phase of
    ``topology`` (see the module docstring).

    ``spec``: ``prefix`` (a long text) and ``repeat`` (so the prefix spans many KV blocks), ``question``,
    ``control_question``, ``max_tokens``. Returns the turns in order:
    session turn 1, the pinned priming request, the session-less control, session turn 2."""
    nonce = uuid.uuid4().hex[:12]
    prefix = " ".join([spec.prefix.strip()] * spec.repeat)

    def messages(part: int, question: str) -> list[dict[str, Any]]:
        # Distinct first tokens: every KV block hash of one prefix differs from the other's.
        return [{"role": "system", "content": f"[affinity {nonce} part {part}] {prefix}"},
                {"role": "user", "content": question}]

    n = spec.max_tokens
    session = fresh_session()
    phase = routed_phase(topology)
    with _client(endpoint, http) as client:
        health = client.get(endpoint.root_url + "/health")
        workers = phase_instance_ids(health.json(), phase) if health.status_code == 200 else []
        if len(workers) < 2:
            return AffinityRun([], not_applicable=f"/health lists {len(workers)} {phase.name} worker(s) {workers}: "
                                                  f"session affinity needs two to be observable", phase=phase)
        first = chat_turn(client, endpoint.model, messages(1, spec.question), session, n, label="session turn 1")
        if first.error or first.worker(phase.id_field) is None:
            return AffinityRun([first], phase=phase)
        other = next(w for w in workers if w != first.worker(phase.id_field))
        prime = chat_turn(client, endpoint.model, messages(2, spec.question), None, n, pin=other,
                          label=f"priming part 2 on {phase.name} worker {other} ({phase.pin_header})",
                          pin_header=phase.pin_header)
        control = chat_turn(client, endpoint.model, messages(2, spec.control_question), None, n,
                            label="control: part 2 without a session")
        second = chat_turn(client, endpoint.model, messages(2, spec.question), session, n,
                           label="session turn 2 (part 2)")
    return AffinityRun([first, prime, control, second], first.worker(phase.id_field), other, phase=phase)


def frontend_instances(root_url: str) -> list[dict[str, Any]]:
    """The worker instances the frontend's ``/health`` lists (empty when it is not healthy)."""
    try:
        r = httpx.get(root_url.rstrip("/") + "/health", timeout=5.0)
        return list(r.json().get("instances") or []) if r.status_code == 200 else []
    except (httpx.HTTPError, ValueError):
        return []


@dataclass
class Visibility:
    deleted: list[str]
    left_after_s: float | None
    returned_after_s: float | None
    seen: list[str]


def watch_model_visibility(ctl: KubernetesController, endpoint: Endpoint, role: str = "prefill",
                           timeout_s: float | None = None, progress: Progress | None = None) -> Visibility:
    """Delete every pod of ``role``; record when the model leaves ``/v1/models`` and when it comes back."""
    limit = ctl.timeout_s if timeout_s is None else timeout_s
    t0 = time.monotonic()
    deleted = ctl.delete_pods(role)
    left = returned = None
    seen: list[str] = []
    deadline = t0 + limit
    while time.monotonic() < deadline:
        ids = models_listed(endpoint.base_url, endpoint.api_key)
        state = "no answer" if ids is None else ("listed" if endpoint.model in ids else "absent")
        if not seen or seen[-1] != state:
            seen.append(state)
        if left is None and state != "listed":
            left = time.monotonic() - t0
        if left is not None and state == "listed":
            returned = time.monotonic() - t0
            break
        time.sleep(VISIBILITY_POLL_S)
    if returned is not None:
        ctl.wait_ready(max(1.0, deadline - time.monotonic()), progress)
    return Visibility(deleted, left, returned, seen)
