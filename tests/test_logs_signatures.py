"""The signature catalogue and the typed events, on the recorded excerpts in fixtures/logs/."""

from __future__ import annotations

from collections import Counter

import pytest
import yaml
from checkout import FIXTURES_DIR

from pytest_ml4.logs import (
    AvailableKvMemory,
    CudaOom,
    EngineFailure,
    FileLogReader,
    GrammarKill,
    HealthCanaryFailure,
    KvCacheSize,
    KvTransferFailure,
    LogView,
    NoKvMemory,
    ServerStart,
    SpecDecodeMetrics,
    StartupRefused,
    StatsLine,
    SymmMemUnsupported,
    load_catalogue,
    parse_events,
    records_from_text,
)
from pytest_ml4.logs.signatures import CatalogueError, parse_catalogue

LOGS = FIXTURES_DIR / "logs"
EXPECTED: dict[str, dict[str, int]] = yaml.safe_load((LOGS / "expected.yaml").read_text())
PROVENANCE: dict[str, list[str]] = yaml.safe_load((LOGS / "provenance.yaml").read_text())
SEED_OOM = ("MemoryError: CUDA out of memory. Tried to allocate 792.00 MiB. GPU 0 has a total capacity of 95.06 GiB "
            "of which 751.25 MiB is free.")


def view(name: str, last_boot: bool = False) -> LogView:
    reader = FileLogReader(LOGS / name)
    return LogView(reader.since_last_boot() if last_boot else reader.read(), name)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_each_excerpt_matches_exactly_the_expected_signatures(name: str) -> None:
    records = FileLogReader(LOGS / name).read()
    counts = Counter(m.signature.name for m in load_catalogue().matches(records))
    assert dict(counts) == EXPECTED[name]


def test_every_signature_is_exercised_by_an_excerpt() -> None:
    covered = {sig for counts in EXPECTED.values() for sig in counts}
    assert {s.name for s in load_catalogue().signatures} <= covered


def test_every_excerpt_says_whether_its_lines_were_recorded() -> None:
    recorded, reconstructed = set(PROVENANCE["recorded"]), set(PROVENANCE["reconstructed"])
    assert not recorded & reconstructed
    assert recorded | reconstructed == set(EXPECTED)


def test_a_signature_no_recorded_line_matches_says_why() -> None:
    """A regex proven only on lines written from prose or format strings proves what we wrote (finding 10): such a
    signature carries ``unrecorded``, and one a recorded line matches must not (the note would be stale)."""
    matched = {sig for name in PROVENANCE["recorded"] for sig in EXPECTED[name]}
    for s in load_catalogue().signatures:
        problem = ("a recorded line matches it: drop its unrecorded note" if s.unrecorded else
                   "no recorded excerpt matches it, and it has no unrecorded reason")
        assert (s.name in matched) != bool(s.unrecorded), f"{s.name}: {problem}"


def test_real_vllm_0_32_banner_starts_a_boot() -> None:
    """Real vLLM 0.32 prints an ASCII banner, not 0.33's "vLLM API server version" line: its version row marks the
    boot (recorded: reference/real-vllm-0.32-cpu-transcripts/startup_final_eager_scripted.log line 7)."""
    start = view("real-transcript-lines.log").first(ServerStart)
    assert start is not None and start.version == "0.32.0"


def test_every_signature_names_its_meaning_and_source() -> None:
    for s in load_catalogue().signatures:
        assert len(s.meaning) > 20, s.name
        assert s.source.startswith(("seed 000", "vllm.md", "dynamo.md", "vLLM 0.33", "reference/real-")), s.name
        assert s.hints, s.name


def test_fused_moe_oom_is_typed_and_supersedes_the_generic_oom() -> None:
    v = view("rtxpro-oom-crashloop.log")
    ooms = v.all(CudaOom)
    assert len(ooms) == 3 and all(o.fused_moe and o.signature == "fused_moe_workspace_oom" for o in ooms)
    first = ooms[0]
    assert first.line == SEED_OOM
    assert first.requested_bytes == 792 << 20
    assert first.free_bytes == int(751.25 * (1 << 20))
    assert first.total_bytes == round(95.06 * (1 << 30))
    assert first.gpu == 0 and first.severity == "critical"


def test_generic_torch_oom_without_fused_moe_frame() -> None:
    v = view("cuda-oom-generic.log")
    (oom,) = v.all(CudaOom)
    assert not oom.fused_moe and oom.gpu == 1 and oom.requested_bytes == round(1.25 * (1 << 30))
    (dead,) = v.all(EngineFailure)
    assert dead.phase == "dead" and "engine core exited unexpectedly" in dead.line


