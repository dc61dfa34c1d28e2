"""The aiperf runner against the embedded simulator: a real aiperf 0.13.0 subprocess over real HTTP.

Checks what the exit code cannot tell (aiperf.md §5): the key never reaches argv or the artifacts, only profiling
records are read, and requests dropped after a too-short grace period are reported instead of passing silently.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from pytest_ml4_sim.deploy.simulator import SimServer

from pytest_ml4.perf.baseline import sequential_run
from pytest_ml4.perf.export import read_records
from pytest_ml4.perf.figures import figures_from_export
from pytest_ml4.perf.runner import AiperfSpec, failure_log, run_aiperf
from pytest_ml4.target.model import load_target

KEY = "sk-perf-test-" + os.urandom(6).hex()


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimServer]:
    target = load_target("rtxpro6000-tp8")
    env = {**os.environ, target.endpoint.api_key_env: KEY}
    log = tmp_path_factory.mktemp("sim") / "engine.log"
    with SimServer(target, log_file=log, env=env) as server:
        yield server


def _spec(sim: SimServer, **kw: object) -> AiperfSpec:
    base = {"model": "ml4", "url": sim.base_url, "concurrency": 2, "isl": 128, "osl": 32, "duration_s": None,
            "request_count": 6, "min_tokens": 32, "server_metrics_url": sim.url + "/metrics", "warmup_requests": 2}
    base.update(kw)
    return AiperfSpec(**base)  # type: ignore[arg-type]


def test_keyed_run_is_complete_and_the_key_stays_secret(sim: SimServer, tmp_path: Path) -> None:
    run = run_aiperf(_spec(sim), tmp_path / "run", api_key=KEY)
    assert run.ok, run.describe() + "\n" + failure_log(run, [KEY])
    ex = run.require()
    assert ex.request_count == 6 and ex.request_error_rate_pct == 0.0
    assert ex.input_config["endpoint"]["api_key"] == "<redacted>"
    assert ex.warmup_metrics, "warmup phase missing"
    assert len(read_records(run.out_dir)) == 6                   # profiling only
    assert len(read_records(run.out_dir, phase="warmup")) == 2
    assert KEY not in " ".join(run.argv)
    leaks = [p for p in run.out_dir.rglob("*") if p.is_file() and KEY.encode() in p.read_bytes()]
    assert not leaks, f"API key written to {leaks}"
    assert "--server-metrics" in run.argv and (run.out_dir / "server_metrics_export.json").is_file()


def test_wrong_key_fails_from_the_json_not_the_exit_code(sim: SimServer, tmp_path: Path) -> None:
    run = run_aiperf(_spec(sim, request_count=2, warmup_requests=0), tmp_path / "run", api_key="sk-wrong")
    assert not run.ok
    assert run.export is None and "no profile_export_aiperf.json" in run.problems[0]
    assert "sk-wrong" not in failure_log(run, ["sk-wrong"])


def test_requests_dropped_after_the_grace_period_are_reported(sim: SimServer, tmp_path: Path) -> None:
    # ~2.5 s requests, a 4 s window and no grace: the second wave is still running when aiperf stops waiting.
    run = run_aiperf(_spec(sim, osl=200, min_tokens=200, request_count=None, duration_s=4, grace_s=0,
                           warmup_requests=0), tmp_path / "run", api_key=KEY)
    assert run.profiling_cancelled and run.profiling_cancelled > 0, run.describe()
    assert any("dropped silently" in p for p in run.problems), run.problems


def test_c1_window_arithmetic_matches_aiperf(sim: SimServer, tmp_path: Path) -> None:
    # The baseline reconciles a c1 row from its own TTFT and ITL (perf/baseline.py sequential_run); this is that
    # arithmetic against aiperf itself. ~2.6 s requests (ISL 128), a 6 s window and 1 s grace: the third request
    # starts at ~5.3 s and is dropped at 7 s (margins of 11-14 % on the request time either way).
    run = run_aiperf(_spec(sim, concurrency=1, osl=200, min_tokens=200, request_count=None, duration_s=6.0,
                           grace_s=1.0, warmup_requests=0), tmp_path / "run", api_key=KEY)
    ex = run.export
    assert ex is not None, run.describe()
    fig = figures_from_export(ex, 1)
    assert fig.ttft_p50_s and fig.itl_p50_ms and fig.out_tok_s and fig.decode_conc_avg, run.describe()
    want = sequential_run(fig.ttft_p50_s, fig.itl_p50_ms, 200, 6.0, 1.0)
    assert ex.request_count == want.requests, (want.describe(), run.describe())
    assert fig.out_tok_s == pytest.approx(want.out_tok_s, rel=0.05), want.describe()
    assert fig.decode_conc_avg == pytest.approx(want.decode_conc_avg, rel=0.05), want.describe()
