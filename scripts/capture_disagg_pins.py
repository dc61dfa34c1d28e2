"""Re-record fixtures/transcripts/dynamo-1.6.1/ml4-91_disagg_pin_headers.txt (its header says what it shows).

    .venv/bin/python scripts/capture_disagg_pins.py > /tmp/pins.txt   # body only; the file adds a header

The real Dynamo 1.6.1 frontend in front of the embedded gb300-disagg workers (2 prefill + 2 decode): which worker
pins it accepts in disaggregated serving, and the affinity probe of pytest_ml4.control.dynamo with session
affinity on and off. About 1 minute; two deployments, each stopped at the end.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Callable
from typing import Any

import httpx
from pytest_ml4_sim.deploy.dynamo import DynamoSim

from pytest_ml4.checks.dynamo import assert_session_affinity
from pytest_ml4.client.endpoint import Endpoint
from pytest_ml4.control.dynamo import run_affinity_probe
from pytest_ml4.control.scenario import load_requests
from pytest_ml4.target.model import load_target

REFUSAL = "does not identify a known worker"


def deploy(affinity: bool) -> DynamoSim:
    target = load_target("gb300-disagg", overrides={"serving": {"session_affinity": affinity}})
    return DynamoSim(target).start()


def pin_matrix(sim: DynamoSim, say: Callable[[str], None]) -> None:
    pre = [w.instance_id for w in sim.workers_of("prefill")]
    dec = [w.instance_id for w in sim.workers_of("decode")]
    say(f"# workers: prefill {pre}, decode {dec}")
    cases: list[tuple[str, dict[str, str], dict[str, Any]]] = [
        ("no pin", {}, {}),
        ("x-dynamo-worker-instance-id = decode 1", {"x-dynamo-worker-instance-id": str(dec[1])}, {}),
        ("x-dynamo-worker-instance-id = prefill 1", {"x-dynamo-worker-instance-id": str(pre[1])}, {}),
        ("x-dynamo-prefill-instance-id = prefill 1", {"x-dynamo-prefill-instance-id": str(pre[1])}, {}),
        ("x-dynamo-prefill-instance-id = prefill 0", {"x-dynamo-prefill-instance-id": str(pre[0])}, {}),
        ("both headers: prefill 1, decode 0", {"x-dynamo-prefill-instance-id": str(pre[1]),
                                               "x-dynamo-worker-instance-id": str(dec[0])}, {}),
        ("nvext.decode_worker_id = decode 1", {}, {"decode_worker_id": dec[1]}),
        ("nvext.backend_instance_id = decode 1", {}, {"backend_instance_id": dec[1]}),
    ]
    for label, headers, extra in cases:
        nvext = {"extra_fields": ["worker_id"], **extra}
        body = {"model": sim.target.serving.served_model_name, "max_tokens": 8, "nvext": nvext,
                "messages": [{"role": "user", "content": f"{uuid.uuid4().hex} What is 17 + 25?"}]}
        r = httpx.post(sim.url + "/v1/chat/completions", json=body, headers=headers, timeout=60)
        answer = json.dumps(r.json().get("nvext", {}).get("worker_id")) if r.status_code == 200 else r.text
        say(f"=== {label}\nheaders {json.dumps(headers)} nvext {json.dumps(nvext)}\nHTTP {r.status_code} {answer}")
    say("=== frontend log, the 400s")
    for line in sim.frontend_log.read_text().splitlines():
        if REFUSAL in line:
            say(re.sub(r"^\S+\s+", "", re.sub(r" method=POST.*", "", line.strip())))


def affinity_probe(sim: DynamoSim, title: str, say: Callable[[str], None]) -> None:
    endpoint = Endpoint(sim.base_url, model=sim.target.serving.served_model_name, simulated=True)
    probe = run_affinity_probe(endpoint, load_requests().affinity, topology="disagg")
    say(f"=== {title}")
    for turn in probe.turns:
        say(turn.line())
    try:
        say(f"assert_session_affinity: ok, session kept prefill worker {assert_session_affinity(probe)}")
    except AssertionError as err:
        say(f"assert_session_affinity: FAILED {type(err).__name__}: {str(err).splitlines()[0]}")


def main() -> int:
    sim = deploy(affinity=True)
    try:
        pin_matrix(sim, print)
        affinity_probe(sim, "affinity probe, session affinity on (pytest_ml4.control.dynamo, topology disagg)", print)
    finally:
        sim.stop()
    sim = deploy(affinity=False)
    try:
        affinity_probe(sim, "affinity probe, frontend without --router-session-affinity-ttl-secs", print)
    finally:
        sim.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