def test_fused_moe_needs_its_frame_nearby() -> None:
    far = [SEED_OOM] + ["filler"] * 60 + ['  File "<unknown>", line 0, in FusedMoeRunner::getWorkspaceInfo(...)']
    ooms = parse_events(records_from_text(far))
    assert [o.signature for o in ooms if isinstance(o, CudaOom)] == ["cuda_oom"]


def test_startup_refusal_fields() -> None:
    v = view("rtxpro-startup-refused.log")
    (r,) = v.all(StartupRefused)
    assert (r.device, r.free_gib, r.total_gib, r.util, r.requested_gib) == ("cuda:0", 93.94, 95.06, 0.99, 94.11)
    inits = v.all(EngineFailure)
    assert {e.phase for e in inits} == {"init"}
    assert inits[-1].procs == "{'EngineCore_DP0': 1}"


def test_old_refusal_format_without_device() -> None:
    (r,) = parse_events(records_from_text(
        "ValueError: Free memory on device (93.94/95.06 GiB) on startup is less than desired GPU memory "
        "utilization (0.99, 94.11 GiB). Decrease GPU memory utilization or reduce GPU memory used by other processes."))
    assert isinstance(r, StartupRefused) and r.device is None and r.util == 0.99


def test_no_kv_memory_both_forms() -> None:
    v = view("no-kv-memory.log")
    blocks, short = v.all(NoKvMemory)
    assert blocks.signature == "no_cache_blocks"
    assert (short.max_model_len, short.needed_gib, short.available_gib, short.estimated_max_len) == (
        1048576, 46.94, 11.72, 264128)
    assert [a.gib for a in v.all(AvailableKvMemory)] == [-4.44, 11.72]


def test_kv_cache_size_one_line_form() -> None:
    v = view("rtxpro-oom-crashloop.log")
    sizes = v.all(KvCacheSize)
    assert [(s.tokens, s.max_model_len, s.max_concurrency) for s in sizes] == [
        (272_636, 204_800, 1.33), (272_636, 204_800, 1.33), (274_934, 262_144, 1.05)]
    assert [a.gib for a in v.all(AvailableKvMemory)] == [12.21] * 3


def test_kv_cache_size_two_line_form_is_merged() -> None:
    v = view("vllm-0.26-two-line-kv.log")
    (size,) = v.all(KvCacheSize)
    assert (size.tokens, size.max_model_len, size.max_concurrency) == (1_006_464, 131_072, 7.68)
    assert "\n" in size.line  # both judged lines are quoted
    assert v.first(AvailableKvMemory).gib == 61.43


def test_stats_lines() -> None:
    stats = view("rtxpro-stable.log").all(StatsLine)
    assert max(s.kv_usage_pct for s in stats) == 15.1  # seed 000: "KV usage never exceeded 15.1%"
    peak = max(stats, key=lambda s: s.kv_usage_pct)
    assert (peak.engine, peak.running, peak.waiting, peak.generation_tps) == (0, 16, 48, 384.8)
    assert peak.prefix_hit_pct == 0.0


def test_stats_line_with_optional_parts_and_aggregate_prefix() -> None:
    line = ("(APIServer pid=1) INFO 11-30 06:27:09 [loggers.py:335] 2 Engines Aggregated: Avg prompt throughput: "
            "1.0 tokens/s, Avg generation throughput: 2.0 tokens/s, Running: 3 reqs, Waiting: 4 reqs, Deferred: 1 "
            "reqs, Preemptions: 2, GPU KV cache usage: 55.5%")
    (s,) = parse_events(records_from_text(line))
    assert isinstance(s, StatsLine) and (s.engine, s.running, s.waiting, s.kv_usage_pct) == (None, 3, 4, 55.5)
    assert s.prefix_hit_pct is None


def test_spec_decode_metrics() -> None:
    spec = view("rtxpro-stable.log").all(SpecDecodeMetrics)
    lengths = [s.mean_acceptance_length for s in spec]
    assert min(lengths) == 2.24 and max(lengths) == 4.00  # seed 000's range
    # 1 + 3 x 0.61 = 2.83 > 2.24: the seed's two ranges cannot both hold on one line, so the excerpt spans the
    # mean-length range and its per-position rates follow vLLM's mean = 1 + sum(rates).
    assert [s.per_position[0] for s in spec] == [0.61, 0.92, 0.97, 1.0, 0.8]
    first = spec[0]
    assert (first.accepted, first.drafted, first.per_position) == (124, 300, (0.61, 0.38, 0.25))
    assert first.mean_acceptance_length == pytest.approx(1 + first.accepted / (first.drafted / 3))


