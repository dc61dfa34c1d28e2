"""The logs plugin glue (pytest_ml4.plugin.logs): reader fixtures, --ml4-log-file, the verdict summary."""

from __future__ import annotations

import pytest
from checkout import FIXTURES_DIR

STABLE = FIXTURES_DIR / "logs" / "rtxpro-stable.log"


def test_log_file_option_feeds_the_reader_and_the_boot_view(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_uses_logs="""
        from pytest_ml4.logs import FileLogReader, KvCacheSize

        def test_reader(ml4_logs, ml4_boot_log):
            assert isinstance(ml4_logs, FileLogReader)
            assert ml4_boot_log.first(KvCacheSize).tokens == 263923
            assert not ml4_boot_log.failures()
    """)
    result = pytester.runpytest("--target", "rtxpro6000-tp8", f"--ml4-log-file={STABLE}", "-p", "no:randomly")
    result.assert_outcomes(passed=1)


def test_journald_target_gets_the_journald_reader(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_reader_kind="""
        def test_kind(ml4_logs):
            assert type(ml4_logs).__name__ == "JournaldLogReader"
            assert ml4_logs.unit == "vllm-ml4.service"
    """)
    pytester.runpytest("--target", "rtxpro6000-tp8", "-p", "no:randomly").assert_outcomes(passed=1)


def test_verdicts_are_summarised_after_the_run_pass_or_fail(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_verdicts="""
        def test_pass(record_property):
            record_property("ml4_verdict", "kv_pool: PASS - KV pool 263,923 tokens >= required 256,000")

        def test_fail(record_property):
            record_property("ml4_verdict", "no_failures: FAIL - 1 failure line(s)")
            assert False
    """)
    result = pytester.runpytest("--target", "rtxpro6000-tp8", "-p", "no:randomly")
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*ml4 verdicts*", "kv_pool: PASS - KV pool 263,923 tokens >= required 256,000",
                                 "no_failures: FAIL - 1 failure line(s)"])


def test_attach_log_writes_the_excerpt_into_allure_results(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_attach=f"""
        from pytest_ml4.logs import FileLogReader, LogView, SymmMemUnsupported

        def test_attach(ml4_attach_log):
            view = LogView(FileLogReader({str(STABLE)!r}).read(), "stable")
            text = ml4_attach_log(view, view.all(SymmMemUnsupported)[:1], "symm")
            assert "SymmMemCommunicator: Device capability 12.0 not supported" in text
    """)
    out = pytester.path / "allure"
    result = pytester.runpytest("--target", "rtxpro6000-tp8", f"--alluredir={out}", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    attachments = [p.read_text() for p in out.glob("*-attachment.txt")]
    assert any("matched [symm_mem_unsupported]" in a for a in attachments)


@pytest.mark.parametrize("target, expect", [
    ("rtxpro6000-tp8", "KV pool 263,923 tokens, 1.03x at 256,000, headroom 2.85 GiB/GPU; calibrated on seed 000"),
    ("pytest_ml4/data/targets/variants/rtxpro6000-tp8-crashing.yaml", "dies on the first step of >= 7,913 tokens"),
    ("gb300-agg", "estimate: no seed measured this hardware/KV dtype"),
])
def test_memory_model_header(target: str, expect: str) -> None:
    from pytest_ml4.plugin.logs import memory_header
    from pytest_ml4.target.model import load_target

    assert expect in memory_header(load_target(target))


def test_attached_excerpt_is_redacted(pytester: pytest.Pytester) -> None:
    log = pytester.path / "engine.log"
    log.write_text("(APIServer pid=1) INFO 11-01 18:00:00 [utils.py:233] non-default args: {'api_key': "
                   "['sk-live-0123456789abcdef']}\n"
                   "(EngineCore pid=1) INFO 11-01 18:00:01 [kv_cache_utils.py:1310] GPU KV cache size: 1,000 tokens, "
                   "Maximum concurrency for 1,000 tokens per request: 1.00x\n")
    pytester.makepyfile(test_redact=f"""
        from pytest_ml4.logs import FileLogReader, KvCacheSize, LogView

        def test_attach(ml4_attach_log):
            view = LogView(FileLogReader({str(log)!r}).read(), "engine")
            text = ml4_attach_log(view, view.all(KvCacheSize), "kv")
            assert "GPU KV cache size: 1,000 tokens" in text
            assert "sk-live-0123456789abcdef" not in text
    """)
    out = pytester.path / "allure"
    pytester.runpytest("--target", "rtxpro6000-tp8", f"--alluredir={out}", "-p", "no:randomly").assert_outcomes(
        passed=1)
    assert not any("sk-live-0123456789abcdef" in p.read_text() for p in out.glob("*-attachment.txt"))
