"""SLO fields of the targets, the goodput gate, the capacity statistics and search, and the aiperf flags they use
without a deployment: cheap unit tests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_ml4.perf import capacity as cap
from pytest_ml4.perf.export import ProfileExport, RequestRecord
from pytest_ml4.perf.goodput import (
    Goodput,
    count_good,
    goodput_gate,
    goodput_of,
    workload_spec,
)
from pytest_ml4.perf.runner import build_argv
from pytest_ml4.perf.workloads import (
    engine_counters,
    keeps_sessions_together,
    prefix_reuse_floor,
    prompt_engine_urls,
)
from pytest_ml4.target.model import (
    BUNDLED,
    TargetError,
    Workload,
    known_targets,
    load_target,
)

SLO = {"ttft_p99_s": 3.0, "itl_p99_ms": 30, "e2e_p99_s": 8.0, "source": "estimate: test"}


def chat(**over: object) -> dict[str, object]:
    return {"isl": 100, "osl": 50, "request_rate": 2.0, "capacity_rps": 3.0, "slo": dict(SLO), "source": "estimate",
            **over}


@pytest.mark.parametrize("name", known_targets())
def test_every_target_states_slos_for_both_workloads(name: str) -> None:
    t = load_target(name)
    assert set(t.perf.workloads) == {"chat", "sessions"}, name
    for w in t.perf.workloads.values():
        assert w.slo.source.startswith(("seed ", "estimate")) and w.capacity_rps >= w.request_rate


@pytest.mark.parametrize("over, message", [
    ({"slo": {**SLO, "source": "made up"}}, "source must cite a seed"),
    ({"capacity_rps": 1.0}, "capacity_rps 1 is below request_rate 2"),
    ({"slo": {**SLO, "itl_p99_ms": 0}}, "greater than 0"),
    ({"slo": {**SLO, "ttft_p99": 3}}, "Extra inputs are not permitted"),
])
def test_workload_validation_names_the_field(over: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Workload.model_validate(chat(**over), context={BUNDLED: True})  # as in a bundled target


def test_target_loader_rejects_bad_slo_with_file_and_field(tmp_path: Path) -> None:
    src = Path(load_target("gb300-agg").path).read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace("itl_p99_ms: 30", "itl_p99_ms: -1", 1))
    with pytest.raises(TargetError) as err:
        load_target(str(bad))
    assert "bad.yaml" in str(err.value) and "itl_p99_ms" in str(err.value)


def test_sessions_workload_needs_turns_and_system_prompt(tmp_path: Path) -> None:
    src = Path(load_target("gb300-agg").path).read_text()
    bad = tmp_path / "bad.yaml"
    bad.write_text(src.replace("turns: 3", "turns: 1", 1))
    with pytest.raises(TargetError, match="workloads.sessions needs turns >= 2"):
        load_target(str(bad))


def test_open_loop_argv_has_poisson_rate_goodput_and_sessions(tmp_path: Path) -> None:
    t = load_target("gb300-disagg")
    spec = workload_spec(t, "sessions", model="m", url="http://h/v1", rate=3.0, requests=40)
    argv = build_argv(spec, tmp_path, executable=Path("aiperf"))
    joined = " ".join(argv)
    assert "--request-rate 3 --arrival-pattern poisson" in joined
    assert "--request-rate 1000" not in joined, "the closed-loop CPU workaround must not replace the Poisson rate"
    i = argv.index("--goodput")
    assert argv[i + 1] == "time_to_first_token:3000 inter_token_latency:30 request_latency:8000"
    assert "--conversation-turn-mean 3 --conversation-turn-stddev 0 --conversation-num 13" in joined
    assert "--shared-system-prompt-length 2048" in joined


def _export(good: float | None, ok: int, errors: int = 0) -> ProfileExport:
    data: dict[str, object] = {"request_count": {"unit": "requests", "avg": ok},
                               "time_to_first_token": {"unit": "ms", "p99": 1500.0}}
    if good is not None:
        data["good_request_count"] = {"unit": "requests", "avg": good}
    if errors:
        data["error_request_count"] = {"unit": "requests", "avg": errors}
    return ProfileExport.from_dict(data)


def test_goodput_counts_failed_requests_as_not_good() -> None:
    slo = load_target("gb300-agg").perf.workloads["chat"].slo
    g = goodput_of(_export(38, 38, errors=2), "chat", 4.0, slo, 0.95)
    assert (g.good, g.total) == (38, 40)
    assert goodput_gate(g, slo).passed, "38/40 = 95 % meets a 95 % floor"
    g = goodput_of(_export(37, 38, errors=2), "chat", 4.0, slo, 0.95)
    result = goodput_gate(g, slo)
    assert not result.passed and "goodput 37/40 = 92.5%" in result.detail and "TTFT p99 1.5" in result.detail


def test_goodput_without_figures_is_not_a_pass() -> None:
    slo = load_target("gb300-agg").perf.workloads["chat"].slo
    with pytest.raises(LookupError, match="without --goodput"):
        goodput_of(_export(None, 10), "chat", 4.0, slo, 0.95)


def _record(ttft_ms: float, itl_ms: float, e2e_ms: float, error: bool = False) -> RequestRecord:
    metrics = {"time_to_first_token": {"value": ttft_ms}, "inter_token_latency": {"value": itl_ms},
               "request_latency": {"value": e2e_ms}}
    return RequestRecord({"benchmark_phase": "profiling"}, metrics, {"code": 500} if error else None)


def test_count_good_needs_every_slo_met() -> None:
    slo = load_target("gb300-agg").perf.workloads["chat"].slo   # 3 s, 30 ms, 8 s
    records = [_record(1000, 10, 3000), _record(3001, 10, 3000), _record(1000, 31, 3000),
               _record(1000, 10, 8001), _record(3000, 30, 8000), _record(100, 1, 100, error=True)]
    assert count_good(records, slo) == 2


@pytest.mark.parametrize("good, total, verdict", [
    (60, 60, "meets"),          # lower one-sided 95 % bound 95.7 %
    (40, 40, "inconclusive"),   # 40/40 cannot show >= 95 % yet
    (57, 60, "inconclusive"),   # 95 % observed: noise either way
    (45, 60, "misses"),
    (0, 0, "inconclusive"),
])
def test_classify_is_a_significance_test(good: int, total: int, verdict: str) -> None:
    assert cap.classify(good, total, 0.95) == verdict


class FakeDeployment:
    """Goodput as a step function of the rate: every request good up to ``limit`` req/s, a third bad above it;
    ``noisy`` rates give a share right at the floor (inconclusive however often repeated)."""

    def __init__(self, limit: float, noisy: tuple[float, ...] = ()) -> None:
        self.limit, self.noisy, self.calls = limit, noisy, []

    def __call__(self, rate: float) -> Goodput:
        self.calls.append(rate)
        good = 57 if rate in self.noisy else (60 if rate <= self.limit else 40)
        return Goodput("chat", rate, good, 60, 0.95, {})


def test_search_bisects_between_meeting_and_missing_rates() -> None:
    dep = FakeDeployment(limit=7.0)
    found = cap.search(dep, 4.0, 0.95, repeats=2, probes=3)
    assert dep.calls == [4.0, 8.0, 6.0, 7.0]
    assert (found.highest_meeting, found.lowest_missing) == (7.0, 8.0)
    gate = cap.capacity_gate(found, "chat")
    assert gate is not None and gate.passed and "declared capacity 4 req/s meets" in gate.detail


def test_search_fails_when_the_declared_rate_misses_and_probes_nothing_more() -> None:
    dep = FakeDeployment(limit=3.0)
    found = cap.search(dep, 4.0, 0.95, repeats=2, probes=3)
    assert dep.calls == [4.0]
    gate = cap.capacity_gate(found, "chat")
    assert gate is not None and not gate.passed and "misses" in gate.detail


def test_noise_at_the_declared_rate_is_not_judged_after_its_repeats() -> None:
    dep = FakeDeployment(limit=10.0, noisy=(4.0,))
    found = cap.search(dep, 4.0, 0.95, repeats=3, probes=3)
    assert dep.calls == [4.0, 4.0, 4.0] and found.declared_point.verdict == "inconclusive"
    assert cap.capacity_gate(found, "chat") is None


def test_search_stops_at_a_noisy_probe_and_at_a_meeting_ceiling() -> None:
    dep = FakeDeployment(limit=10.0, noisy=(6.0,))
    found = cap.search(dep, 4.0, 0.95, repeats=1, probes=5)
    assert dep.calls == [4.0, 8.0] and found.highest_meeting == 8.0, "the 2x ceiling met: stop there"
    dep = FakeDeployment(limit=5.0, noisy=(6.0,))
    found = cap.search(dep, 4.0, 0.95, repeats=1, probes=5)
    assert dep.calls == [4.0, 8.0, 6.0] and found.highest_meeting == 4.0 and found.lowest_missing == 8.0
    json.dumps(found.as_dict())


# ------------------------------------------------------------------ sessions: prefix reuse across turns (item 3)
def _turn(conv: str, turn: int, isl: int, ok: bool = True) -> RequestRecord:
    return RequestRecord({"conversation_id": conv, "turn_index": turn},
                         {"input_sequence_length": {"value": isl}}, None if ok else {"code": 500})


def test_prefix_floor_counts_the_previous_turn_where_sessions_stay_together() -> None:
    w = load_target("gb300-agg").perf.workloads["sessions"]          # 2048-token system prompt
    # Two conversations, three turns; block 64: 2048 -> 31 blocks counted, 2424 -> 36, 2829 -> 43.
    records = [_turn(c, 0, 2424) for c in "ab"] + [_turn(c, 1, 2829) for c in "ab"] + [_turn(c, 2, 3225)
                                                                                       for c in "ab"]
    together = prefix_reuse_floor(w, records, 6, 2, 64, across_turns=True)
    assert (together.system, together.turns, together.follow_ups) == (0.0, 2 * (36 + 43) * 64.0, 4)
    apart = prefix_reuse_floor(w, records, 6, 2, 64, across_turns=False)
    assert (apart.system, apart.turns, apart.follow_ups) == (4 * 31 * 64.0, 0.0, 0)
    assert together.tokens > apart.tokens
    assert "previous turn's prompt" in together.describe(2048) and "previous" not in apart.describe(2048)


def test_prefix_floor_judges_a_follow_up_without_its_previous_turn_on_the_system_prompt() -> None:
    w = load_target("gb300-agg").perf.workloads["sessions"]
    records = [_turn("a", 0, 2424, ok=False), _turn("a", 1, 2829), _turn("b", 0, 2424)]
    floor = prefix_reuse_floor(w, records, 3, 1, 64, across_turns=True)
    # a/1 lost its previous turn: system prompt only, like b/0 and (once the first is taken out) nothing more.
    assert (floor.system, floor.turns, floor.follow_ups) == (31 * 64.0, 0.0, 0)
    assert prefix_reuse_floor(w, [], 6, 2, 64, across_turns=True).system == 4 * 31 * 64.0   # no export


def test_sessions_stay_together_on_one_engine_or_the_kv_router_only() -> None:
    assert keeps_sessions_together(load_target("gb300-agg"), 2)                  # dynamo_router kv
    assert not keeps_sessions_together(load_target("vr200-agg"), 2)              # round_robin
    assert keeps_sessions_together(load_target("vr200-agg"), 1)


def test_prefix_counters_come_from_the_prompt_computing_engines() -> None:
    assert prompt_engine_urls({"prefill": ("p1", "p2"), "decode": ("d1",)}) == ("p1", "p2")
    assert prompt_engine_urls({"worker": ("w2", "w1")}) == ("w2", "w1")
    assert prompt_engine_urls({}) == ()


def test_prefix_counters_absent_give_a_reason_not_a_figure() -> None:
    assert "no engine /metrics URL is known" in str(engine_counters(()))
    assert "http://127.0.0.1:9/metrics" in str(engine_counters(("http://127.0.0.1:9/metrics",)))