def test_reference_transcript_lines() -> None:
    # vllm.md §9.1: lines executed with vLLM 0.33's own classes.
    text = (
        "(EngineCore pid=23478) INFO 11-30 06:27:09 [loggers.py:335] Engine 000: Avg prompt throughput: 998.2 "
        "tokens/s, Avg generation throughput: 249.6 tokens/s, Running: 4 reqs, Waiting: 2 reqs, GPU KV cache usage: "
        "12.3%, Prefix cache hit rate: 42.0%\n"
        "(EngineCore pid=23478) INFO 11-30 06:27:09 [metrics.py:120] SpecDecoding metrics: Mean acceptance length: "
        "2.80, Accepted throughput: 8.98 tokens/s, Drafted throughput: 14.97 tokens/s, Accepted: 9 tokens, Drafted: "
        "15 tokens, Per-position acceptance rate: 0.800, 0.600, 0.400, Avg Draft acceptance rate: 60.0%\n"
        "(EngineCore pid=23478) INFO 11-30 06:27:09 [<stdin>:7] GPU KV cache size: 1,234,567 tokens, Maximum "
        "concurrency for 131,072 tokens per request: 9.42x")
    stats, spec, size = parse_events(records_from_text(text))
    assert isinstance(stats, StatsLine) and stats.kv_usage_pct == 12.3 and stats.prefix_hit_pct == 42.0
    assert isinstance(spec, SpecDecodeMetrics) and spec.per_position == (0.8, 0.6, 0.4)
    assert spec.draft_acceptance_pct == 60.0
    assert isinstance(size, KvCacheSize) and (size.tokens, size.max_concurrency) == (1_234_567, 9.42)


def test_grammar_kill() -> None:
    kills = view("grammar-kill.log").all(GrammarKill)
    assert [(k.kind, k.tokens) for k in kills] == [("Grammar rejected", (2, 34)), ("ParserTooComplex", ())]
    assert all(k.severity == "error" for k in kills)


def test_symmetric_memory_line_on_every_worker() -> None:
    sym = view("rtxpro-stable.log").all(SymmMemUnsupported)
    assert len(sym) == 8 and {s.capability for s in sym} == {"12.0"}


def test_nixl_failures() -> None:
    v = view("dynamo-nixl.log")
    fails = v.all(KvTransferFailure)
    assert [f.request_id for f in fails if f.signature == "nixl_expired_kv_blocks"] == [
        "cmpl-5d0e2c4b-0", "cmpl-77aa01f3-0"]
    assert [f.code for f in fails if f.code] == ["NIXL_ERR_BACKEND"]
    assert not any("KV Transfer metrics" in f.line for f in fails)  # the success line is no failure
    assert fails[0].time is not None  # ISO stamps are read


def test_health_canary_failures() -> None:
    v = view("dynamo-health-canary.log")
    got = [(h.kind, h.endpoint) for h in v.all(HealthCanaryFailure)]
    assert got == [("timeout", "dynamo/backend/generate"), ("no response", "dynamo/backend/generate"),
                   ("Health check request failed", "dynamo/backend/generate"),
                   ("Failed to send health check", "dynamo/backend/generate"),
                   ("Health check error response", "dynamo/prefill/generate")]


def test_server_start_and_failures_view() -> None:
    v = view("rtxpro-oom-crashloop.log", last_boot=True)
    starts = v.all(ServerStart)
    assert starts[0].signature == "server_start" and starts[0].version == "0.1.dev23641+gbd4fa2633"
    assert starts[0].model == "/models/mistral-large-4-nvfp4"
    assert [f.signature for f in v.failures()] == ["fused_moe_workspace_oom", "engine_dead", "engine_dead",
                                                   "engine_dead"]
    excerpt = v.excerpt(v.failures()[:1], context=2)
    assert SEED_OOM in excerpt and "FusedMoeRunner" not in excerpt.splitlines()[0]


@pytest.mark.parametrize("bad, needle", [
    ([{"name": "x", "event": "CudaOom", "severity": "fatal", "regex": "a", "meaning": "m", "source": "s"}], "severity"),
    ([{"name": "x", "event": "CudaOom", "severity": "info", "regex": "(", "meaning": "m", "source": "s"}], "bad regex"),
    ([{"name": "x", "event": "CudaOom", "severity": "info", "regex": "a", "meaning": "m"}], "source"),
    ({"name": "x"}, "list"),
])
def test_malformed_catalogue_is_rejected_with_the_field(bad: object, needle: str) -> None:
    with pytest.raises(CatalogueError, match=needle):
        parse_catalogue(bad, "test")


def test_catalogue_file_is_package_data() -> None:
    from pytest_ml4.locations import DATA_DIR
    from pytest_ml4.logs.signatures import CATALOGUE_FILE

    assert CATALOGUE_FILE.is_file() and CATALOGUE_FILE.is_relative_to(DATA_DIR), CATALOGUE_FILE
